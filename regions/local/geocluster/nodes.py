"""The geostate nodes and the witness: the repository's region files run with this cluster's addresses, S3 target and lease group as `--set` overrides."""

from __future__ import annotations

from .common import *  # noqa: F401,F403
from .procs import *  # noqa: F401,F403


def release() -> bool:
    """GEOSTATE_PROFILE=release runs the nodes from an optimised build (benchmarks)."""
    return os.environ.get("GEOSTATE_PROFILE", "debug") == "release"


def geostate_bin() -> Path:
    target = Path(os.environ.get("CARGO_TARGET_DIR", CACHE / "target"))
    return target / ("release" if release() else "debug") / "geostate"


def binary_stamp() -> int:
    """The geostate binary's modification time (ns; 0 if missing): recorded for every
    process started from it, so `up` after a rebuild knows which run an older one."""
    try:
        return geostate_bin().stat().st_mtime_ns
    except FileNotFoundError:
        return 0


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


def member_ids(cluster: dict) -> dict[str, int]:
    """Each lease group member's id by region (and `witness`): as recorded in cluster.json
    (`up` numbers the regions by name and the witness last; a region added later takes
    the next free id), so ids never change while the group runs."""
    regions = sorted(cluster["regions"])
    ids = {region: cluster["regions"][region].get("member_id") or i
           for i, region in enumerate(regions, start=1)}
    if "witness" in cluster:
        ids["witness"] = cluster["witness"].get("member_id") or len(regions) + 1
    return ids


def lease_settings(member_id: int, listen: str, cluster: dict) -> list[str]:
    """This cluster's lease group in place of the template's: this member's id and
    address, and every member (regions by name, then the witness if there is one)."""
    ids = member_ids(cluster)
    members = [{"id": ids[region], "addr": r["lease"], "region": region,
                "api": entry_addresses(r)}
               for region, r in sorted(cluster["regions"].items())]
    if "witness" in cluster:
        members.append({"id": ids["witness"], "addr": cluster["witness"]["lease"]})
    return [f"lease.member-id={member_id}", f"lease.listen={toml(listen)}",
            f"lease.member={toml(members)}"]


def entry_addresses(r: dict) -> list[str]:
    """A region's entry addresses (`lease.member.api`): each of its nodes' gRPC address,
    the first node's first. A node added later is not listed until the others restart;
    any listed node routes a request to the node owning its key."""
    return [r["grpc"]] + [n["grpc"] for n in further_nodes(r).values() if n.get("grpc")]


def assign_grpc_addresses(cluster: dict) -> None:
    """Every node's gRPC address, chosen before any node starts, so that each lists all
    of every region's nodes."""
    for r in cluster["regions"].values():
        for n in [r, *further_nodes(r).values()]:
            n["grpc"] = n.get("grpc") or f"127.0.0.1:{free_port()}"


def tls_settings(name: str, cluster: dict) -> list[str]:
    """A secure cluster's (`make up SECURE=1`) `[tls]` for the process named `name` (its
    region, or `witness`): the lease group runs on TLS with members' certificates."""
    security = cluster.get("security")
    if not security:
        return []
    certs = Path(security["certs"])
    tls = {"cert": str(certs / f"{name}.pem"), "key": str(certs / f"{name}.key"),
           "ca": security["ca"]}
    return [f"tls={toml(tls)}"]


def witness_settings(cluster: dict) -> list[str]:
    w = cluster["witness"]
    return ([f"data-dir={toml(w['data_dir'])}"]
            + lease_settings(member_ids(cluster)["witness"], w["lease"], cluster)
            + tls_settings("witness", cluster)
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
    w["binary_mtime_ns"] = binary_stamp()
    log(f"witness: pid {w['pid']}, raft {w['lease']}")


def set_args(settings: list[str]) -> list[str]:
    return [arg for setting in settings for arg in ("--set", setting)]


def node_settings(region: str, r: dict, s3: dict, cluster: dict,
                  clock_offset_ms: int = 0, node: dict | None = None,
                  learner: int = 0) -> list[str]:
    """What a node of `region` runs with on top of regions/<region>.toml: this cluster's
    addresses, checkpoints to the cluster's S3 server (restored from when the data dir is
    empty), and the cluster's lease group; with `clock_offset_ms`, its wall clock shifted
    by that much (`clock-offset`). `node`: one of the region's further nodes (its own data
    dir and ports), a learner of the lease group (number `learner`): the region's member
    runs on its first node."""
    bucket = {"bucket": s3["bucket"], "prefix": f"{region}/", "endpoint": s3["endpoint"],
              "region": s3["region"], "path-style": True, "access-key": s3["access_key"],
              "secret-key": s3["secret_key"]}
    own = node or r
    settings = [f"data-dir={toml(own['data_dir'])}", f"kafka.bootstrap={toml(r['kafka'])}",
                f"api.grpc-listen={toml(own['grpc'])}",
                f"api.metrics-listen={toml(own['metrics'])}",
                "checkpoint.restore-on-empty=true", "checkpoint.local-dir=",
                f"checkpoint.s3={toml(bucket)}"]
    # the other regions, whose deltas this one merges from its own Kafka (the mirrors)
    remotes = [{"region": other} for other in sorted(cluster["regions"]) if other != region]
    settings.append(f"replication.remote={toml(remotes)}")
    if not (REPO / "regions" / f"{region}.toml").exists():
        settings.append(f"region={toml(region)}")
    settings += lease_settings(member_ids(cluster)[region], own["lease"], cluster)
    if learner:
        settings.append(f"lease.learner={learner}")
    elif r.get("joined"):
        # added at runtime (`region add`): its member joins the running group
        settings.append("lease.join=true")
    if clock_offset_ms:
        sign = "-" if clock_offset_ms < 0 else ""
        settings.append(f"clock-offset={sign}{abs(clock_offset_ms)}ms")
    security = cluster.get("security")
    if security:
        # Kafka on SASL_SSL, the lease group on TLS; the API stays plaintext on loopback
        from .kafka import node_security
        settings += [f"kafka.security={toml(node_security(security))}", "api.plaintext=true"]
        settings += tls_settings(region, cluster)
    return settings + extra_settings()


def region_file(region: str) -> Path:
    """The region's own file under regions/, or the template region's (run with the region's
    name set: `node_settings`)."""
    own = REPO / "regions" / f"{region}.toml"
    return own if own.exists() else REPO / "regions" / f"{TEMPLATE_REGION}.toml"


def node_ready(grpc: str) -> bool:
    """Whether the node answers `status`. Its gRPC socket is bound before it serves (a
    learner first waits up to 30 s for its lease table), so a call may hang: one that does
    not answer within 5 s counts as not ready yet, and the caller asks again."""
    try:
        out = subprocess.run([str(geostate_bin()), "status", "--addr", f"http://{grpc}"],
                             capture_output=True, timeout=5)
    except subprocess.TimeoutExpired:
        return False
    return out.returncode == 0


def start_node(region: str, r: dict, s3: dict, cluster: dict,
               clock_offset_ms: int = 0) -> None:
    """Starts (or restarts) the node of `region`, keeping its data dir and ports."""
    if r.get("pid") and pid_alive(r["pid"]):
        stop_pid(f"node-{region}", r["pid"])
    r["grpc"] = r.get("grpc") or f"127.0.0.1:{free_port()}"
    r["metrics"] = r.get("metrics") or f"127.0.0.1:{free_port()}"
    r["config"] = str(region_file(region))
    r["set"] = node_settings(region, r, s3, cluster, clock_offset_ms)
    r["pid"] = spawn(f"node-{region}", [str(geostate_bin()), "run", "--config", r["config"]]
                     + set_args(r["set"]),
                     env={"RUST_LOG": os.environ.get("RUST_LOG", "info,openraft=warn")})
    r["binary_mtime_ns"] = binary_stamp()
    log(f"node {region}: pid {r['pid']}, grpc {r['grpc']}, metrics {r['metrics']}")


def wait_node(region: str, r: dict) -> None:
    wait_for(f"node {region}", lambda: pid_alive(r["pid"]) and node_ready(r["grpc"]), 60)


def further_nodes(r: dict) -> dict[str, dict]:
    """A region's nodes after its first, by index ("1", "2", …)."""
    return r.setdefault("nodes", {})


def start_further_node(region: str, index: str, cluster: dict) -> None:
    """Starts (or restarts) node `index` of `region`, keeping its data dir and ports."""
    r = cluster["regions"][region]
    n = further_nodes(r)[index]
    name = f"node-{region}-{index}"
    if n.get("pid") and pid_alive(n["pid"]):
        stop_pid(name, n["pid"])
    n["grpc"] = n.get("grpc") or f"127.0.0.1:{free_port()}"
    n["metrics"] = n.get("metrics") or f"127.0.0.1:{free_port()}"
    n["lease"] = n.get("lease") or f"127.0.0.1:{free_port()}"
    n["data_dir"] = n.get("data_dir") or str(RUN / "nodes" / f"{region}-{index}")
    n["config"] = str(region_file(region))
    n["set"] = node_settings(region, r, cluster["s3"], cluster, node=n, learner=int(index))
    n["pid"] = spawn(name, [str(geostate_bin()), "run", "--config", n["config"]]
                     + set_args(n["set"]),
                     env={"RUST_LOG": os.environ.get("RUST_LOG", "info,openraft=warn")})
    n["binary_mtime_ns"] = binary_stamp()
    log(f"node {region}/{index}: pid {n['pid']}, grpc {n['grpc']}, metrics {n['metrics']}")


def add_node(region: str, cluster: dict) -> str:
    """A new node of `region` (the next free index), started; answers its index."""
    nodes = further_nodes(cluster["regions"][region])
    index = str(max((int(i) for i in nodes), default=0) + 1)
    nodes[index] = {"pid": None}
    start_further_node(region, index, cluster)
    return index
