//! The client libraries against the real local cluster `GEOSTATE_CLUSTER` names (counters,
//! registers, windows, freshness, idempotent retries, routing, the pricing example):
//! `clients/python/check.py` makes (once) a virtualenv with grpcio, installs the Python
//! package into it, checks that its generated stubs match `proto/`, and runs its tests;
//! `clients/go/generate.sh --check` and `go test` do the same for the Go module (its
//! protoc is that virtualenv's, so the Python test runs first).

mod common;

use std::process::Command;

fn run(command: &mut Command) {
    let status = command
        .env("GEOSTATE_CLUSTER", common::cluster_json())
        .status()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(status.success(), "{command:?}: {status}");
}

#[test]
fn the_python_and_go_clients_pass_their_tests_against_the_cluster() {
    run(Command::new("python3").arg(common::repo_file("clients/python/check.py")));
    let go = common::repo_file("clients/go");
    run(Command::new(go.join("generate.sh")).arg("--check"));
    run(Command::new("go")
        .args(["test", "-count=1", "./..."])
        .current_dir(&go));
}
