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
//!   lease epoch granted while they are slow, owned keys never stopped beyond 3 s.
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

fn drill_passes(drill: &str, extra: &[&str]) {
    let cluster = std::env::var_os("GEOSTATE_CLUSTER")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("regions/local/run/cluster.json"));
    let out = std::env::temp_dir().join(format!("geostate-drill-{}", std::process::id()));
    let status = Command::new(env!("CARGO_BIN_EXE_chaos"))
        .args([drill, "--before", "5", "--after", "10"])
        .args(extra)
        .arg("--cluster")
        .arg(&cluster)
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
