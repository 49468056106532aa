//! The Jepsen smoke of `make test`: the harness (the real `jepsen` binary) runs the counter,
//! owned-register and windowed-counter workloads for 50 s each and the owned-append
//! workload for 40 s against the test cluster,
//! with a region cut off the network (iptables), the holder paused past its lease, a node
//! killed and restarted, a node's data dir wiped so it restores from S3 and its own deltas
//! (for the owned workloads: a key's holder, with writes it acknowledged and had not
//! shipped), and MirrorMaker 2 stopped and started; the counter run also adds a node to a
//! region and removes it (partitions moving to it and back), and kills an added node of
//! two mid-ingest; each run must end valid (every checker passes, every fault fired).
//! Its own test binary: it pauses and kills the cluster's nodes (test binaries run one at
//! a time), and heals them before it returns.

use std::path::PathBuf;
use std::process::Command;

fn cluster_json() -> PathBuf {
    std::env::var_os("GEOSTATE_CLUSTER")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default())
                .join("../regions/local/run/cluster.json")
        })
}

fn run(workload: &str, seed: &str, seconds: &str, nemesis: &str) {
    let out = tempfile_dir(workload);
    let status = Command::new(env!("CARGO_BIN_EXE_jepsen"))
        .args([
            "--workload",
            workload,
            "--seconds",
            seconds,
            "--interval",
            "4",
        ])
        .args(["--nemesis", nemesis, "--seed", seed])
        .arg("--cluster")
        .arg(cluster_json())
        .arg("--out")
        .arg(&out)
        .status()
        .expect("the jepsen binary runs");
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap_or_default();
    println!("{summary}");
    assert!(status.success(), "{workload}: {status}\n{summary}");
}

fn tempfile_dir(workload: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("geostate-jepsen-{workload}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    dir
}

#[test]
fn counters_and_owned_keys_survive_partitions_pauses_kills_wipes_and_a_stopped_mirror() {
    run(
        "counter",
        "11",
        "50",
        "partition,pause-holder,kill,wipe,mirror,scale,kill-node",
    );
    run(
        "owned-register",
        "12",
        "50",
        "partition,pause-holder,wipe,kill,mirror",
    );
    run("owned-append", "13", "40", "partition,pause-holder,wipe");
    run("windowed-counter", "14", "50", "kill,wipe,mirror");
}
