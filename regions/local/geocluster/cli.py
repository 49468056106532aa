"""The `cluster.py` command line."""

from __future__ import annotations

import argparse

from .install import cmd_install
from .lifecycle import (cmd_down, cmd_kafka, cmd_mirror, cmd_node, cmd_region, cmd_restart_nodes,
                        cmd_status, cmd_top, cmd_up)
from .net import cmd_net
from .postgres import cmd_postgres, cmd_sink, cmd_udf
from .s3 import cmd_s3
from .secure import cmd_secure_kafka


def main(description: str) -> None:
    parser = argparse.ArgumentParser(description=description)
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name, fn in [("install", cmd_install), ("up", cmd_up), ("down", cmd_down),
                     ("status", cmd_status), ("restart-nodes", cmd_restart_nodes),
                     ("top", cmd_top)]:
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
    node = sub.add_parser("node", help="restart, add, remove or kill one node of a region "
                          "(REGION or REGION/i); restart optionally with its clock off")
    node.add_argument("action", choices=["restart", "add", "remove", "kill"])
    node.add_argument("node", metavar="REGION[/i]")
    node.add_argument("--clock-offset", type=int, default=0, metavar="MS")
    node.set_defaults(fn=cmd_node)
    region = sub.add_parser("region", help="add a region to the running cluster (its lease "
                            "member joins the group through its log) or remove one")
    region.add_argument("action", choices=["add", "remove"])
    region.add_argument("region")
    region.set_defaults(fn=cmd_region)
    postgres = sub.add_parser("postgres", help="kill PostgreSQL (a crash), start it, or both")
    postgres.add_argument("action", choices=["kill", "start", "restart"])
    postgres.set_defaults(fn=cmd_postgres)
    s3 = sub.add_parser("s3", help="kill the S3 server (SIGKILL) or start it again on its "
                        "port and folder")
    s3.add_argument("action", choices=["kill", "start"])
    s3.set_defaults(fn=cmd_s3)
    sink = sub.add_parser("sink", help="kill a region's PostgreSQL sink (SIGKILL) or start it")
    sink.add_argument("action", choices=["kill", "start"])
    sink.add_argument("region")
    sink.set_defaults(fn=cmd_sink)
    secure = sub.add_parser("secure-kafka", help="start or stop a broker on SASL_SSL only "
                            "(SCRAM-SHA-512, certificates from geostate certs)")
    secure.add_argument("action", choices=["start", "stop"])
    secure.set_defaults(fn=cmd_secure_kafka)
    udf = sub.add_parser("udf", help="price with the surge function of the Python or Go SDK "
                         "example (a sidecar per region), or the built-in formula again")
    udf.add_argument("kind", choices=["python", "go", "builtin"])
    udf.set_defaults(fn=cmd_udf)
    net = sub.add_parser("net", help="cut a region off the other sites, or heal every cut")
    net.add_argument("action", choices=["isolate", "delay", "heal"])
    net.add_argument("region", nargs="?")
    net.add_argument("--direction", choices=["both", "out", "in"], default="both")
    net.add_argument("--ms", type=int, default=50, help="delay: per packet, each way")
    net.add_argument("--jitter", type=int, default=20, help="delay: ± this much")
    net.set_defaults(fn=cmd_net)
    args = parser.parse_args()
    args.fn(args)
