#!/usr/bin/env bash
# The whole test suite (README: `make test`): installs what is missing, builds, starts a
# private local cluster (2 Kafka clusters, MirrorMaker 2, S3) in its own run folder, runs
# every test of the workspace against it, and stops the cluster whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/geostate/target}"
# A run folder of its own, so `make test` never touches a cluster started by `make up`.
export GEOSTATE_RUN_DIR="${GEOSTATE_TEST_RUN_DIR:-$PWD/regions/local/run-test}"
export GEOSTATE_CLUSTER="$GEOSTATE_RUN_DIR/cluster.json"

python3 regions/local/cluster.py install
cargo build --workspace --all-targets --locked

trap 'python3 regions/local/cluster.py down' EXIT
python3 regions/local/cluster.py up >/dev/null

cargo test --workspace --locked "$@"
