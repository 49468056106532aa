"""What every part of the local cluster shares: versions, paths, topics, logging."""

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

DEFAULT_REGIONS = ["us-east-1", "eu-west-1"]
# A region without its own file under regions/ runs this one with its name set.
TEMPLATE_REGION = "us-east-1"
S3_BUCKET = "geostate-checkpoints"
S3_ACCESS_KEY = "geostate"
S3_SECRET_KEY = "geostate-secret"

# topic -> (partitions, extra configs). Deltas are compacted by key: a later delta for a key
# supersedes an earlier one (ARCHITECTURE.md, replication).
TOPICS = {
    "geostate.updates": (4, {}),
    "geostate.deltas": (4, {"cleanup.policy": "compact", "min.compaction.lag.ms": "60000"}),
    "geostate.dlq": (1, {}),
    "geostate.late": (1, {}),
    "geostate.outputs": (4, {}),
}
DELTAS_TOPIC = "geostate.deltas"

REPO = Path(__file__).resolve().parents[3]
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
    # the outputs table's database (any major version: /usr/lib/postgresql/<major>/bin)
    "postgresql": "/usr/lib/postgresql/*/bin/postgres",
    # scrapes the nodes and evaluates deploy/prometheus/rules.yml; promtool checks them
    "prometheus": "/usr/bin/promtool",
    # `geostate top` is tested in a terminal
    "tmux": "/usr/bin/tmux",
}


def asked_regions() -> list[str]:
    """REGIONS=a,b,c (`make up REGIONS=us-east-1,eu-west-1,ap-southeast-1`): the regions of a
    new cluster, two by default."""
    raw = os.environ.get("REGIONS", "").strip()
    if not raw:
        return list(DEFAULT_REGIONS)
    regions = [r.strip() for r in raw.split(",") if r.strip()]
    for r in regions:
        if not r.replace("-", "").isalnum() or r != r.lower() or r == "witness":
            die(f"REGIONS: {r!r} is not a region name (lowercase letters, digits and '-')")
    if len(set(regions)) != len(regions) or len(regions) < 2:
        die(f"REGIONS={raw!r}: at least two different regions")
    return regions


def log(msg: str) -> None:
    print(f"[cluster] {msg}", flush=True)


def die(msg: str) -> NoReturn:
    print(f"[cluster] error: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def read_cluster() -> dict | None:
    try:
        return json.loads(CLUSTER_JSON.read_text())
    except (OSError, ValueError):
        return None


def write_cluster(cluster: dict) -> None:
    tmp = CLUSTER_JSON.with_suffix(".tmp")
    tmp.write_text(json.dumps(cluster, indent=2) + "\n")
    tmp.rename(CLUSTER_JSON)
    from .prometheus import write_targets  # noqa: PLC0415 (it imports this module)
    write_targets(cluster)
