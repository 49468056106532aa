"""Network faults between the sites: iptables drops (`isolate`) and the NFQUEUE delayer (`delay`), per run folder."""

from __future__ import annotations

from .common import *  # noqa: F401,F403
from .install import *  # noqa: F401,F403
from .procs import *  # noqa: F401,F403


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
        pids = [r.get("pid"), r.get("kafka_pid")]
        for n in r.get("nodes", {}).values():
            ports += [n.get("grpc"), n.get("lease"), n.get("metrics")]
            pids.append(n.get("pid"))
        out[region] = {"pids": pids, "ports": ports, "classid": 0x00470001 + i}
    if "witness" in cluster:
        w = cluster["witness"]
        out["witness"] = {"pids": [w.get("pid")], "ports": [w.get("lease")],
                          "classid": 0x004700fe}
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
WAN_PID = RUN / "wan-delay.pid"


def wan_mark() -> str:
    """A connection mark of its own for each `net delay`: a heal flushes the rules but
    not the marks the connections already carry, so with one mark for all, the next delay
    would hold every connection an earlier one marked too (a delay of one region also
    slowed the other region's links to the witness, marked when that region was
    delayed before)."""
    return f"0x4757{random.randrange(1, 1 << 16):04x}"


def mark(source: dict, target: dict, value: str) -> None:
    """Marks (`value`) the connections `source`'s processes open to `target`'s listening
    ports."""
    if not target["ports"]:
        return
    iptables("-A", NET_CHAIN, "-p", "tcp", "-m", "cgroup", "--cgroup", str(source["classid"]),
             "-m", "multiport", "--dports", ",".join(map(str, target["ports"])),
             "-j", "CONNMARK", "--set-mark", value)


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
        value = wan_mark()
        for name, other in by_site.items():
            if name != args.region:
                mark(region, other, value)
                mark(other, region, value)
        iptables("-A", NET_CHAIN, "-p", "tcp", "-m", "connmark", "--mark", value,
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
