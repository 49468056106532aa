"""`secure-kafka`: one more KRaft broker, on SASL_SSL only (TLS with certificates from
`geostate certs`, SCRAM-SHA-512 users), beside a plaintext cluster's brokers: tests of
Kafka security run on it; `down` stops it with everything else. Its bootstrap address,
CA file, user and password file are in `secure-kafka/secure.json`. (`make up SECURE=1`
runs the whole cluster that way instead.)"""

from __future__ import annotations

from .common import *  # noqa: F401,F403
from .procs import *  # noqa: F401,F403
from .kafka import *  # noqa: F401,F403

NAME = "secure"


def secure_dir() -> Path:
    return RUN / "secure-kafka"


def cmd_secure_kafka(args: argparse.Namespace) -> None:
    info_file = secure_dir() / "secure.json"
    if args.action == "stop":
        if info_file.exists():
            stop_pid(f"kafka-{NAME}", json.loads(info_file.read_text())["pid"])
            (PIDS / f"kafka-{NAME}").unlink(missing_ok=True)
        shutil.rmtree(secure_dir(), ignore_errors=True)
        log("kafka secure: stopped")
        return
    if info_file.exists() and pid_alive(json.loads(info_file.read_text())["pid"]):
        log(f"kafka secure: already running ({info_file})")
        return
    shutil.rmtree(secure_dir(), ignore_errors=True)
    log4j_config()
    security = make_security(secure_dir(), [])
    broker = start_kafka(NAME, security)
    wait_for("kafka secure", lambda: kafka_topics(broker["kafka"], security) is not None, 90)
    info = {"bootstrap": broker["kafka"], "pid": broker["kafka_pid"], **security}
    info_file.write_text(json.dumps(info, indent=2) + "\n")
    info_file.chmod(0o600)
    log(f"kafka secure (SASL_SSL, SCRAM-SHA-512): pid {broker['kafka_pid']}, {broker['kafka']}")
