//! The drill machinery of `make test`: the real `chaos` binary runs drills with short
//! phases against the test cluster, and each verdict must be pass:
//! - `region-wipe` (a node SIGKILLed and its data dir deleted, restored from S3 and its
//!   own deltas): no acknowledged increment lost, none applied twice, the other region
//!   never paused, owned keys writable again within the lease failover budget, every
//!   region converged;
//! - `scale-out-under-load` (a region grown to three nodes and back under load): every
//!   partition's writes back within a move's budget each time it moves, nothing lost or
//!   applied twice.
//!
//! Its own test binary: the drills kill, restore and add nodes of the cluster (test
//! binaries run one at a time; the drills here one after the other), and each heals what
//! it did before it returns.

use std::path::PathBuf;
use std::process::Command;

fn drill_passes(drill: &str) {
    let cluster = std::env::var_os("GEOSTATE_CLUSTER")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default())
                .join("../regions/local/run/cluster.json")
        });
    let out = std::env::temp_dir().join(format!("geostate-drill-{}", std::process::id()));
    let status = Command::new(env!("CARGO_BIN_EXE_chaos"))
        .args([drill, "--before", "5", "--after", "10"])
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

/// One test, so the drills never overlap.
#[test]
fn the_region_wipe_and_scale_out_drills_pass() {
    drill_passes("region-wipe");
    drill_passes("scale-out-under-load");
}
