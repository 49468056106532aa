#!/usr/bin/env bash
# The benchmarks (docs/benchmarks.md: `make bench`): installs what is missing (the cluster's parts and
# the peers: Kafka Streams, Apache Flink, Redis, matplotlib), builds in release mode, starts a private
# local cluster whose nodes run the release build, runs every benchmark against it, writes
# the report to bench/results/latest.md, latest.json and latest.png, and stops the cluster.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/geostate/target}"
export GEOSTATE_RUN_DIR="${GEOSTATE_BENCH_RUN_DIR:-$PWD/regions/local/run-bench}"
export GEOSTATE_CLUSTER="$GEOSTATE_RUN_DIR/cluster.json"
export GEOSTATE_PROFILE=release

python3 regions/local/cluster.py install
eval "$(python3 bench/peers/peers.py install)"   # KSTREAMS_CP, FLINK_CP, REDIS_SERVER
cargo build --release --locked --bins
cargo bench --locked --no-run

trap 'python3 regions/local/cluster.py down' EXIT
python3 regions/local/cluster.py up >/dev/null

# Where there are two cores, the node benchmark gives core 1 to the system under test: the
# cluster's processes (brokers, MirrorMaker 2, the idle nodes, the witness, S3) and the
# load generator stay on core 0 meanwhile.
pin_cluster() {
  [ "$(nproc)" -ge 2 ] || return 0
  for pid in "$GEOSTATE_RUN_DIR"/pids/*; do
    taskset -a -p -c "$1" "$(cat "$pid")" >/dev/null 2>&1 || true
  done
}

# A benchmark that measures systems side by side per core (node, windows) runs this way.
pinned_bench() {
  pin_cluster 0
  if [ "$(nproc)" -ge 2 ]; then
    taskset -c 0 cargo bench --locked --bench "$@"
  else
    cargo bench --locked --bench "$@"
  fi
  pin_cluster "0-$(( $(nproc) - 1 ))"
}

mkdir -p bench/results
report=bench/results/latest.md
started=$(date +%s)
{
  echo "<!-- written by make bench on $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD) -->"
  echo
  pinned_bench node "$@"
  echo
  cargo bench --locked --bench replication "$@"
  echo
  cargo bench --locked --bench regions "$@"
  echo
  cargo bench --locked --bench checkpoint "$@"
  echo
  cargo bench --locked --bench failover "$@"
  echo
  cargo bench --locked --bench scale "$@"
  echo
  pinned_bench windows "$@"
  echo
  cargo bench --locked --bench sink "$@"
  echo
  cargo bench --locked --bench functions "$@"
  echo
  echo "Chart: [latest.png](latest.png); figures: [latest.json](latest.json). The benchmarks took $(( $(date +%s) - started )) s."
} | tee "$report"

python3 - "$(git rev-parse --short HEAD)" "$report" <<'PY'
# latest.json: the node benchmark's own figures, and every table of the report by section
import json, sys, datetime
from pathlib import Path
out = {"commit": sys.argv[1],
       "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
       "tables": {}}
node = Path("bench/results/node.json")
if node.exists():
    out["node"] = json.loads(node.read_text())
    node.unlink()
section, header = None, None
for line in Path(sys.argv[2]).read_text().splitlines():
    if line.startswith("#"):
        section, header = line.lstrip("# ").strip(), None
    elif line.startswith("|") and section:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif not set("".join(cells)) <= set("-:"):
            out["tables"].setdefault(section, []).append(dict(zip(header, cells)))
    else:
        header = None
Path("bench/results/latest.json").write_text(json.dumps(out, indent=2) + "\n")
PY
python3 bench/peers/peers.py chart bench/results/latest.json bench/results/latest.png
echo "report: $report, bench/results/latest.json, bench/results/latest.png"
