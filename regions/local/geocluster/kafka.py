"""One KRaft Kafka broker per region with the geostate topics, and MirrorMaker 2 mirroring every deltas topic into every other region."""

from __future__ import annotations

import secrets

from .common import *  # noqa: F401,F403
from .procs import *  # noqa: F401,F403


SECURITY_FILE = RUN / "kafka-security.json"


def cluster_security() -> dict | None:
    """The cluster's Kafka security (`make up SECURE=1`), or None: plaintext brokers."""
    return json.loads(SECURITY_FILE.read_text()) if SECURITY_FILE.exists() else None


def make_security(base: Path, names: list[str]) -> dict:
    """Certificates (`geostate certs`: the CA, a broker's, and one per name), a SCRAM
    user for the brokers and one for every client, their passwords in files, and the
    admin tools' client properties, under `base`."""
    from .nodes import geostate_bin
    certs = base / "certs"
    certs.mkdir(parents=True, exist_ok=True)
    out = subprocess.run([str(geostate_bin()), "certs", "--out", str(certs), "broker", *names],
                         capture_output=True, text=True)
    if out.returncode != 0:
        die(f"geostate certs failed: {out.stderr.strip()}")
    keystore = certs / "broker-keystore.pem"
    keystore.write_text((certs / "broker.key").read_text() + (certs / "broker.pem").read_text())
    keystore.chmod(0o600)
    admin_password, password = secrets.token_hex(16), secrets.token_hex(16)
    password_file = base / "kafka.password"
    password_file.write_text(password + "\n")
    password_file.chmod(0o600)
    ca = certs / "ca.pem"
    tools = base / "kafka-client.properties"
    tools.write_text("\n".join([
        "security.protocol=SASL_SSL",
        "sasl.mechanism=SCRAM-SHA-512",
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="geostate" password="{password}";',
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={ca}",
        "",
    ]))
    tools.chmod(0o600)
    return {"certs": str(certs), "ca": str(ca), "keystore": str(keystore),
            "username": "geostate", "password_file": str(password_file),
            "admin_password": admin_password, "tools": str(tools)}


def client_security(security: dict) -> dict:
    """librdkafka properties of a client of a secure broker."""
    return {"security.protocol": "sasl_ssl", "sasl.mechanisms": "SCRAM-SHA-512",
            "sasl.username": security["username"],
            "sasl.password": Path(security["password_file"]).read_text().strip(),
            "ssl.ca.location": security["ca"]}


def node_security(security: dict) -> dict:
    """A node's `[kafka.security]`."""
    return {"protocol": "sasl_ssl", "mechanism": "SCRAM-SHA-512",
            "username": security["username"], "password-file": security["password_file"],
            "ca": security["ca"]}


def mm2_security(alias: str, security: dict) -> list[str]:
    """MirrorMaker 2's settings for the cluster `alias` on SASL_SSL."""
    password = Path(security["password_file"]).read_text().strip()
    return [
        f"{alias}.security.protocol = SASL_SSL",
        f"{alias}.sasl.mechanism = SCRAM-SHA-512",
        f"{alias}.sasl.jaas.config = org.apache.kafka.common.security.scram.ScramLoginModule "
        f'required username="{security["username"]}" password="{password}";',
        f"{alias}.ssl.truststore.type = PEM",
        f"{alias}.ssl.truststore.location = {security['ca']}",
    ]


def tool_security(security: dict | None) -> list[str]:
    """The admin tools' `--command-config` for a secure broker."""
    return ["--command-config", security["tools"]] if security else []


def kafka_properties(region: str, port: int, cport: int, data: Path,
                     security: dict | None = None) -> str:
    """A broker's properties: PLAINTEXT, or (`security`) SASL_SSL with SCRAM-SHA-512 for
    clients and between brokers; the controller listener stays on loopback in plaintext."""
    listener = "SASL_SSL" if security else "PLAINTEXT"
    secured = [
        "sasl.enabled.mechanisms=SCRAM-SHA-512",
        "sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512",
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config="
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="admin" password="{security["admin_password"]}";',
        "ssl.keystore.type=PEM",
        f"ssl.keystore.location={security['keystore']}",
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={security['ca']}",
        "ssl.client.auth=none",
    ] if security else []
    return "\n".join(secured + [
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.voters=1@127.0.0.1:{cport}",
        f"listeners={listener}://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}",
        f"advertised.listeners={listener}://127.0.0.1:{port}",
        "controller.listener.names=CONTROLLER",
        f"inter.broker.listener.name={listener}",
        f"listener.security.protocol.map=CONTROLLER:PLAINTEXT,{listener}:{listener}",
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


def start_kafka(region: str, security: dict | None = None) -> dict:
    port, cport = free_port(), free_port()
    base = RUN / "kafka" / region
    data = base / "data"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    props = base / "server.properties"
    props.write_text(kafka_properties(region, port, cport, data, security))
    props.chmod(0o600)
    scram = [] if security is None else [
        "--add-scram", f"SCRAM-SHA-512=[name=admin,password={security['admin_password']}]",
        "--add-scram", f"SCRAM-SHA-512=[name={security['username']},password="
                       f"{Path(security['password_file']).read_text().strip()}]"]
    # like Kafka's own Uuid.randomUuid(): never starting with '-', which a command line
    # would read as an option
    cluster_id = "-"
    while cluster_id.startswith("-"):
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    java_tool("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props), *scram,
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


def kafka_topics(bootstrap: str, security: dict | None = None) -> set[str] | None:
    """The topics of the broker at `bootstrap` (its security: the given, else the
    cluster's), or None if it does not answer."""
    security = security or cluster_security()
    try:
        out = java_tool("org.apache.kafka.tools.TopicCommand", "--bootstrap-server", bootstrap,
                        *tool_security(security), "--list", check=False, timeout=30)
    except subprocess.TimeoutExpired:
        return None
    if out.returncode != 0:
        return None
    return {t.strip() for t in out.stdout.splitlines() if t.strip()}


def create_topics(bootstrap: str) -> None:
    for topic, (partitions, configs) in TOPICS.items():
        args = ["--bootstrap-server", bootstrap, *tool_security(cluster_security()),
                "--create", "--if-not-exists", "--topic",
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
    security = cluster_security()
    for alias, r in regions.items():
        lines += mm2_security(alias, security) if security else []
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
    props.chmod(0o600)
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
