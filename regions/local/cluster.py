#!/usr/bin/env python3
"""Local multi-region infrastructure for geostate: one KRaft Kafka cluster per region,
MirrorMaker 2 (dedicated mode) mirroring every region's `geostate.deltas` into every other
region as `<region>.geostate.deltas`, and an S3-compatible server with a checkpoint bucket.

    python3 regions/local/cluster.py install   # system packages, Kafka jars, S3 server (once)
    python3 regions/local/cluster.py up        # start everything, write run/cluster.json
    python3 regions/local/cluster.py status    # health of every process (exit 1 if any is down)
    python3 regions/local/cluster.py down      # stop everything, leave no process behind

Everything comes from package registries: Debian packages with apt, Apache Kafka and
MirrorMaker 2 jars from Maven Central with Maven, the S3 server (s3s-fs) from crates.io.
Downloads and builds go to a cache outside the repository ($GEOSTATE_CACHE, default
~/.cache/geostate); run state, data and logs go to regions/local/run/ ($GEOSTATE_RUN_DIR).

Only the standard library is used, so this runs before anything else is installed.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import shutil
import signal
import random
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import NoReturn

KAFKA_VERSION = "4.1.1"
LOG4J_VERSION = "2.25.3"
SLF4J_VERSION = "2.0.17"
S3S_FS_VERSION = "0.14.1"  # newest s3s-fs that builds on Rust 1.95
GRPCURL_VERSION = "v1.9.3"

REGIONS = ["us-east-1", "eu-west-1"]
S3_BUCKET = "geostate-checkpoints"
S3_ACCESS_KEY = "geostate"
S3_SECRET_KEY = "geostate-secret"

# topic -> (partitions, extra configs). Deltas are compacted by key: a later delta for a key
# supersedes an earlier one (ARCHITECTURE.md, replication).
TOPICS = {
    "geostate.updates": (4, {}),
    "geostate.deltas": (4, {"cleanup.policy": "compact", "min.compaction.lag.ms": "60000"}),
    "geostate.dlq": (1, {}),
}
DELTAS_TOPIC = "geostate.deltas"

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("GEOSTATE_CACHE", Path.home() / ".cache" / "geostate"))
RUN = Path(os.environ.get("GEOSTATE_RUN_DIR", REPO / "regions" / "local" / "run"))
KAFKA_LIBS = CACHE / f"kafka-{KAFKA_VERSION}" / "libs"
S3S_FS = CACHE / f"s3s-fs-{S3S_FS_VERSION}" / "bin" / "s3s-fs"
GRPCURL = CACHE / f"grpcurl-{GRPCURL_VERSION}" / "grpcurl"
WAN_DELAY_SRC = REPO / "chaos" / "wan-delay"
LOGS = RUN / "logs"
CLUSTER_JSON = RUN / "cluster.json"
PIDS = RUN / "pids"

APT_PACKAGES = {
    # package -> a file whose presence shows it is installed
    "libclang-dev": "/usr/lib/llvm-14/lib/libclang.so",
    "iptables": "/usr/sbin/iptables",
}


def log(msg: str) -> None:
    print(f"[cluster] {msg}", flush=True)


def die(msg: str) -> NoReturn:
    print(f"[cluster] error: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


# ---------------------------------------------------------------------------------------
# install


def install_apt() -> None:
    missing = [p for p, f in APT_PACKAGES.items() if not Path(f).exists()]
    if not missing:
        return
    if os.geteuid() != 0:
        die(f"missing system packages {missing}; install them with apt-get as root")
    log(f"installing system packages: {' '.join(missing)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True, env=env,
                   stdout=subprocess.DEVNULL)


KAFKA_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.geostate</groupId><artifactId>kafka-runtime</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{kafka}</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>{kafka}</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>connect-mirror</artifactId><version>{kafka}</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId><version>{slf4j}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j2-impl</artifactId><version>{log4j}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>{log4j}</version></dependency>
  </dependencies>
</project>
"""


def install_kafka() -> None:
    marker = KAFKA_LIBS / ".complete"
    if marker.exists():
        return
    if shutil.which("mvn") is None:
        die("Maven (mvn) is needed to fetch Apache Kafka from Maven Central")
    log(f"fetching Apache Kafka {KAFKA_VERSION} and MirrorMaker 2 from Maven Central")
    work = KAFKA_LIBS.parent
    work.mkdir(parents=True, exist_ok=True)
    (work / "pom.xml").write_text(
        KAFKA_POM.format(kafka=KAFKA_VERSION, slf4j=SLF4J_VERSION, log4j=LOG4J_VERSION))
    tmp = work / "libs.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    subprocess.run(["mvn", "-q", "-B", "-f", str(work / "pom.xml"),
                    "dependency:copy-dependencies", f"-DoutputDirectory={tmp}",
                    "-DincludeScope=runtime"], check=True)
    shutil.rmtree(KAFKA_LIBS, ignore_errors=True)
    tmp.rename(KAFKA_LIBS)
    marker.write_text(KAFKA_VERSION)


def install_s3() -> None:
    if S3S_FS.exists():
        return
    log(f"building the S3-compatible server s3s-fs {S3S_FS_VERSION} from crates.io")
    subprocess.run(["cargo", "install", "s3s-fs", "--version", S3S_FS_VERSION, "--features",
                    "binary", "--locked", "--root", str(S3S_FS.parents[1])], check=True)


def install_grpcurl() -> None:
    if GRPCURL.exists():
        return
    if shutil.which("go") is None:
        die("Go is needed to build grpcurl from the Go module proxy")
    log(f"building grpcurl {GRPCURL_VERSION} from the Go module proxy")
    subprocess.run(["go", "install", f"github.com/fullstorydev/grpcurl/cmd/grpcurl@{GRPCURL_VERSION}"],
                   check=True, env=dict(os.environ, GOBIN=str(GRPCURL.parent)))


def wan_delay_bin() -> Path:
    """Where the packet delayer of `net delay` is built: named by its sources' hash, so an
    edit builds it again."""
    sources = b"".join((WAN_DELAY_SRC / f).read_bytes() for f in ("main.go", "go.mod", "go.sum"))
    return CACHE / f"wan-delay-{hashlib.sha256(sources).hexdigest()[:10]}" / "wan-delay"


def install_wan_delay() -> None:
    out = wan_delay_bin()
    if out.exists():
        return
    if shutil.which("go") is None:
        die("Go is needed to build wan-delay from the Go module proxy")
    log("building wan-delay (chaos/wan-delay) from the Go module proxy")
    subprocess.run(["go", "build", "-o", str(out), "."], cwd=WAN_DELAY_SRC, check=True)


def cmd_install(_args: argparse.Namespace) -> None:
    install_apt()
    install_kafka()
    install_s3()
    install_grpcurl()
    install_wan_delay()
    log(f"installed: system packages, Kafka jars, S3 server, grpcurl, wan-delay ({CACHE})")


# ---------------------------------------------------------------------------------------
# process helpers


def free_port() -> int:
    """A free port in 20000-24999: below the kernel's ephemeral range, so no outgoing
    connection takes it while its process restarts (a `bind(0)` port can be), and below
    the tests' range (25000 up to the ephemeral range)."""
    for _ in range(1000):
        port = random.randrange(20000, 25000)
        if port in HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        HANDED_OUT.add(port)
        return port
    die("no free port in 20000-24999")


# ports free_port gave out in this run (not bound yet by their process)
HANDED_OUT: set[int] = set()


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is not alive
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        return state != "Z"
    except OSError:
        return False


def wait_for(what: str, check, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    die(f"{what} not ready after {timeout:.0f}s (logs in {LOGS})")


def spawn(name: str, argv: list[str], env: dict | None = None) -> int:
    """Start a daemon in its own process group, stdout+stderr to logs/<name>.log."""
    LOGS.mkdir(parents=True, exist_ok=True)
    PIDS.mkdir(parents=True, exist_ok=True)
    out = open(LOGS / f"{name}.log", "ab")
    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True,
                            env=dict(os.environ, **(env or {})))
    (PIDS / name).write_text(str(proc.pid))
    return proc.pid


def stop_pid(name: str, pid: int, grace: float = 15.0) -> None:
    if not pid_alive(pid):
        return
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and pid_alive(pid):
        time.sleep(0.1)
    if pid_alive(pid):
        log(f"{name} (pid {pid}) ignored SIGTERM; killing")
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def java() -> str:
    home = os.environ.get("JAVA_HOME")
    return str(Path(home) / "bin" / "java") if home else "java"


def kafka_cp() -> str:
    return str(KAFKA_LIBS / "*")


def log4j_config() -> Path:
    path = RUN / "log4j2.properties"
    path.write_text(
        "status = warn\n"
        "appender.out.type = Console\n"
        "appender.out.name = out\n"
        "appender.out.layout.type = PatternLayout\n"
        "appender.out.layout.pattern = [%d] %p %m (%c)%n\n"
        "rootLogger.level = info\n"
        "rootLogger.appenderRef.out.ref = out\n"
        "logger.kafka.name = org.apache.kafka\n"
        "logger.kafka.level = warn\n"
        "logger.mirror.name = org.apache.kafka.connect.mirror\n"
        "logger.mirror.level = info\n"
        "logger.state.name = state.change.logger\n"
        "logger.state.level = warn\n")
    return path


def java_tool(main: str, *args: str, check: bool = True, timeout: float = 60):
    argv = [java(), "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            f"-Dlog4j2.configurationFile={RUN / 'log4j2.properties'}", "-cp", kafka_cp(),
            main, *args]
    out = subprocess.run(argv, timeout=timeout, capture_output=True, text=True)
    if check and out.returncode != 0:
        die(f"{main} {' '.join(args)} failed ({out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
    return out


# ---------------------------------------------------------------------------------------
# kafka


def kafka_properties(region: str, port: int, cport: int, data: Path) -> str:
    return "\n".join([
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.voters=1@127.0.0.1:{cport}",
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=PLAINTEXT",
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        f"log.dirs={data}",
        "num.partitions=4",
        "offsets.topic.replication.factor=1",
        "offsets.topic.num.partitions=4",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "transaction.state.log.num.partitions=4",
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        "group.initial.rebalance.delay.ms=0",
        "auto.create.topics.enable=false",
        "log.cleaner.backoff.ms=5000",
        f"broker.rack={region}",
        "",
    ])


def start_kafka(region: str) -> dict:
    port, cport = free_port(), free_port()
    base = RUN / "kafka" / region
    data = base / "data"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    props = base / "server.properties"
    props.write_text(kafka_properties(region, port, cport, data))
    # like Kafka's own Uuid.randomUuid(): never starting with '-', which a command line
    # would read as an option
    cluster_id = "-"
    while cluster_id.startswith("-"):
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    java_tool("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props),
              "--ignore-formatted")
    pid = spawn_kafka(region)
    log(f"kafka {region}: pid {pid}, 127.0.0.1:{port}")
    return {"kafka": f"127.0.0.1:{port}", "kafka_pid": pid, "kafka_controller": cport}


def spawn_kafka(region: str) -> int:
    """Starts the broker of `region` on its formatted log dir and its properties."""
    return spawn(f"kafka-{region}", [java(), "-Xms256m", "-Xmx512m", "-XX:+UseG1GC",
                                     f"-Dlog4j2.configurationFile={RUN / 'log4j2.properties'}",
                                     f"-Dkafka.logs.dir={LOGS}", "-cp", kafka_cp(),
                                     "kafka.Kafka",
                                     str(RUN / "kafka" / region / "server.properties")])


def kafka_topics(bootstrap: str) -> set[str] | None:
    try:
        out = java_tool("org.apache.kafka.tools.TopicCommand", "--bootstrap-server", bootstrap,
                        "--list", check=False, timeout=30)
    except subprocess.TimeoutExpired:
        return None
    if out.returncode != 0:
        return None
    return {t.strip() for t in out.stdout.splitlines() if t.strip()}


def create_topics(bootstrap: str) -> None:
    for topic, (partitions, configs) in TOPICS.items():
        args = ["--bootstrap-server", bootstrap, "--create", "--if-not-exists", "--topic",
                topic, "--partitions", str(partitions), "--replication-factor", "1"]
        for k, v in configs.items():
            args += ["--config", f"{k}={v}"]
        java_tool("org.apache.kafka.tools.TopicCommand", *args)


# ---------------------------------------------------------------------------------------
# mirrormaker 2


def mm2_properties(regions: dict) -> str:
    lines = [
        f"clusters = {', '.join(regions)}",
        "replication.factor = 1",
        "checkpoints.topic.replication.factor = 1",
        "heartbeats.topic.replication.factor = 1",
        "offset-syncs.topic.replication.factor = 1",
        "offset.storage.replication.factor = 1",
        "status.storage.replication.factor = 1",
        "config.storage.replication.factor = 1",
        "tasks.max = 1",
        # low lag: pick up new topics quickly, commit source offsets often
        "refresh.topics.interval.seconds = 5",
        "refresh.groups.interval.seconds = 30",
        "sync.topic.configs.interval.seconds = 30",
        "offset.flush.interval.ms = 1000",
    ]
    for alias, r in regions.items():
        lines += [
            f"{alias}.bootstrap.servers = {r['kafka']}",
            # consumer: answer a fetch as soon as one byte is there, wait at most 20 ms
            f"{alias}.consumer.fetch.max.wait.ms = 20",
            f"{alias}.consumer.fetch.min.bytes = 1",
            # deltas are shipped in transactions: mirror only committed ones
            f"{alias}.consumer.isolation.level = read_committed",
            # producer: send at once, idempotent, all acks
            f"{alias}.producer.linger.ms = 0",
            f"{alias}.producer.acks = all",
            f"{alias}.producer.enable.idempotence = true",
            # the worker group of flows into this cluster: when a network cut costs the
            # worker its membership, its connectors come back at the next rebalance, not
            # after Connect's default five-minute wait for a departed member (measured:
            # replication into a region cut off for 15 s resumed 5 min after the heal)
            f"{alias}.scheduled.rebalance.max.delay.ms = 0",
        ]
    for src in regions:
        for dst in regions:
            if src != dst:
                lines += [f"{src}->{dst}.enabled = true",
                          f"{src}->{dst}.topics = {DELTAS_TOPIC.replace('.', chr(92) + '.')}"]
    return "\n".join(lines) + "\n"


def start_mm2(regions: dict) -> int:
    props = RUN / "mm2.properties"
    props.write_text(mm2_properties(regions))
    pid = spawn("mirrormaker2", [java(), "-Xms128m", "-Xmx512m",
                                 f"-Dlog4j2.configurationFile={RUN / 'log4j2.properties'}",
                                 "-cp", kafka_cp(),
                                 "org.apache.kafka.connect.mirror.MirrorMaker", str(props)])
    log(f"mirrormaker 2: pid {pid}")
    return pid


def mirrored_topics_present(regions: dict) -> bool:
    for dst, r in regions.items():
        topics = kafka_topics(r["kafka"]) or set()
        for src in regions:
            if src != dst and f"{src}.{DELTAS_TOPIC}" not in topics:
                return False
    return True


# ---------------------------------------------------------------------------------------
# s3


def s3_healthy(endpoint: str) -> bool:
    try:
        urllib.request.urlopen(endpoint + "/", timeout=1)
        return True
    except urllib.error.HTTPError:
        return True  # any S3 answer (403 for an unsigned request) means it serves
    except OSError:
        return False


def start_s3() -> dict:
    port = free_port()
    data = RUN / "s3"
    (data / S3_BUCKET).mkdir(parents=True, exist_ok=True)  # s3s-fs: a bucket is a folder
    pid = spawn("s3", [str(S3S_FS), "--host", "127.0.0.1", "--port", str(port),
                       "--access-key", S3_ACCESS_KEY, "--secret-key", S3_SECRET_KEY,
                       str(data)])
    endpoint = f"http://127.0.0.1:{port}"
    log(f"s3 (s3s-fs): pid {pid}, {endpoint}")
    return {"endpoint": endpoint, "bucket": S3_BUCKET, "access_key": S3_ACCESS_KEY,
            "secret_key": S3_SECRET_KEY, "region": "us-east-1", "pid": pid,
            "data_dir": str(data)}



# ---------------------------------------------------------------------------------------
# region nodes


def release() -> bool:
    """GEOSTATE_PROFILE=release runs the nodes from an optimised build (benchmarks)."""
    return os.environ.get("GEOSTATE_PROFILE", "debug") == "release"


def geostate_bin() -> Path:
    target = Path(os.environ.get("CARGO_TARGET_DIR", CACHE / "target"))
    return target / ("release" if release() else "debug") / "geostate"


def build_node() -> None:
    log(f"building geostate ({'release' if release() else 'debug'})")
    env = dict(os.environ, CARGO_TARGET_DIR=str(geostate_bin().parents[1]))
    subprocess.run(["cargo", "build", "--locked", "--bin", "geostate"]
                   + (["--release"] if release() else []), check=True, cwd=REPO, env=env)


def toml(value) -> str:
    """`value` as a TOML value (JSON's strings, numbers and booleans are TOML's)."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(toml(v) for v in value) + "]"
    return json.dumps(value)


def extra_settings() -> list[str]:
    """GEOSTATE_SET="lease.duration=700ms lease.renew-every=150ms max-clock-offset=100ms":
    `--set` overrides for every node and the witness (how the failover benchmark tries
    other lease timings with `cluster.py restart-nodes`)."""
    return os.environ.get("GEOSTATE_SET", "").split()


def lease_settings(member_id: int, listen: str, cluster: dict) -> list[str]:
    """This cluster's lease group in place of the template's: this member's id and
    address, and every member (regions by name, then the witness)."""
    members = [{"id": i, "addr": r["lease"], "region": region, "api": r["grpc"]}
               for i, (region, r) in enumerate(sorted(cluster["regions"].items()), start=1)]
    members.append({"id": len(members) + 1, "addr": cluster["witness"]["lease"]})
    return [f"lease.member-id={member_id}", f"lease.listen={toml(listen)}",
            f"lease.member={toml(members)}"]


def witness_settings(cluster: dict) -> list[str]:
    w = cluster["witness"]
    return ([f"data-dir={toml(w['data_dir'])}"]
            + lease_settings(len(cluster["regions"]) + 1, w["lease"], cluster)
            + extra_settings())


def start_witness(cluster: dict) -> None:
    w = cluster["witness"]
    if w.get("pid") and pid_alive(w["pid"]):
        stop_pid("witness", w["pid"])
    w["config"] = str(REPO / "regions" / "witness.toml")
    w["set"] = witness_settings(cluster)
    w["pid"] = spawn("witness", [str(geostate_bin()), "run", "--role", "witness",
                                 "--config", w["config"]] + set_args(w["set"]),
                     env={"RUST_LOG": os.environ.get("RUST_LOG", "info,openraft=warn")})
    w["grpc"] = w["lease"]
    log(f"witness: pid {w['pid']}, raft {w['lease']}")


def set_args(settings: list[str]) -> list[str]:
    return [arg for setting in settings for arg in ("--set", setting)]


def node_settings(region: str, r: dict, s3: dict, cluster: dict,
                  clock_offset_ms: int = 0) -> list[str]:
    """What the node of `region` runs with on top of regions/<region>.toml: this cluster's
    addresses, checkpoints to the cluster's S3 server (restored from when the data dir is
    empty), and the cluster's lease group; with `clock_offset_ms`, its wall clock shifted
    by that much (`clock-offset`)."""
    bucket = {"bucket": s3["bucket"], "prefix": f"{region}/", "endpoint": s3["endpoint"],
              "region": s3["region"], "path-style": True, "access-key": s3["access_key"],
              "secret-key": s3["secret_key"]}
    settings = [f"data-dir={toml(r['data_dir'])}", f"kafka.bootstrap={toml(r['kafka'])}",
                f"api.grpc-listen={toml(r['grpc'])}", f"api.metrics-listen={toml(r['metrics'])}",
                "checkpoint.restore-on-empty=true", "checkpoint.local-dir=",
                f"checkpoint.s3={toml(bucket)}"]
    member_id = sorted(cluster["regions"]).index(region) + 1
    settings += lease_settings(member_id, r["lease"], cluster)
    if clock_offset_ms:
        sign = "-" if clock_offset_ms < 0 else ""
        settings.append(f"clock-offset={sign}{abs(clock_offset_ms)}ms")
    return settings + extra_settings()


def node_ready(grpc: str) -> bool:
    out = subprocess.run([str(geostate_bin()), "status", "--addr", f"http://{grpc}"],
                         capture_output=True, timeout=30)
    return out.returncode == 0


def start_node(region: str, r: dict, s3: dict, cluster: dict,
               clock_offset_ms: int = 0) -> None:
    """Starts (or restarts) the node of `region`, keeping its data dir and ports."""
    if r.get("pid") and pid_alive(r["pid"]):
        stop_pid(f"node-{region}", r["pid"])
    r["grpc"] = r.get("grpc") or f"127.0.0.1:{free_port()}"
    r["metrics"] = r.get("metrics") or f"127.0.0.1:{free_port()}"
    r["config"] = str(REPO / "regions" / f"{region}.toml")
    r["set"] = node_settings(region, r, s3, cluster, clock_offset_ms)
    r["pid"] = spawn(f"node-{region}", [str(geostate_bin()), "run", "--config", r["config"]]
                     + set_args(r["set"]),
                     env={"RUST_LOG": os.environ.get("RUST_LOG", "info,openraft=warn")})
    log(f"node {region}: pid {r['pid']}, grpc {r['grpc']}, metrics {r['metrics']}")


def wait_node(region: str, r: dict) -> None:
    wait_for(f"node {region}", lambda: pid_alive(r["pid"]) and node_ready(r["grpc"]), 60)

# ---------------------------------------------------------------------------------------
# up / down / status


def read_cluster() -> dict | None:
    try:
        return json.loads(CLUSTER_JSON.read_text())
    except (OSError, ValueError):
        return None


def write_cluster(cluster: dict) -> None:
    tmp = CLUSTER_JSON.with_suffix(".tmp")
    tmp.write_text(json.dumps(cluster, indent=2) + "\n")
    tmp.rename(CLUSTER_JSON)


def health(cluster: dict) -> dict[str, bool]:
    out = {}
    for region, r in cluster["regions"].items():
        port = int(r["kafka"].rsplit(":", 1)[1])
        out[f"kafka {region}"] = pid_alive(r["kafka_pid"]) and port_open(port)
    out["mirrormaker2"] = pid_alive(cluster["mirrormaker2"]["pid"])
    out["s3"] = pid_alive(cluster["s3"]["pid"]) and s3_healthy(cluster["s3"]["endpoint"])
    for region, r in cluster["regions"].items():
        out[f"node {region}"] = bool(r.get("pid")) and pid_alive(r["pid"])
    if "witness" in cluster:
        out["witness"] = pid_alive(cluster["witness"].get("pid"))
    return out


def cmd_up(_args: argparse.Namespace) -> None:
    # --no-build: a process restarted during `cargo test` (the Jepsen nemesis) must not
    # wait for the cargo lock the running tests hold
    if not getattr(_args, "no_build", False):
        cmd_install(_args)
        build_node()
    existing = read_cluster()
    if existing is not None:
        h = health(existing)
        down = [k for k, v in h.items() if not v]
        if not down:
            log(f"already up ({CLUSTER_JSON})")
            return
        if all(k.startswith("node ") or k in ("mirrormaker2", "witness") for k in down):
            if "mirrormaker2" in down:
                existing["mirrormaker2"]["pid"] = start_mm2(existing["regions"])
                write_cluster(existing)
            if "witness" in down:
                start_witness(existing)
                write_cluster(existing)
            for region, r in existing["regions"].items():
                if f"node {region}" in down:
                    start_node(region, r, existing["s3"], existing)
                    write_cluster(existing)
                    wait_node(region, r)
            log(f"restarted {', '.join(down)}")
            return
        log(f"partly up ({', '.join(down)} down); restarting")
        cmd_down(_args)
    started = time.monotonic()
    RUN.mkdir(parents=True, exist_ok=True)
    # a fresh cluster: new Kafka logs, so node state and checkpoints of the old one go too
    for old in (LOGS, RUN / "nodes", RUN / "s3"):
        shutil.rmtree(old, ignore_errors=True)
    log4j_config()
    try:
        regions = {region: start_kafka(region) for region in REGIONS}
        s3 = start_s3()
        cluster = {"s3": s3, "regions": {}, "mirrormaker2": {}, "logs": str(LOGS),
                   "tools": {"grpcurl": str(GRPCURL), "geostate": str(geostate_bin()),
                             "s3s_fs": str(S3S_FS), "cluster_py": str(Path(__file__).resolve())}}
        for region, r in regions.items():
            cluster["regions"][region] = {
                "kafka": r["kafka"], "kafka_pid": r["kafka_pid"],
                # ports fixed up front: every node's config names the others' addresses
                "grpc": f"127.0.0.1:{free_port()}", "metrics": None,
                "data_dir": str(RUN / "nodes" / region),
                "lease": f"127.0.0.1:{free_port()}", "pid": None}
        cluster["mirrormaker2"] = {"pid": None}
        # the lease group's third member (two regions + a witness form a majority)
        cluster["witness"] = {"grpc": None, "lease": f"127.0.0.1:{free_port()}",
                              "data_dir": str(RUN / "nodes" / "witness"), "pid": None}
        write_cluster(cluster)  # so `down` finds whatever started, even if `up` fails now
        for region, r in regions.items():
            port = int(r["kafka"].rsplit(":", 1)[1])
            wait_for(f"kafka {region}", lambda p=port: port_open(p), 90)
            wait_for(f"kafka {region} metadata",
                     lambda b=r["kafka"]: kafka_topics(b) is not None, 90)
            create_topics(r["kafka"])
        wait_for("s3", lambda: s3_healthy(s3["endpoint"]), 30)
        cluster["mirrormaker2"]["pid"] = start_mm2(regions)
        write_cluster(cluster)
        wait_for("mirrormaker 2 remote topics", lambda: mirrored_topics_present(regions), 120)
        start_lease_group(cluster)
    except BaseException:
        log("start failed; stopping what was started")
        cmd_down(_args)
        raise
    log(f"up in {time.monotonic() - started:.1f}s; endpoints in {CLUSTER_JSON}")
    print(json.dumps(cluster, indent=2))


def cmd_down(_args: argparse.Namespace) -> None:
    # stop every pid we ever recorded, clients first (mirrormaker), then brokers, then s3
    names = sorted(p.name for p in PIDS.glob("*")) if PIDS.exists() else []
    order = sorted(names, key=lambda n: (0 if n.startswith("node") or n == "witness" else
                                         1 if n == "mirrormaker2" else
                                         2 if n.startswith("kafka") else 3))
    for name in order:
        try:
            pid = int((PIDS / name).read_text())
        except (OSError, ValueError):
            continue
        stop_pid(name, pid)
        (PIDS / name).unlink(missing_ok=True)
    CLUSTER_JSON.unlink(missing_ok=True)
    if shutil.which("iptables") and os.geteuid() == 0:
        net_heal(remove=True)
    log("down")


def cmd_status(_args: argparse.Namespace) -> None:
    cluster = read_cluster()
    if cluster is None:
        print("cluster: down (no cluster.json)")
        sys.exit(1)
    h = health(cluster)
    topics = {region: kafka_topics(r["kafka"]) for region, r in cluster["regions"].items()}
    for region, r in cluster["regions"].items():
        ok = h[f"kafka {region}"] and topics[region] is not None
        mirrored = sorted(t for t in (topics[region] or ()) if t.endswith("." + DELTAS_TOPIC))
        print(f"kafka {region:<10} {'healthy' if ok else 'DOWN':<8} {r['kafka']:<22} "
              f"pid {r['kafka_pid']}  mirrored: {', '.join(mirrored) or '-'}")
        h[f"kafka {region}"] = ok
    mm_ok = h["mirrormaker2"] and mirrored_topics_present(cluster["regions"])
    h["mirrormaker2"] = mm_ok
    print(f"mirrormaker2     {'healthy' if mm_ok else 'DOWN':<8} "
          f"{'':<22} pid {cluster['mirrormaker2']['pid']}")
    for region, r in cluster["regions"].items():
        ok = h[f"node {region}"] and node_ready(r["grpc"])
        h[f"node {region}"] = ok
        print(f"node {region:<11} {'healthy' if ok else 'DOWN':<8} {r['grpc'] or '-':<22} "
              f"pid {r['pid']}  metrics {r['metrics']}  data {r['data_dir']}")
    if "witness" in cluster:
        w = cluster["witness"]
        print(f"witness          {'healthy' if h['witness'] else 'DOWN':<8} {w['lease']:<22} "
              f"pid {w['pid']}  (lease group member, no region)")
    s3 = cluster["s3"]
    print(f"s3               {'healthy' if h['s3'] else 'DOWN':<8} {s3['endpoint']:<22} "
          f"pid {s3['pid']}  bucket {s3['bucket']}")
    print(f"cluster.json     {CLUSTER_JSON}")
    print(f"logs             {LOGS}")
    if not all(h.values()):
        sys.exit(1)


def start_lease_group(cluster: dict) -> None:
    """(Re)start the witness and every node, then wait until the nodes serve."""
    start_witness(cluster)
    write_cluster(cluster)
    for region, r in cluster["regions"].items():
        start_node(region, r, cluster["s3"], cluster)
        write_cluster(cluster)
    for region, r in cluster["regions"].items():
        wait_node(region, r)
    write_cluster(cluster)


def cmd_restart_nodes(_args: argparse.Namespace) -> None:
    """Restart the witness and every node with freshly generated settings (data kept): how
    new lease settings (GEOSTATE_SET) take effect."""
    cluster = read_cluster()
    if cluster is None:
        sys.exit("cluster: down (no cluster.json)")
    for region, r in cluster["regions"].items():
        if r.get("pid") and pid_alive(r["pid"]):
            stop_pid(f"node-{region}", r["pid"])
    start_lease_group(cluster)
    log(f"restarted the witness and nodes ({os.environ.get('GEOSTATE_SET') or 'template settings'})")


def cmd_mirror(args: argparse.Namespace) -> None:
    """Stop or start MirrorMaker 2 alone (chaos drills, tests): the regions keep running."""
    cluster = read_cluster()
    if cluster is None:
        sys.exit("cluster: down (no cluster.json)")
    pid = cluster["mirrormaker2"]["pid"]
    if args.action == "stop":
        if pid:
            stop_pid("mirrormaker2", pid)
            (PIDS / "mirrormaker2").unlink(missing_ok=True)
        cluster["mirrormaker2"]["pid"] = None
        write_cluster(cluster)
        log("mirrormaker 2 stopped")
    elif pid and pid_alive(pid):
        log(f"mirrormaker 2 already running (pid {pid})")
    else:
        cluster["mirrormaker2"]["pid"] = start_mm2(cluster["regions"])
        write_cluster(cluster)


def cmd_kafka(args: argparse.Namespace) -> None:
    """Kill a region's broker (SIGKILL: no clean shutdown) or start it again on the same
    port and log dir (chaos drills, the Jepsen `broker` nemesis); everything else keeps
    running."""
    cluster = read_cluster()
    if cluster is None:
        sys.exit("cluster: down (no cluster.json)")
    if args.region not in cluster["regions"]:
        die(f"no region {args.region!r} (regions: {', '.join(cluster['regions'])})")
    r = cluster["regions"][args.region]
    port = int(r["kafka"].rsplit(":", 1)[1])
    if args.action == "kill":
        if pid_alive(r["kafka_pid"]):
            os.killpg(r["kafka_pid"], signal.SIGKILL)
            while pid_alive(r["kafka_pid"]):
                time.sleep(0.05)
        log(f"kafka {args.region} killed")
        return
    if pid_alive(r["kafka_pid"]) and port_open(port):
        log(f"kafka {args.region} already running (pid {r['kafka_pid']})")
        return
    r["kafka_pid"] = spawn_kafka(args.region)
    write_cluster(cluster)
    wait_for(f"kafka {args.region}", lambda: kafka_topics(r["kafka"]) is not None, 90)
    log(f"kafka {args.region}: restarted, pid {r['kafka_pid']}")


# ---------------------------------------------------------------------------------------
# network cuts between the sites of the cluster (regions, witness, MirrorMaker 2)
#
# Every process runs on 127.0.0.1, so a cut is made by the sender: each site's processes go
# into a net_cls cgroup with its own class id, and iptables drops, in OUTPUT on the loopback
# interface, TCP packets from one site's class to another site's listening ports. Packets
# really are dropped by the kernel (established connections stall until their time-outs,
# new ones never connect); clients outside every site (tests, the Jepsen harness, the
# drills) still reach each region's gRPC API, as a region's own clients would.

NET_CLS = Path("/sys/fs/cgroup/net_cls")
# this run folder's own cgroups and chain: `make test` and `make up` clusters coexist
RUN_TAG = hashlib.sha256(str(RUN.resolve()).encode()).hexdigest()[:6]
NET_CHAIN = f"GS-NET-{RUN_TAG}"


def sites(cluster: dict) -> dict[str, dict]:
    """Site name -> {"classid", "pids", "ports"} for every region, the witness and
    MirrorMaker 2."""
    out = {}
    for i, (region, r) in enumerate(sorted(cluster["regions"].items())):
        ports = [r["kafka"], r.get("grpc"), r.get("lease"), r.get("metrics")]
        out[region] = {"pids": [r.get("pid"), r.get("kafka_pid")], "ports": ports,
                       "classid": 0x00470001 + i}
    w = cluster.get("witness", {})
    out["witness"] = {"pids": [w.get("pid")], "ports": [w.get("lease")], "classid": 0x004700fe}
    out["mirrormaker2"] = {"pids": [cluster.get("mirrormaker2", {}).get("pid")], "ports": [],
                           "classid": 0x004700ff}
    for site in out.values():
        site["ports"] = sorted({int(a.rsplit(":", 1)[1]) for a in site["ports"] if a})
        site["pids"] = [p for p in site["pids"] if pid_alive(p)]
    return out


def iptables(*args: str, check: bool = True) -> bool:
    done = subprocess.run(["iptables", "-w", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        die(f"iptables {' '.join(args)}: {done.stderr.strip()}")
    return done.returncode == 0


def net_prepare(cluster: dict) -> dict[str, dict]:
    """Mounts net_cls if needed, puts every site's live processes in its cgroup, and hooks
    this cluster's chain into OUTPUT."""
    if os.geteuid() != 0:
        die("network cuts need root (cgroups and iptables)")
    if not (NET_CLS / "net_cls.classid").exists():
        NET_CLS.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "cgroup", "-o", "net_cls", "net_cls", str(NET_CLS)],
                       check=True)
    by_site = sites(cluster)
    for name, site in by_site.items():
        group = NET_CLS / f"geostate-{RUN_TAG}-{name}"
        group.mkdir(exist_ok=True)
        (group / "net_cls.classid").write_text(str(site["classid"]))
        for pid in site["pids"]:
            (group / "cgroup.procs").write_text(str(pid))
    if not iptables("-n", "-L", NET_CHAIN, check=False):
        iptables("-N", NET_CHAIN)
    if not iptables("-C", "OUTPUT", "-o", "lo", "-j", NET_CHAIN, check=False):
        iptables("-I", "OUTPUT", "-o", "lo", "-j", NET_CHAIN)
    return by_site


def drop(source: dict, target: dict) -> None:
    """Drops TCP packets from `source`'s processes to `target`'s listening ports."""
    if not target["ports"]:
        return
    iptables("-A", NET_CHAIN, "-p", "tcp", "-m", "cgroup", "--cgroup", str(source["classid"]),
             "-m", "multiport", "--dports", ",".join(map(str, target["ports"])), "-j", "DROP")


# `net delay`: packets of the connections between a region and the other sites are queued
# (NFQUEUE, this run folder's own queue number) to wan-delay, which holds each one.
WAN_QUEUE = 100 + int(RUN_TAG, 16) % 60000
WAN_MARK = "0x4757"
WAN_PID = RUN / "wan-delay.pid"


def mark(source: dict, target: dict) -> None:
    """Marks the connections `source`'s processes open to `target`'s listening ports."""
    if not target["ports"]:
        return
    iptables("-A", NET_CHAIN, "-p", "tcp", "-m", "cgroup", "--cgroup", str(source["classid"]),
             "-m", "multiport", "--dports", ",".join(map(str, target["ports"])),
             "-j", "CONNMARK", "--set-mark", WAN_MARK)


def delayed_packets() -> int:
    """Packets the delay rule has queued since it was added (0 without one)."""
    done = subprocess.run(["iptables", "-w", "-n", "-v", "-x", "-L", NET_CHAIN],
                          capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if "NFQUEUE" in line:
            return int(line.split()[0])
    return 0


def stop_wan_delay() -> None:
    if WAN_PID.exists():
        pid = int(WAN_PID.read_text().strip() or 0)
        if pid_alive(pid):
            os.kill(pid, signal.SIGTERM)
        WAN_PID.unlink()


def net_heal(remove: bool = False) -> int:
    """Removes every cut and delay (returns how many packets were delayed); with `remove`
    (at `down`), the chain and its hook too."""
    delayed = 0
    if iptables("-n", "-L", NET_CHAIN, check=False):
        delayed = delayed_packets()
        iptables("-F", NET_CHAIN)
        if remove:
            iptables("-D", "OUTPUT", "-o", "lo", "-j", NET_CHAIN, check=False)
            iptables("-X", NET_CHAIN)
    stop_wan_delay()
    return delayed


def cmd_net(args: argparse.Namespace) -> None:
    """Cut a region off the rest of the cluster (`isolate REGION`, both directions, or
    `--direction out`: its processes cannot open connections to other sites, which can
    still reach it; `--direction in`: the reverse), delay every packet between it and the
    other sites (`delay REGION --ms 50 --jitter 20`: WAN latency), or remove every cut
    and delay (`heal`)."""
    cluster = read_cluster()
    if cluster is None:
        die(f"no cluster at {CLUSTER_JSON}; run `up` first")
    if args.action == "heal":
        delayed = net_heal()
        log(f"network healed ({delayed} packets had been delayed)")
        return
    if args.region not in cluster["regions"]:
        die(f"no region {args.region!r}")
    by_site = net_prepare(cluster)
    region = by_site[args.region]
    if args.action == "delay":
        install_wan_delay()
        stop_wan_delay()
        LOGS.mkdir(parents=True, exist_ok=True)
        log_file = LOGS / "wan-delay.log"
        with open(log_file, "w") as out:
            daemon = subprocess.Popen(
                [str(wan_delay_bin()), "--queue", str(WAN_QUEUE), "--delay", f"{args.ms}ms",
                 "--jitter", f"{args.jitter}ms"],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        WAN_PID.write_text(str(daemon.pid))
        # ready once it has bound the queue (it says so); rules before that would let the
        # first packets through undelayed (--queue-bypass)
        deadline = time.monotonic() + 10
        while "wan-delay: queue" not in log_file.read_text():
            if daemon.poll() is not None or time.monotonic() > deadline:
                die(f"wan-delay did not bind queue {WAN_QUEUE}; see {log_file}")
            time.sleep(0.02)
        for name, other in by_site.items():
            if name != args.region:
                mark(region, other)
                mark(other, region)
        iptables("-A", NET_CHAIN, "-p", "tcp", "-m", "connmark", "--mark", WAN_MARK,
                 "-j", "NFQUEUE", "--queue-num", str(WAN_QUEUE), "--queue-bypass")
        log(f"network: {args.region}'s links to the other sites delayed "
            f"{args.ms} ms ± {args.jitter} ms per packet")
        return
    for name, other in by_site.items():
        if name == args.region:
            continue
        if args.direction in ("both", "out"):
            drop(region, other)
        if args.direction in ("both", "in"):
            drop(other, region)
    log(f"network: {args.region} isolated ({args.direction})")


def cmd_node(args: argparse.Namespace) -> None:
    """Restart a region's node (data kept), optionally with its wall clock set off by
    `--clock-offset` ms (the node's `clock-offset`: every wall-clock reading of the node is
    shifted, its monotonic clock is not). A later plain
    `node restart` puts the clock right again; `up` restarts only dead nodes."""
    cluster = read_cluster()
    if cluster is None:
        die(f"no cluster at {CLUSTER_JSON}; run `up` first")
    if args.region not in cluster["regions"]:
        die(f"no region {args.region!r}")
    r = cluster["regions"][args.region]
    start_node(args.region, r, cluster["s3"], cluster, args.clock_offset)
    write_cluster(cluster)
    wait_node(args.region, r)
    log(f"node {args.region}: restarted, clock offset {args.clock_offset} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name, fn in [("install", cmd_install), ("up", cmd_up), ("down", cmd_down),
                     ("status", cmd_status), ("restart-nodes", cmd_restart_nodes)]:
        command = sub.add_parser(name)
        command.set_defaults(fn=fn)
        if name == "up":
            command.add_argument("--no-build", action="store_true",
                                 help="use the binaries already built (restarts only)")
    mirror = sub.add_parser("mirror", help="stop or start MirrorMaker 2 alone")
    mirror.add_argument("action", choices=["stop", "start"])
    mirror.set_defaults(fn=cmd_mirror)
    kafka = sub.add_parser("kafka", help="kill a region's broker or start it again")
    kafka.add_argument("action", choices=["kill", "start"])
    kafka.add_argument("region")
    kafka.set_defaults(fn=cmd_kafka)
    node = sub.add_parser("node", help="restart a region's node, optionally with its clock off")
    node.add_argument("action", choices=["restart"])
    node.add_argument("region")
    node.add_argument("--clock-offset", type=int, default=0, metavar="MS")
    node.set_defaults(fn=cmd_node)
    net = sub.add_parser("net", help="cut a region off the other sites, or heal every cut")
    net.add_argument("action", choices=["isolate", "delay", "heal"])
    net.add_argument("region", nargs="?")
    net.add_argument("--direction", choices=["both", "out", "in"], default="both")
    net.add_argument("--ms", type=int, default=50, help="delay: per packet, each way")
    net.add_argument("--jitter", type=int, default=20, help="delay: ± this much")
    net.set_defaults(fn=cmd_net)
    args = parser.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
