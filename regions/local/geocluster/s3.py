"""The S3-compatible server (s3s-fs) and its checkpoint bucket."""

from __future__ import annotations

from .common import *  # noqa: F401,F403
from .procs import *  # noqa: F401,F403


def s3_healthy(endpoint: str) -> bool:
    try:
        urllib.request.urlopen(endpoint + "/", timeout=1)
        return True
    except urllib.error.HTTPError:
        return True  # any S3 answer (403 for an unsigned request) means it serves
    except OSError:
        return False


def spawn_s3(port: int) -> int:
    """The server on `port`, serving the run folder's `s3/` (kept across restarts)."""
    data = RUN / "s3"
    (data / S3_BUCKET).mkdir(parents=True, exist_ok=True)  # s3s-fs: a bucket is a folder
    return spawn("s3", [str(S3S_FS), "--host", "127.0.0.1", "--port", str(port),
                        "--access-key", S3_ACCESS_KEY, "--secret-key", S3_SECRET_KEY,
                        str(data)])


def start_s3() -> dict:
    port = free_port()
    data = RUN / "s3"
    pid = spawn_s3(port)
    endpoint = f"http://127.0.0.1:{port}"
    log(f"s3 (s3s-fs): pid {pid}, {endpoint}")
    return {"endpoint": endpoint, "bucket": S3_BUCKET, "access_key": S3_ACCESS_KEY,
            "secret_key": S3_SECRET_KEY, "region": "us-east-1", "pid": pid,
            "data_dir": str(data)}


def restart_s3(cluster: dict) -> None:
    """Starts the server again on its port and folder (after `s3 kill`)."""
    s3 = cluster["s3"]
    s3["pid"] = spawn_s3(int(s3["endpoint"].rsplit(":", 1)[1]))
    write_cluster(cluster)
    wait_for("s3", lambda: s3_healthy(s3["endpoint"]), 30)
    log(f"s3: restarted, pid {s3['pid']}")


def cmd_s3(args: argparse.Namespace) -> None:
    """Kill the S3 server (SIGKILL) or start it again on the same port and folder: the
    checkpoint store's outage, for drills."""
    cluster = read_cluster()
    if cluster is None:
        sys.exit("cluster: down (no cluster.json)")
    s3 = cluster["s3"]
    if args.action == "kill":
        if pid_alive(s3["pid"]):
            os.killpg(s3["pid"], signal.SIGKILL)
            while pid_alive(s3["pid"]):
                time.sleep(0.05)
        log("s3 killed")
        return
    if pid_alive(s3["pid"]) and s3_healthy(s3["endpoint"]):
        log(f"s3 already running (pid {s3['pid']})")
        return
    restart_s3(cluster)
