//! The Kubernetes manifests of `deploy/kubernetes/`, checked offline by the Go test in
//! `deploy/kubernetes/check` against this build's `geostate` binary: strict decoding into
//! the Kubernetes API types, each ConfigMap through `geostate check-config` with its
//! StatefulSet's arguments, and ports, probes, paths and image against the binary and
//! `deploy/Containerfile`. Needs no cluster.

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
