//! The drill machinery of `make test`: the real `chaos` binary runs drills with short
//! phases against the test cluster, and each verdict must be pass:
//! - `region-wipe` (a node SIGKILLed and its data dir deleted, restored from S3 and its
//!   own deltas): no acknowledged increment lost, none applied twice, the other region
//!   never paused, owned keys writable again within the lease failover budget, every
//!   region converged;
//! - `scale-out-under-load` (a region grown to three nodes and back under load): every
//!   partition's writes back within a move's budget each time it moves, nothing lost or
//!   applied twice;
//! - `wan-delay` (the links of the region leading the lease group held 100 ± 50 ms): no
//!   lease epoch granted while they are slow, owned keys never stopped beyond 3 s;
//! - `broker-loss` (a region's only Kafka broker killed, on two regions and on three): the
//!   region's reads never stop beyond 3 s (its node answers from its copies), its owned
//!   keys are written in another region within the lease failover budget, nothing lost or
//!   applied twice.
//!
//! Its own test binary: the drills kill, restore and add nodes of the cluster (test
//! binaries run one at a time; the drills here one after the other), and each heals what
//! it did before it returns.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

/// The drills never overlap.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn repo() -> PathBuf {
    PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default()).join("..")
}

/// The suite's cluster (`make test` starts it).
fn suite_cluster() -> PathBuf {
    std::env::var_os("GEOSTATE_CLUSTER")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("regions/local/run/cluster.json"))
}

fn drill_passes(drill: &str, extra: &[&str]) {
    drill_passes_on(&suite_cluster(), drill, extra);
}

fn drill_passes_on(cluster: &std::path::Path, drill: &str, extra: &[&str]) {
    let out = std::env::temp_dir().join(format!("geostate-drill-{}", std::process::id()));
    let status = Command::new(env!("CARGO_BIN_EXE_chaos"))
        .args([drill, "--before", "5", "--after", "10"])
        .args(extra)
        .arg("--cluster")
        .arg(cluster)
        .arg("--out")
        .arg(&out)
        .status()
        .expect("the chaos binary runs");
    let report = std::fs::read_to_string(out.join(format!("{drill}.md"))).unwrap_or_default();
    println!("{report}");
    let _ = std::fs::remove_dir_all(&out);
    assert!(status.success(), "{drill}: {status}\n{report}");
}

#[test]
fn the_region_wipe_and_scale_out_drills_pass() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    drill_passes("region-wipe", &[]);
    drill_passes("scale-out-under-load", &[]);
}

/// 30 s of the leading region's links held 100 ± 50 ms, with the template's timings, grant
/// no lease epoch and stop no owned key beyond 3 s: the leader keeps leading while slow
/// (`lease::runtime`) and then hands the lead to a voter with fast links
/// (`lease::placement`), so no region's renewals wait on the slow links twice.
#[test]
fn a_wan_delay_moves_no_lease() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    drill_passes("wan-delay", &["--wan-secs", "30"]);
}

/// The region's only broker killed for 10 s, restarted (and the group back) after: reads
/// there go on from the node's copies, its owned keys move to the other region.
#[test]
fn a_region_whose_kafka_is_down_serves_reads_and_lets_its_leases_go() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    drill_passes("broker-loss", &[]);
}

/// The same on three regions (a cluster of its own, no witness): the two others take the
/// region's shards.
#[test]
fn a_region_whose_kafka_is_down_lets_its_leases_go_on_three_regions() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let three = Private::up("drill-three", &["ap-southeast-1", "eu-west-1", "us-east-1"]);
    drill_passes_on(&three.run.join("cluster.json"), "broker-loss", &[]);
}

/// A local cluster of `regions` of its own (`cluster.py up` with `REGIONS`), in a run
/// folder next to the suite's; stopped when dropped.
struct Private {
    run: PathBuf,
    regions: String,
}

impl Private {
    fn up(label: &str, regions: &[&str]) -> Self {
        let suite = suite_cluster();
        let suite = suite.parent().expect("cluster.json is in a folder");
        let name = suite.file_name().unwrap_or_default().to_string_lossy();
        let private = Private {
            run: suite.with_file_name(format!("{name}-{label}")),
            regions: regions.join(","),
        };
        private.script(&["up", "--no-build"]);
        private
    }

    fn script(&self, args: &[&str]) {
        let status = Command::new("python3")
            .arg(repo().join("regions/local/cluster.py"))
            .args(args)
            .env("GEOSTATE_RUN_DIR", &self.run)
            .env("REGIONS", &self.regions)
            .status()
            .expect("python3 runs cluster.py");
        assert!(status.success(), "cluster.py {args:?}: {status}");
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        self.script(&["down"]);
    }
}
