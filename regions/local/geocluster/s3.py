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


def start_s3() -> dict:
    port = free_port()
    data = RUN / "s3"
    (data / S3_BUCKET).mkdir(parents=True, exist_ok=True)  # s3s-fs: a bucket is a folder
    pid = spawn("s3", [str(S3S_FS), "--host", "127.0.0.1", "--port", str(port),
                       "--access-key", S3_ACCESS_KEY, "--secret-key", S3_SECRET_KEY,
                       str(data)])
    endpoint = f"http://127.0.0.1:{port}"
    log(f"s3 (s3s-fs): pid {pid}, {endpoint}")
    return {"endpoint": endpoint, "bucket": S3_BUCKET, "access_key": S3_ACCESS_KEY,
            "secret_key": S3_SECRET_KEY, "region": "us-east-1", "pid": pid,
            "data_dir": str(data)}
