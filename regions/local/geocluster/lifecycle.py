"""`up`, `down`, `status`, `restart-nodes`, `mirror`, `kafka`, `node`: the cluster as a whole, recorded in cluster.json."""

from __future__ import annotations

from .common import *  # noqa: F401,F403
from .install import *  # noqa: F401,F403
from .procs import *  # noqa: F401,F403
from .kafka import *  # noqa: F401,F403
from .s3 import *  # noqa: F401,F403
from .nodes import *  # noqa: F401,F403
from .net import *  # noqa: F401,F403
from .postgres import *  # noqa: F401,F403
from .prometheus import *  # noqa: F401,F403


def health(cluster: dict) -> dict[str, bool]:
    out = {}
    for region, r in cluster["regions"].items():
        port = int(r["kafka"].rsplit(":", 1)[1])
        out[f"kafka {region}"] = pid_alive(r["kafka_pid"]) and port_open(port)
    out["mirrormaker2"] = pid_alive(cluster["mirrormaker2"]["pid"])
    out["s3"] = pid_alive(cluster["s3"]["pid"]) and s3_healthy(cluster["s3"]["endpoint"])
    pg = cluster.get("postgres", {})
    if "port" in pg:  # absent until `up` started it
        out["postgres"] = pid_alive(pg["pid"]) and pg_ready(pg["port"])
    for region, r in cluster["regions"].items():
        for service in REGION_SERVICES:
            if service in r:
                out[f"{service} {region}"] = pid_alive(r[service].get("pid"))
    for region, r in cluster["regions"].items():
        out[f"node {region}"] = bool(r.get("pid")) and pid_alive(r["pid"])
        for i, n in further_nodes(r).items():
            out[f"node {region}/{i}"] = bool(n.get("pid")) and pid_alive(n["pid"])
    if "witness" in cluster:
        out["witness"] = pid_alive(cluster["witness"].get("pid"))
    if "prometheus" in cluster:
        out["prometheus"] = pid_alive(cluster["prometheus"].get("pid"))
    return out


def runs_an_older_binary(cluster: dict) -> bool:
    """Whether the witness or a node was started from another build than the binary now."""
    now = binary_stamp()
    started = [r.get("binary_mtime_ns") for r in cluster["regions"].values()]
    started += [n.get("binary_mtime_ns") for r in cluster["regions"].values()
                for n in further_nodes(r).values()]
    started.append(cluster.get("witness", {}).get("binary_mtime_ns"))
    return any(s != now for s in started)


def cmd_up(_args: argparse.Namespace) -> None:
    # --no-build: a process restarted during `cargo test` (the Jepsen nemesis) must not
    # wait for the cargo lock the running tests hold
    if not getattr(_args, "no_build", False):
        cmd_install(_args)
        build_node()
    existing = read_cluster()
    # SECURE=1: Kafka on SASL_SSL, the lease group on TLS. Unset: as the cluster already
    # runs (a restart keeps its mode); plaintext for a new one.
    asked = os.environ.get("SECURE")
    was = bool(existing and existing.get("security"))
    secure = was if asked is None else asked not in ("", "0")
    if existing is not None and secure != was:
        die(f"the cluster runs with SECURE={int(was)}: `make down` first")
    # REGIONS unset: as the cluster already runs (a restart keeps its regions)
    regions_asked = asked_regions()
    if existing is not None and not os.environ.get("REGIONS"):
        regions_asked = list(existing["regions"])
    if existing is not None and sorted(regions_asked) != sorted(existing["regions"]):
        die(f"the cluster runs regions {','.join(existing['regions'])}: `make down` first")
    if existing is not None:
        h = health(existing)
        down = [k for k, v in h.items() if not v]
        if not down:
            if not getattr(_args, "no_build", False) and runs_an_older_binary(existing):
                log("geostate was rebuilt since the nodes started: restarting them (data kept)")
                for region, r in existing["regions"].items():
                    for service in REGION_SERVICES:
                        if service in r:
                            stop_pid(f"{service}-{region}", r[service]["pid"])
                start_lease_group(existing)
                start_services(existing)
                return
            if "prometheus" in existing:
                # rules edited since it started take effect
                os.kill(existing["prometheus"]["pid"], signal.SIGHUP)
            log(f"already up ({CLUSTER_JSON})")
            return
        services = tuple(f"{s} " for s in REGION_SERVICES)
        if all(k.startswith(("node ", *services))
               or k in ("mirrormaker2", "witness", "prometheus", "s3") for k in down):
            if "s3" in down:
                restart_s3(existing)
            if "mirrormaker2" in down:
                existing["mirrormaker2"]["pid"] = start_mm2(existing["regions"])
                write_cluster(existing)
            if "witness" in down:
                start_witness(existing)
                write_cluster(existing)
            if "prometheus" in down:
                start_prometheus(existing)
                write_cluster(existing)
            for region, r in existing["regions"].items():
                if f"node {region}" in down:
                    start_node(region, r, existing["s3"], existing)
                    write_cluster(existing)
                    wait_node(region, r)
                for i, n in further_nodes(r).items():
                    if f"node {region}/{i}" in down:
                        start_further_node(region, i, existing)
                        write_cluster(existing)
                        wait_node(f"{region}/{i}", n)
                for service, start in REGION_SERVICES.items():
                    if f"{service} {region}" in down:
                        start(region, existing)
                        write_cluster(existing)
            log(f"restarted {', '.join(down)}")
            return
        log(f"partly up ({', '.join(down)} down); restarting")
        cmd_down(_args)
    started = time.monotonic()
    RUN.mkdir(parents=True, exist_ok=True)
    # a fresh cluster: new Kafka logs, so node state and checkpoints of the old one go too
    for old in (LOGS, RUN / "nodes", RUN / "s3", PROMETHEUS_DIR):
        shutil.rmtree(old, ignore_errors=True)
    log4j_config()
    shutil.rmtree(RUN / "security", ignore_errors=True)
    SECURITY_FILE.unlink(missing_ok=True)
    security = None
    if secure:
        security = make_security(RUN / "security", [*regions_asked, "witness"])
        SECURITY_FILE.write_text(json.dumps(security, indent=2) + "\n")
        SECURITY_FILE.chmod(0o600)
    try:
        regions = {region: start_kafka(region, security) for region in regions_asked}
        s3 = start_s3()
        cluster = {"s3": s3, "postgres": {"pid": None}, "regions": {}, "mirrormaker2": {}, "logs": str(LOGS),
                   "security": security,
                   "tools": {"grpcurl": str(GRPCURL), "geostate": str(geostate_bin()),
                             "s3s_fs": str(S3S_FS), "cluster_py": str(REPO / "regions" / "local" / "cluster.py")}}
        for member_id, (region, r) in enumerate(sorted(regions.items()), start=1):
            cluster["regions"][region] = {
                "member_id": member_id,
                "kafka": r["kafka"], "kafka_pid": r["kafka_pid"],
                # ports fixed up front: every node's config names the others' addresses
                "grpc": f"127.0.0.1:{free_port()}", "metrics": None,
                "data_dir": str(RUN / "nodes" / region),
                "lease": f"127.0.0.1:{free_port()}", "pid": None,
                # what a Kafka client of this region's broker sets (tests, tools)
                "kafka_client": client_security(security) if security else {}}
        cluster["mirrormaker2"] = {"pid": None}
        # with an even number of regions, a witness makes the lease group's member count
        # odd, so that losing any one site (or half the regions and not the witness) leaves
        # a majority; with an odd number the regions alone are one
        if len(regions) % 2 == 0:
            cluster["witness"] = {"member_id": len(regions) + 1,
                                  "grpc": None, "lease": f"127.0.0.1:{free_port()}",
                                  "data_dir": str(RUN / "nodes" / "witness"), "pid": None}
        write_cluster(cluster)  # so `down` finds whatever started, even if `up` fails now
        for region, r in regions.items():
            port = int(r["kafka"].rsplit(":", 1)[1])
            wait_for(f"kafka {region}", lambda p=port: port_open(p), 90)
            wait_for(f"kafka {region} metadata",
                     lambda b=r["kafka"]: kafka_topics(b) is not None, 90)
            create_topics(r["kafka"])
        wait_for("s3", lambda: s3_healthy(s3["endpoint"]), 30)
        cluster["postgres"] = start_postgres()
        write_cluster(cluster)
        cluster["mirrormaker2"]["pid"] = start_mm2(regions)
        write_cluster(cluster)
        wait_for("mirrormaker 2 remote topics", lambda: mirrored_topics_present(regions), 120)
        # NODES=N: the further nodes known before any node starts, so that each region's
        # entry addresses (`lease.member.api`) list all of its nodes
        for r in cluster["regions"].values():
            for index in range(1, nodes_per_region()):
                further_nodes(r)[str(index)] = {"pid": None}
        start_lease_group(cluster)
        start_services(cluster)
        start_prometheus(cluster)
        write_cluster(cluster)
    except BaseException:
        log("start failed; stopping what was started")
        cmd_down(_args)
        raise
    log(f"up in {time.monotonic() - started:.1f}s; endpoints in {CLUSTER_JSON}")
    print(json.dumps(cluster, indent=2))


def nodes_per_region() -> int:
    """NODES=N (`make up NODES=3`): how many nodes each region of a new cluster runs."""
    try:
        n = int(os.environ.get("NODES", "1"))
    except ValueError:
        die(f"NODES={os.environ['NODES']!r} is not a number")
    if n < 1:
        die("NODES must be at least 1")
    return n


def cmd_down(_args: argparse.Namespace) -> None:
    # stop every pid we ever recorded, clients first (mirrormaker), then brokers, then s3
    names = sorted(p.name for p in PIDS.glob("*")) if PIDS.exists() else []
    order = sorted(names, key=lambda n: (0 if n.startswith(("node", *REGION_SERVICES)) or n == "witness" else
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
    SECURITY_FILE.unlink(missing_ok=True)
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
        for i, n in further_nodes(r).items():
            ok = h[f"node {region}/{i}"] and node_ready(n["grpc"])
            h[f"node {region}/{i}"] = ok
            name = f"{region}/{i}"
            print(f"node {name:<11} {'healthy' if ok else 'DOWN':<8} {n['grpc'] or '-':<22} "
                  f"pid {n['pid']}  metrics {n['metrics']}  data {n['data_dir']}")
    if "witness" in cluster:
        w = cluster["witness"]
        print(f"witness          {'healthy' if h['witness'] else 'DOWN':<8} {w['lease']:<22} "
              f"pid {w['pid']}  (lease group member, no region)")
    s3 = cluster["s3"]
    print(f"s3               {'healthy' if h['s3'] else 'DOWN':<8} {s3['endpoint']:<22} "
          f"pid {s3['pid']}  bucket {s3['bucket']}")
    if "port" in cluster.get("postgres", {}):
        pg = cluster["postgres"]
        print(f"postgres         {'healthy' if h['postgres'] else 'DOWN':<8} "
              f"{'127.0.0.1:' + str(pg['port']):<22} pid {pg['pid']}  {pg['url']}")
    for region, r in cluster["regions"].items():
        kind = r.get("function", {}).get("kind")
        for service, to in (("sink", "-> postgres"), ("function", f"{kind} surge"),
                            ("pricer", f"-> {r['grpc']}")):
            if service in r:
                name = f"{service} {region}"
                print(f"{name:<16} {'running' if h[name] else 'DOWN':<8} "
                      f"{to:<22} pid {r[service]['pid']}")
    if "prometheus" in cluster:
        p = cluster["prometheus"]
        print(f"prometheus       {'healthy' if h['prometheus'] else 'DOWN':<8} {p['url']:<22} "
              f"pid {p['pid']}  rules {RULES.relative_to(REPO)}")
    print(f"cluster.json     {CLUSTER_JSON}")
    print(f"logs             {LOGS}")
    if not all(h.values()):
        sys.exit(1)


def cmd_top(_args: argparse.Namespace) -> None:
    """`geostate top` on every region of the cluster (its first node each; the further
    ones are found through them)."""
    cluster = read_cluster()
    if cluster is None:
        die("cluster: down (no cluster.json)")
    argv = [str(geostate_bin()), "top"]
    for i, r in enumerate(cluster["regions"].values()):
        argv += ["--addr" if i == 0 else "--peer", f"http://{r['grpc']}"]
    os.execv(argv[0], argv)


def start_lease_group(cluster: dict) -> None:
    """(Re)start the witness (if the cluster has one) and every node, then wait until the
    nodes serve."""
    assign_grpc_addresses(cluster)
    if "witness" in cluster:
        start_witness(cluster)
        write_cluster(cluster)
    for region, r in cluster["regions"].items():
        start_node(region, r, cluster["s3"], cluster)
        write_cluster(cluster)
        for i in further_nodes(r):
            start_further_node(region, i, cluster)
            write_cluster(cluster)
    for region, r in cluster["regions"].items():
        wait_node(region, r)
        for i, n in further_nodes(r).items():
            wait_node(f"{region}/{i}", n)
    write_cluster(cluster)


def start_services(cluster: dict) -> None:
    for region in cluster["regions"]:
        for start in REGION_SERVICES.values():
            start(region, cluster)
    write_cluster(cluster)


def cmd_restart_nodes(_args: argparse.Namespace) -> None:
    """Restart the witness (if any) and every node with freshly generated settings (data kept): how
    new lease settings (GEOSTATE_SET) take effect."""
    cluster = read_cluster()
    if cluster is None:
        sys.exit("cluster: down (no cluster.json)")
    for region, r in cluster["regions"].items():
        if r.get("pid") and pid_alive(r["pid"]):
            stop_pid(f"node-{region}", r["pid"])
        for i, n in further_nodes(r).items():
            if n.get("pid") and pid_alive(n["pid"]):
                stop_pid(f"node-{region}-{i}", n["pid"])
    start_lease_group(cluster)
    log(f"restarted the lease group ({os.environ.get('GEOSTATE_SET') or 'template settings'})")


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


def cmd_region(args: argparse.Namespace) -> None:
    """Add a region to the running cluster, or remove one. The lease group changes its
    regions through its own log (a membership change every member applies at the same
    entry); the mirrors and the other regions' remotes follow by restarts.

    - `add REGION`: its Kafka (with the topics), MirrorMaker 2 restarted with every pair,
      its node started with `lease.join` (the leader adds its member as a learner, then
      a voter; the node reads the other regions' deltas from their start), its services;
      then each other region's nodes restarted one at a time to merge it as a remote;
    - `remove REGION`: `geostate remove-region` through another region's configuration
      (its leases lapse and the others take its shards at a higher epoch), then its
      processes stopped and forgotten, MirrorMaker 2 and the other nodes restarted
      without it."""
    cluster = read_cluster()
    if cluster is None:
        die(f"no cluster at {CLUSTER_JSON}; run `up` first")
    region, regions = args.region, cluster["regions"]
    if cluster.get("security"):
        die("a secure cluster's certificates are made at `up`: add or remove regions on a "
            "plaintext one")
    # the members' ids as they run now, recorded: a cluster.json from before ids were
    # recorded numbers them by sorted name, which a new name would change
    ids = member_ids(cluster)
    for name, member_id in ids.items():
        (cluster["witness"] if name == "witness" else regions[name])["member_id"] = member_id
    if args.action == "add":
        if region in regions:
            die(f"{region} is a region of the cluster already")
        kafka = start_kafka(region, None)
        regions[region] = {
            "member_id": max(ids.values()) + 1, "joined": True,
            "kafka": kafka["kafka"], "kafka_pid": kafka["kafka_pid"],
            "grpc": f"127.0.0.1:{free_port()}", "metrics": None,
            "data_dir": str(RUN / "nodes" / region), "lease": f"127.0.0.1:{free_port()}",
            "pid": None, "kafka_client": {}}
        write_cluster(cluster)
        wait_for(f"kafka {region} metadata", lambda: kafka_topics(kafka["kafka"]) is not None, 90)
        create_topics(kafka["kafka"])
        restart_mirrors(cluster)
        r = regions[region]
        start_node(region, r, cluster["s3"], cluster)
        write_cluster(cluster)
        wait_node(region, r)
        for start in REGION_SERVICES.values():
            start(region, cluster)
        write_cluster(cluster)
        restart_other_nodes(cluster, region)
        log(f"region {region}: added (lease member {r['member_id']})")
    else:
        if region not in regions:
            die(f"no region {region!r} (regions: {', '.join(regions)})")
        if len(regions) <= 2:
            die("a cluster keeps at least two regions")
        other = regions[next(o for o in sorted(regions) if o != region)]
        out = subprocess.run([str(geostate_bin()), "remove-region", region, "--config",
                              other["config"]] + set_args(other["set"]),
                             capture_output=True, text=True)
        if out.returncode != 0:
            die(f"remove-region {region}: {out.stderr.strip()}")
        log(out.stdout.strip())
        r = regions.pop(region)
        stopped = [(f"node-{region}-{i}", n.get("pid")) for i, n in further_nodes(r).items()]
        stopped += [(f"{service}-{region}", r.get(service, {}).get("pid"))
                    for service in REGION_SERVICES]
        stopped += [(f"node-{region}", r.get("pid")), (f"kafka-{region}", r["kafka_pid"])]
        for name, pid in stopped:
            if pid:
                stop_pid(name, pid)
            # `down` stops every pid file's process: none left to a reused pid
            (PIDS / name).unlink(missing_ok=True)
        write_cluster(cluster)
        restart_mirrors(cluster)
        restart_other_nodes(cluster, region)
        log(f"region {region}: removed")


def restart_mirrors(cluster: dict) -> None:
    """MirrorMaker 2 again, with every pair of the cluster's regions now."""
    if cluster["mirrormaker2"].get("pid"):
        stop_pid("mirrormaker2", cluster["mirrormaker2"]["pid"])
    cluster["mirrormaker2"]["pid"] = start_mm2(cluster["regions"])
    write_cluster(cluster)
    wait_for("mirrormaker 2 remote topics",
             lambda: mirrored_topics_present(cluster["regions"]), 120)


def restart_other_nodes(cluster: dict, changed: str) -> None:
    """Every node of the regions other than `changed`, one at a time (its partitions move
    to the region's other nodes meanwhile, if it has any): their settings now name the
    cluster's regions as they are (remotes, the lease group's members)."""
    for region, r in cluster["regions"].items():
        if region == changed:
            continue
        start_node(region, r, cluster["s3"], cluster)
        write_cluster(cluster)
        wait_node(region, r)
        for i, n in further_nodes(r).items():
            start_further_node(region, i, cluster)
            write_cluster(cluster)
            wait_node(f"{region}/{i}", n)


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


def cmd_node(args: argparse.Namespace) -> None:
    """One node of a region, named `REGION` or `REGION/i` (`REGION/0` is its first node,
    the one carrying the region's lease group member; `make up NODES=N` starts 1..N-1):

    - `restart` (data kept), optionally with its wall clock set off by `--clock-offset` ms
      (the node's `clock-offset`: every wall-clock reading of the node is shifted, its
      monotonic clock is not); a later plain `node restart` puts the clock right again;
    - `add REGION`: a new node of the region (the next index, its own data dir and ports);
      the region's Kafka group gives it a share of the partitions;
    - `remove REGION/i`: stops it (SIGTERM: it hands its partitions off) and forgets it;
    - `kill REGION[/i]`: SIGKILL, nothing handed off (its partitions move after the
      group's session timeout); `up` starts it again."""
    cluster = read_cluster()
    if cluster is None:
        die(f"no cluster at {CLUSTER_JSON}; run `up` first")
    region, _, index = args.node.partition("/")
    if region not in cluster["regions"]:
        die(f"no region {region!r} (regions: {', '.join(cluster['regions'])})")
    r = cluster["regions"][region]
    nodes = further_nodes(r)
    if index not in ("", "0") and index not in nodes:
        die(f"no node {args.node!r} (nodes: {', '.join([region] + [f'{region}/{i}' for i in nodes])})")
    first = index in ("", "0")
    if args.action == "add":
        if index:
            die("`node add` takes a region: the new node gets the next index")
        index = add_node(region, cluster)
        write_cluster(cluster)
        wait_node(f"{region}/{index}", nodes[index])
        log(f"node {region}/{index}: added")
    elif args.action == "remove":
        if first:
            die("the first node of a region carries its lease group member; remove REGION/i, i ≥ 1")
        n = nodes.pop(index)
        if n.get("pid"):
            stop_pid(f"node-{region}-{index}", n["pid"])
            (PIDS / f"node-{region}-{index}").unlink(missing_ok=True)
        write_cluster(cluster)
        log(f"node {region}/{index}: removed (its data dir {n.get('data_dir')} is kept)")
    elif args.action == "kill":
        pid = r.get("pid") if first else nodes[index].get("pid")
        if pid and pid_alive(pid):
            os.killpg(pid, signal.SIGKILL)
            while pid_alive(pid):
                time.sleep(0.05)
        log(f"node {args.node}: killed")
    elif first:
        start_node(region, r, cluster["s3"], cluster, args.clock_offset)
        write_cluster(cluster)
        wait_node(region, r)
        log(f"node {region}: restarted, clock offset {args.clock_offset} ms")
    else:
        if args.clock_offset:
            die("--clock-offset applies to a region's first node only")
        start_further_node(region, index, cluster)
        write_cluster(cluster)
        wait_node(args.node, nodes[index])
        log(f"node {args.node}: restarted")
