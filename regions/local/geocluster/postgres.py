"""PostgreSQL (Debian's package) for the outputs table, and the processes beside each region's nodes: a `geostate sink postgres` writing its outputs topic into the table, and a `geostate pricer`."""

from __future__ import annotations

import json
import pwd
import sys

from .common import *  # noqa: F401,F403
from .procs import *  # noqa: F401,F403
from .nodes import geostate_bin, set_args

PG_USER = "geostate"
PG_DB = "geostate"


def pg_bin(tool: str) -> Path:
    """`tool` of the newest PostgreSQL server installed (/usr/lib/postgresql/<major>/bin)."""
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{tool}"),
                   key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0)
    if not found:
        die("no PostgreSQL server: `cluster.py install` installs Debian's postgresql")
    return found[-1]


def as_postgres(argv: list[str]) -> list[str]:
    """The server refuses to run as root: as root, run it as Debian's `postgres` user."""
    if os.geteuid() != 0:
        return argv
    return ["runuser", "-u", "postgres", "--", *argv]


def pg_url(port: int) -> str:
    return f"host=127.0.0.1 port={port} user={PG_USER} dbname={PG_DB}"


def pg_ready(port: int) -> bool:
    out = subprocess.run([str(pg_bin("pg_isready")), "-q", "-h", "127.0.0.1", "-p", str(port)],
                         capture_output=True)
    return out.returncode == 0


def spawn_postgres(pg: dict) -> int:
    """The server on `pg`'s data dir and port (fsync on: a kill is a real crash)."""
    return spawn("postgres", as_postgres([
        str(pg_bin("postgres")), "-D", pg["data_dir"], "-p", str(pg["port"]),
        "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={pg['data_dir']}",
        "-c", "max_connections=200", "-c", "log_min_messages=warning"]))


def pg_data_dir() -> Path:
    """Where the server keeps its data: under the system's temporary folder, which the
    `postgres` user can reach wherever the run folder is (a clone under /root is not),
    named after the run folder so that two clusters never share it."""
    tag = hashlib.sha256(str(RUN).encode()).hexdigest()[:10]
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"geostate-postgres-{tag}"


def start_postgres() -> dict:
    data = pg_data_dir()
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(data, user.pw_uid, user.pw_gid)
    subprocess.run(as_postgres([str(pg_bin("initdb")), "-D", str(data), "-U", PG_USER,
                                "--auth=trust", "-E", "UTF8", "--no-instructions"]),
                   check=True, stdout=subprocess.DEVNULL)
    pg = {"port": free_port(), "data_dir": str(data)}
    pg["pid"] = spawn_postgres(pg)
    pg["url"] = pg_url(pg["port"])
    wait_for("postgres", lambda: pg_ready(pg["port"]), 60)
    subprocess.run([str(pg_bin("createdb")), "-h", "127.0.0.1", "-p", str(pg["port"]),
                    "-U", PG_USER, PG_DB], check=True)
    log(f"postgres: pid {pg['pid']}, {pg['url']}")
    return pg


def start_sink(region: str, cluster: dict) -> None:
    """`geostate sink postgres` with the region's node configuration (its Kafka and
    outputs topic)."""
    r = cluster["regions"][region]
    sink = r.setdefault("sink", {})
    sink["pid"] = spawn(f"sink-{region}", [str(geostate_bin()), "sink", "postgres",
                                           "--config", r["config"], *set_args(r["set"]),
                                           "--postgres", cluster["postgres"]["url"]])
    log(f"sink {region} -> postgres: pid {sink['pid']}")


def start_pricer(region: str, cluster: dict) -> None:
    """`geostate pricer` with the region's node configuration, against its first node;
    with the region's surge function sidecar when the cluster runs one (`udf`)."""
    r = cluster["regions"][region]
    pricer = r.setdefault("pricer", {})
    function = r.get("function", {}).get("addr")
    extra = ["--set", f"pricing.function={json.dumps(function)}"] if function else []
    pricer["metrics"] = f"127.0.0.1:{free_port()}"
    pricer["pid"] = spawn(f"pricer-{region}", [str(geostate_bin()), "pricer",
                                               "--config", r["config"], *set_args(r["set"]),
                                               *extra, "--addr", f"http://{r['grpc']}",
                                               "--metrics-listen", pricer["metrics"]])
    log(f"pricer {region} -> {r['grpc']}{f' with {function}' if function else ''}: "
        f"pid {pricer['pid']}")


# the SDK examples serving the surge function (`make demo UDF=python|go`)
UDFS = ("python", "go")


def function_command(kind: str) -> list[str]:
    """How to run the surge sidecar of `kind` (the virtualenv or binary made first)."""
    if kind == "python":
        out = subprocess.run([sys.executable, str(REPO / "clients" / "python" / "check.py"),
                              "--install"], check=True, capture_output=True, text=True)
        return [out.stdout.strip(), str(REPO / "clients" / "python" / "examples" /
                                        "surge_function.py"), "--listen"]
    binary = RUN / "bin" / "surgefunction"
    subprocess.run(["go", "build", "-o", str(binary), "./examples/surgefunction"],
                   cwd=REPO / "clients" / "go", check=True)
    return [str(binary), "-listen"]


def start_function(region: str, cluster: dict) -> None:
    """The region's surge function sidecar on a Unix socket, when the cluster runs one."""
    kind = cluster.get("udf")
    if kind not in UDFS:
        return
    r = cluster["regions"][region]
    sock = RUN / f"surge-{region}.sock"
    function = r.setdefault("function", {})
    function.update(kind=kind, addr=f"unix://{sock}")
    function["pid"] = spawn(f"function-{region}", [*function_command(kind), function["addr"]])
    wait_for(f"function {region}", lambda: sock.exists(), 60)
    log(f"{kind} surge function {region} on {function['addr']}: pid {function['pid']}")


def cmd_udf(args: argparse.Namespace) -> None:
    """Price with the surge function of the Python or Go SDK example, each region's its own
    sidecar, or with the built-in formula again (`builtin`): restarts the pricers."""
    cluster = read_cluster()
    if cluster is None:
        die(f"no cluster at {CLUSTER_JSON}; run `up` first")
    cluster["udf"] = args.kind if args.kind in UDFS else None
    for region, r in cluster["regions"].items():
        for service in ("pricer", "function"):
            if service in r:
                stop_pid(f"{service}-{region}", r[service].get("pid"))
        r.pop("function", None)
        start_function(region, cluster)
        start_pricer(region, cluster)
    write_cluster(cluster)
    log(f"pricing with {'the ' + args.kind + ' surge function' if cluster['udf'] else 'the built-in formula'}")


# the processes that run beside a region's nodes, and how each starts (in this order)
REGION_SERVICES = {"sink": start_sink, "function": start_function, "pricer": start_pricer}


def cmd_postgres(args: argparse.Namespace) -> None:
    """Kill PostgreSQL (SIGKILL: a crash, recovered from its WAL at the next start), start
    it again on the same data dir and port, or restart it (kill, then start)."""
    cluster = read_cluster()
    if cluster is None or "postgres" not in cluster:
        die(f"no cluster with PostgreSQL at {CLUSTER_JSON}; run `up` first")
    pg = cluster["postgres"]
    if args.action in ("kill", "restart") and pid_alive(pg["pid"]):
        os.killpg(pg["pid"], signal.SIGKILL)
        while pid_alive(pg["pid"]):
            time.sleep(0.05)
        # the server's children leave with it; its shared memory goes with the last one
        log("postgres killed")
    if args.action in ("start", "restart"):
        if pid_alive(pg["pid"]) and pg_ready(pg["port"]):
            log(f"postgres already running (pid {pg['pid']})")
            return
        # the killed server's backends leave once they see it gone; until then a new one
        # finds its shared memory in use and exits: start it until it stays
        deadline = time.monotonic() + 60
        while True:
            pg["pid"] = spawn_postgres(pg)
            while pid_alive(pg["pid"]) and not pg_ready(pg["port"]) and time.monotonic() < deadline:
                time.sleep(0.1)
            if pid_alive(pg["pid"]):
                break
            if time.monotonic() > deadline:
                die(f"postgres does not start again (logs in {LOGS})")
            time.sleep(0.5)
        write_cluster(cluster)
        log(f"postgres: started again, pid {pg['pid']}")


def cmd_sink(args: argparse.Namespace) -> None:
    """Kill a region's sink (SIGKILL, wherever it is in its transaction) or start it."""
    cluster = read_cluster()
    if cluster is None:
        die(f"no cluster at {CLUSTER_JSON}; run `up` first")
    if args.region not in cluster["regions"]:
        die(f"no region {args.region!r} (regions: {', '.join(cluster['regions'])})")
    sink = cluster["regions"][args.region].get("sink", {})
    if args.action == "kill":
        if pid_alive(sink.get("pid")):
            os.killpg(sink["pid"], signal.SIGKILL)
            while pid_alive(sink["pid"]):
                time.sleep(0.05)
        log(f"sink {args.region} killed")
    elif pid_alive(sink.get("pid")):
        log(f"sink {args.region} already running (pid {sink['pid']})")
    else:
        start_sink(args.region, cluster)
        write_cluster(cluster)
