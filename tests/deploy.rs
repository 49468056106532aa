//! The Kubernetes manifests of `deploy/kubernetes/`, checked offline by the Go test in
//! `deploy/kubernetes/check` against this build's `geostate` binary: strict decoding into
//! the Kubernetes API types, each ConfigMap through `geostate check-config` with its
//! StatefulSet's arguments, and ports, probes, paths and image against the binary and
//! `deploy/Containerfile`; and `geostate probe` against the cluster.

mod common;

use std::process::Command;

#[test]
fn the_kubernetes_manifests_decode_strictly_and_agree_with_the_binary() {
    let mut go = Command::new("go");
    go.args(["test", "-count=1", "./..."])
        .current_dir(common::repo_file("deploy/kubernetes/check"))
        .env("GEOSTATE_BIN", env!("CARGO_BIN_EXE_geostate"));
    let status = go.status().unwrap_or_else(|e| panic!("{go:?}: {e}"));
    assert!(status.success(), "{go:?}: {status}");
}

/// `geostate probe`, as the StatefulSets' probes run it, against the cluster's first node
/// (serving, and caught up with the other region: exit 0, with and without `--ready`) and
/// against a port nobody listens on (exit 1, naming the address).
#[test]
fn the_probe_passes_against_a_serving_node_and_fails_against_none() {
    let cluster = common::cluster().expect("make test starts a cluster");
    let r = cluster.regions.values().next().expect("a region");
    let node = format!("http://{}", r.grpc.as_deref().expect("a node"));
    let probe = |addr: &str, ready: bool| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_geostate"));
        command.args(["probe", "--addr", addr, "--timeout", "10s"]);
        if ready {
            command.arg("--ready");
        }
        command.output().expect("geostate probe runs")
    };
    for ready in [false, true] {
        let out = probe(&node, ready);
        assert!(
            out.status.success(),
            "probe {node} (ready: {ready}): {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let nobody = format!("http://127.0.0.1:{}", common::free_port());
    let out = probe(&nobody, false);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("127.0.0.1"));
}
