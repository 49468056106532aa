"""`secure-kafka`: one more KRaft broker, on SASL_SSL only (TLS with certificates from
`geostate certs`, SCRAM-SHA-512 users), beside the cluster's plaintext brokers. Tests of
Kafka security run on it; `down` stops it with everything else. Its bootstrap address,
CA file, user and password file are in `secure-kafka/secure.json`."""

from __future__ import annotations

import secrets

from .common import *  # noqa: F401,F403
from .procs import *  # noqa: F401,F403
from .kafka import *  # noqa: F401,F403
from .nodes import geostate_bin

USER = "geostate"
NAME = "kafka-secure"


def secure_dir() -> Path:
    return RUN / "secure-kafka"


def client_properties(ca: Path, user: str, password: str) -> str:
    """A Java client's (the admin tools') SASL_SSL settings."""
    return "\n".join([
        "security.protocol=SASL_SSL",
        "sasl.mechanism=SCRAM-SHA-512",
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{user}" password="{password}";',
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={ca}",
        "",
    ])


def secure_properties(port: int, cport: int, base: Path, admin_password: str) -> str:
    plain = kafka_properties("secure", port, cport, base / "data").splitlines()
    # the plaintext listener lines give way to SASL_SSL ones
    kept = [line for line in plain if not line.startswith(
        ("listeners=", "advertised.listeners=", "inter.broker.listener.name=",
         "listener.security.protocol.map="))]
    certs = base / "certs"
    return "\n".join(kept + [
        f"listeners=SASL_SSL://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}",
        f"advertised.listeners=SASL_SSL://127.0.0.1:{port}",
        "inter.broker.listener.name=SASL_SSL",
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL",
        "sasl.enabled.mechanisms=SCRAM-SHA-512",
        "sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512",
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config="
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="admin" password="{admin_password}";',
        "ssl.keystore.type=PEM",
        f"ssl.keystore.location={certs / 'broker-keystore.pem'}",
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={certs / 'ca.pem'}",
        "ssl.client.auth=none",
        "",
    ])


def start_secure_kafka() -> dict:
    base = secure_dir()
    shutil.rmtree(base, ignore_errors=True)
    certs = base / "certs"
    certs.mkdir(parents=True)
    out = subprocess.run([str(geostate_bin()), "certs", "--out", str(certs), "broker"],
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
    admin_props = base / "client.properties"
    admin_props.write_text(client_properties(certs / "ca.pem", USER, password))
    admin_props.chmod(0o600)
    port, cport = free_port(), free_port()
    props = base / "server.properties"
    props.write_text(secure_properties(port, cport, base, admin_password))
    props.chmod(0o600)
    cluster_id = "-"
    while cluster_id.startswith("-"):
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    java_tool("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props),
              "--add-scram", f"SCRAM-SHA-512=[name=admin,password={admin_password}]",
              "--add-scram", f"SCRAM-SHA-512=[name={USER},password={password}]",
              "--ignore-formatted")
    pid = spawn(NAME, [java(), "-Xms256m", "-Xmx512m", "-XX:+UseG1GC",
                       f"-Dlog4j2.configurationFile={RUN / 'log4j2.properties'}",
                       f"-Dkafka.logs.dir={LOGS}", "-cp", kafka_cp(), "kafka.Kafka", str(props)])
    bootstrap = f"127.0.0.1:{port}"

    def answers() -> bool:
        listed = java_tool("org.apache.kafka.tools.TopicCommand", "--bootstrap-server",
                           bootstrap, "--command-config", str(admin_props), "--list",
                           check=False, timeout=30)
        return listed.returncode == 0

    wait_for("kafka secure", answers, 90)
    info = {"bootstrap": bootstrap, "pid": pid, "ca": str(certs / "ca.pem"), "username": USER,
            "password_file": str(password_file), "mechanism": "SCRAM-SHA-512"}
    (base / "secure.json").write_text(json.dumps(info, indent=2) + "\n")
    log(f"kafka secure (SASL_SSL, SCRAM-SHA-512): pid {pid}, {bootstrap}")
    return info


def cmd_secure_kafka(args: argparse.Namespace) -> None:
    info_file = secure_dir() / "secure.json"
    if args.action == "stop":
        if info_file.exists():
            stop_pid(NAME, json.loads(info_file.read_text())["pid"])
            (PIDS / NAME).unlink(missing_ok=True)
        shutil.rmtree(secure_dir(), ignore_errors=True)
        log("kafka secure: stopped")
        return
    if info_file.exists():
        info = json.loads(info_file.read_text())
        if pid_alive(info["pid"]):
            log(f"kafka secure: already running ({info_file})")
            return
    log4j_config()
    start_secure_kafka()
