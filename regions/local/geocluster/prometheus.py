"""Prometheus (Debian's package) scraping every node of the cluster, with the rules of
deploy/prometheus/rules.yml: its targets follow `node add`/`node remove` through a file
rewritten with cluster.json."""

from __future__ import annotations

from .common import *  # noqa: F401,F403
from .procs import *  # noqa: F401,F403

PROMETHEUS = Path("/usr/bin/prometheus")
RULES = REPO / "deploy" / "prometheus" / "rules.yml"
PROMETHEUS_DIR = RUN / "prometheus"
TARGETS = PROMETHEUS_DIR / "targets.json"
# short enough that an alert with `for: 5s` fires within a drill's fault
SCRAPE_EVERY = "1s"

CONFIG = """# written by regions/local/cluster.py for this run
global:
  scrape_interval: {every}
  scrape_timeout: {every}
  evaluation_interval: {every}
rule_files:
  - {rules}
scrape_configs:
  - job_name: geostate
    file_sd_configs:
      - files: [{targets}]
"""


def scrape_targets(cluster: dict) -> list[dict]:
    """Every node with a metrics address, labelled with its region and name."""
    out = []
    for region, r in cluster["regions"].items():
        nodes = [(f"node-{region}", r)] + [(f"node-{region}-{i}", n)
                                          for i, n in r.get("nodes", {}).items()]
        for name, n in nodes:
            if n.get("metrics"):
                out.append({"targets": [n["metrics"]],
                            "labels": {"geostate_region": region, "node": name}})
    return out


def write_targets(cluster: dict) -> None:
    """Rewrites the scrape targets (Prometheus watches the file) if this run has Prometheus."""
    if not PROMETHEUS_DIR.exists():
        return
    tmp = TARGETS.with_suffix(".tmp")
    tmp.write_text(json.dumps(scrape_targets(cluster), indent=2) + "\n")
    tmp.rename(TARGETS)


def prometheus_ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/-/ready", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def start_prometheus(cluster: dict) -> None:
    """Starts Prometheus on a free port (or again on its port) with its data under the run
    folder; records it as `cluster["prometheus"]`."""
    if not PROMETHEUS.exists():
        die("no Prometheus: `cluster.py install` installs Debian's prometheus")
    p = cluster.setdefault("prometheus", {})
    if p.get("pid") and pid_alive(p["pid"]):
        stop_pid("prometheus", p["pid"])
    port = p.get("port") or free_port()
    (PROMETHEUS_DIR / "data").mkdir(parents=True, exist_ok=True)
    write_targets(cluster)
    config = PROMETHEUS_DIR / "prometheus.yml"
    config.write_text(CONFIG.format(every=SCRAPE_EVERY, rules=RULES, targets=TARGETS))
    p.update({"port": port, "url": f"http://127.0.0.1:{port}", "config": str(config)})
    p["pid"] = spawn("prometheus", [
        str(PROMETHEUS), f"--config.file={config}",
        f"--storage.tsdb.path={PROMETHEUS_DIR / 'data'}", "--storage.tsdb.retention.time=1d",
        f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"])
    wait_for("prometheus", lambda: prometheus_ready(p["url"]), 60)
    log(f"prometheus: pid {p['pid']}, {p['url']} (rules {RULES.relative_to(REPO)})")
