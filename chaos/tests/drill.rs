//! The drill machinery of `make test`: the real `chaos` binary runs the `region-wipe` drill
//! (a node SIGKILLed and its data dir deleted, restored from S3 and its own deltas) with
//! short phases against the test cluster, and its verdict must be pass: no acknowledged
//! increment lost, none applied twice, the other region never paused, owned keys writable
//! again within the lease failover budget, every region converged. Its own test binary: it
//! kills and restores a node of the cluster (test binaries run one at a time), and the
//! drill heals it before it returns.

use std::path::PathBuf;
use std::process::Command;

#[test]
fn the_region_wipe_drill_passes() {
    let cluster = std::env::var_os("GEOSTATE_CLUSTER")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default())
                .join("../regions/local/run/cluster.json")
        });
    let out = std::env::temp_dir().join(format!("geostate-drill-{}", std::process::id()));
    let status = Command::new(env!("CARGO_BIN_EXE_chaos"))
        .args(["region-wipe", "--before", "5", "--after", "10"])
        .arg("--cluster")
        .arg(&cluster)
        .arg("--out")
        .arg(&out)
        .status()
        .expect("the chaos binary runs");
    let report = std::fs::read_to_string(out.join("region-wipe.md")).unwrap_or_default();
    println!("{report}");
    let _ = std::fs::remove_dir_all(&out);
    assert!(status.success(), "region-wipe: {status}\n{report}");
}
