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

# On a failure, the tail of every cluster process's log goes to the output before the
# cluster (and its logs) are stopped: CI keeps only what was printed.
on_exit() {
  local rc=$?
  if [ "$rc" -ne 0 ] && [ -d "$GEOSTATE_RUN_DIR/logs" ]; then
    for log in "$GEOSTATE_RUN_DIR"/logs/node-*.log "$GEOSTATE_RUN_DIR"/logs/witness.log; do
      [ -f "$log" ] || continue
      echo "---- last lines of $(basename "$log") (PartitionEOF notices left out)"
      grep -v PartitionEOF "$log" | tail -n 40
    done
    # last, as CI keeps the end of the output: the partition moves of the run's last
    # minutes, every node's in time order (which node held what, what each step took)
    echo "---- partition moves, every node"
    for log in "$GEOSTATE_RUN_DIR"/logs/node-*.log; do
      grep -E "group revokes|group assigned|copies up before joining|took the partition|gave up the partitions|discarding the copy|last round|taking it again|another node ships" "$log" |
        sed -e 's/\x1b\[[0-9;]*m//g' -e "s/^/$(basename "$log" .log) /" || true
    done | sort -k2,2 | tail -n 120
  fi
  python3 regions/local/cluster.py down
  exit "$rc"
}
trap on_exit EXIT
python3 regions/local/cluster.py up >/dev/null

cargo test --workspace --locked "$@"
