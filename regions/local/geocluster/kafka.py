"""One KRaft Kafka broker per region with the geostate topics, and MirrorMaker 2 mirroring every deltas topic into every other region."""

from __future__ import annotations

from .common import *  # noqa: F401,F403
from .procs import *  # noqa: F401,F403


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
        # Kafka's default list plus max.message.bytes: a mirror must take every record its
        # source took. A source limit lowered for a moment, copied by the sync, fails the
        # mirror's writes with RecordTooLarge, and that kills the MirrorSourceConnector task
        # for good ("will not recover until manually restarted"): a flow stops replicating.
        "config.properties.exclude = " + ", ".join([
            r"follower\.replication\.throttled\.replicas",
            r"leader\.replication\.throttled\.replicas",
            r"message\.timestamp\.difference\.max\.ms", r"message\.timestamp\.type",
            r"unclean\.leader\.election\.enable", r"min\.insync\.replicas",
            r"max\.message\.bytes"]),
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
