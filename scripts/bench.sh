#!/usr/bin/env bash
# The benchmarks (README: `make bench`): installs what is missing, builds in release mode,
# starts a private local cluster whose nodes run the release build, runs every benchmark
# against it, writes the report to bench/results/latest.md, and stops the cluster.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/geostate/target}"
export GEOSTATE_RUN_DIR="${GEOSTATE_BENCH_RUN_DIR:-$PWD/regions/local/run-bench}"
export GEOSTATE_CLUSTER="$GEOSTATE_RUN_DIR/cluster.json"
export GEOSTATE_PROFILE=release

python3 regions/local/cluster.py install
cargo build --release --locked --bins
cargo bench --locked --no-run

trap 'python3 regions/local/cluster.py down' EXIT
python3 regions/local/cluster.py up >/dev/null

mkdir -p bench/results
report=bench/results/latest.md
{
  echo "<!-- written by make bench on $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD) -->"
  echo
  cargo bench --locked --bench node "$@"
  echo
  cargo bench --locked --bench replication "$@"
  echo
  cargo bench --locked --bench checkpoint "$@"
  echo
  cargo bench --locked --bench failover "$@"
} | tee "$report"
echo "report: $report"
