#!/usr/bin/env python3
"""The peers `make bench` measures geostate against, and the report's chart.

  peers.py install   Kafka Streams and Apache Flink (jars from Maven Central, the peer apps
                     compiled with javac), Debian's redis-server, matplotlib (PyPI) in a
                     venv; prints the environment the benchmarks read (KSTREAMS_CP,
                     FLINK_CP, REDIS_SERVER)
  peers.py chart REPORT.json OUT.png
                     draws the ingest and latency figures of a report

Everything lands under ~/.cache/geostate (GEOSTATE_CACHE), as with regions/local/cluster.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "regions" / "local"))
import cluster  # noqa: E402  (the cache folder, versions and the apt helper are shared)

HERE = Path(__file__).resolve().parent
KSTREAMS = cluster.CACHE / f"kstreams-{cluster.KAFKA_VERSION}"
FLINK_VERSION = "2.2.1"
FLINK_KAFKA_VERSION = "5.0.0-2.2"  # the Kafka connector released for Flink 2.2
FLINK = cluster.CACHE / f"flink-{FLINK_VERSION}"
VENV = cluster.CACHE / "bench-venv"
MATPLOTLIB_VERSION = "3.11.2"

KSTREAMS_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.geostate</groupId><artifactId>kstreams-peer</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-streams</artifactId><version>{kafka}</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId><version>{slf4j}</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-nop</artifactId><version>{slf4j}</version></dependency>
  </dependencies>
</project>
"""


FLINK_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.geostate</groupId><artifactId>flink-peer</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.flink</groupId><artifactId>flink-streaming-java</artifactId><version>{flink}</version></dependency>
    <dependency><groupId>org.apache.flink</groupId><artifactId>flink-clients</artifactId><version>{flink}</version></dependency>
    <dependency><groupId>org.apache.flink</groupId><artifactId>flink-statebackend-rocksdb</artifactId><version>{flink}</version></dependency>
    <dependency><groupId>org.apache.flink</groupId><artifactId>flink-connector-base</artifactId><version>{flink}</version></dependency>
    <dependency><groupId>org.apache.flink</groupId><artifactId>flink-connector-kafka</artifactId><version>{kafka}</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-nop</artifactId><version>1.7.36</version></dependency>
  </dependencies>
</project>
"""


def log(msg: str) -> None:
    print(f"[peers] {msg}", file=sys.stderr, flush=True)


def install_java_peer(home: Path, pom: str, version: str, source: Path) -> str:
    """The runtime jars `pom` names (from Maven Central, once) and `source` compiled against
    them, under `home`: the classpath to run it with."""
    libs = home / "libs"
    if not (libs / ".complete").exists():
        log(f"fetching {home.name} from Maven Central")
        home.mkdir(parents=True, exist_ok=True)
        (home / "pom.xml").write_text(pom)
        tmp = home / "libs.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(["mvn", "-q", "-B", "-f", str(home / "pom.xml"),
                        "dependency:copy-dependencies", f"-DoutputDirectory={tmp}",
                        "-DincludeScope=runtime"], check=True, stdout=sys.stderr)
        shutil.rmtree(libs, ignore_errors=True)
        tmp.rename(libs)
        (libs / ".complete").write_text(version)
    classes = home / "classes"
    built = classes / f"{source.stem}.class"
    if not built.exists() or built.stat().st_mtime < source.stat().st_mtime:
        log(f"compiling the peer {source.relative_to(HERE.parents[1])}")
        classes.mkdir(parents=True, exist_ok=True)
        subprocess.run(["javac", "-d", str(classes), "-cp", str(libs / "*"), str(source)],
                       check=True, stdout=sys.stderr)
    return f"{libs / '*'}:{classes}"


def install_kstreams() -> str:
    pom = KSTREAMS_POM.format(kafka=cluster.KAFKA_VERSION, slf4j=cluster.SLF4J_VERSION)
    return install_java_peer(KSTREAMS, pom, cluster.KAFKA_VERSION, HERE / "GroupByKeyCount.java")


def install_flink() -> str:
    pom = FLINK_POM.format(flink=FLINK_VERSION, kafka=FLINK_KAFKA_VERSION)
    return install_java_peer(FLINK, pom, FLINK_VERSION, HERE / "WindowedCount.java")


def install_redis() -> str:
    if shutil.which("redis-server") is None:
        if os.geteuid() != 0:
            cluster.die("redis-server is missing; install Debian's redis-server as root")
        log("installing Debian's redis-server")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, stdout=sys.stderr)
        subprocess.run(["apt-get", "install", "-y", "-qq", "redis-server"], check=True,
                       env=env, stdout=subprocess.DEVNULL)
        # Where the package started a system-wide server, stop it: the benchmark runs its own.
        if shutil.which("service"):
            subprocess.run(["service", "redis-server", "stop"], check=False,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return shutil.which("redis-server") or "/usr/bin/redis-server"


def install_matplotlib() -> None:
    python = VENV / "bin" / "python"
    if python.exists() and subprocess.run([str(python), "-c", "import matplotlib"],
                                          capture_output=True).returncode == 0:
        return
    log(f"installing matplotlib {MATPLOTLIB_VERSION} from PyPI into {VENV}")
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q",
                    f"matplotlib=={MATPLOTLIB_VERSION}"], check=True, stdout=sys.stderr)


def cmd_install() -> None:
    cp = install_kstreams()
    flink = install_flink()
    redis = install_redis()
    install_matplotlib()
    print(f"export KSTREAMS_CP='{cp}'")
    print(f"export FLINK_CP='{flink}'")
    print(f"export REDIS_SERVER='{redis}'")


def cmd_chart(report_path: str, out: str) -> None:
    """Re-runs itself in the venv that has matplotlib."""
    python = VENV / "bin" / "python"
    if Path(sys.prefix).resolve() != VENV.resolve():
        os.execv(str(python), [str(python), __file__, "chart-in-venv", report_path, out])
    chart(report_path, out)


def chart(report_path: str, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report = json.loads(Path(report_path).read_text())
    node = report["node"]
    fig, (ingest_ax, latency_ax) = plt.subplots(1, 2, figsize=(14, 5.5))

    # ingest: one group per dataset, one bar per system
    datasets = [d["name"] for d in node["ingest"]]
    systems = [s["system"] for s in node["ingest"][0]["systems"]]
    width = 0.8 / len(systems)
    for i, system in enumerate(systems):
        rates = [next(s["events_per_second"] for s in d["systems"] if s["system"] == system)
                 for d in node["ingest"]]
        ingest_ax.bar([x + i * width for x in range(len(datasets))], rates, width,
                      label=system)
    ingest_ax.set_xticks([x + width * (len(systems) - 1) / 2 for x in range(len(datasets))],
                         datasets, fontsize=8)
    ingest_ax.set_ylabel("events per second")
    ingest_ax.set_title("Ingest of one pre-loaded topic (system under test pinned to 1 core)")
    ingest_ax.set_ylim(top=ingest_ax.get_ylim()[1] * 1.2)  # room for the legend
    ingest_ax.legend(fontsize=7, loc="upper center", ncol=2)

    # latency: percentiles per load level, geostate Update ack next to the Kafka floor
    for series, color in zip(node["latency"], ("tab:blue", "tab:gray")):
        levels = [f'{p["load_percent"]}%' for p in series["points"]]
        for q, style in (("p50", ":"), ("p99", "-"), ("p99_9", "--")):
            latency_ax.plot(levels, [p[f"{q}_ms"] for p in series["points"]], style,
                            marker="o", color=color,
                            label=f'{series["name"]} {q.replace("_", ".")}')
    latency_ax.set_yscale("log")
    latency_ax.set_ylabel("ms (open loop, from the scheduled send)")
    latency_ax.set_xlabel("offered load, share of geostate's maximum Update rate")
    latency_ax.set_title("Update ack latency vs. Kafka produce→consume")
    latency_ax.legend(fontsize=7)

    fig.suptitle(f'geostate make bench, commit {report.get("commit", "?")}', fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"chart: {out}")


def main() -> None:
    args = sys.argv[1:]
    if args == ["install"]:
        cmd_install()
    elif len(args) == 3 and args[0] == "chart":
        cmd_chart(args[1], args[2])
    elif len(args) == 3 and args[0] == "chart-in-venv":
        chart(args[1], args[2])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
