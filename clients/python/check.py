#!/usr/bin/env python3
"""Checks the Python client (what `make test` runs, through tests/clients.rs):

1. a virtualenv with grpcio and grpcio-tools (pinned), made once under
   ~/.cache/geostate/clients-venv;
2. the package installs into it (`pip install clients/python`);
3. its stubs match proto/ (`generate.py --check`);
4. its tests pass against the cluster GEOSTATE_CLUSTER names.

`check.py --install` does 1 and 2 only and prints the virtualenv's python (what
tests/functions.rs runs the function sidecars with).
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENV = Path.home() / ".cache" / "geostate" / "clients-venv"
PINNED = ["grpcio==1.85.1", "grpcio-tools==1.85.1"]


def run(*args: str) -> None:
    print("+", " ".join(args), file=sys.stderr, flush=True)
    subprocess.run(args, check=True)


def main() -> None:
    python = VENV / "bin" / "python"
    marker = VENV / ("pinned-" + "-".join(PINNED).replace("=", ""))
    if not marker.exists():
        run(sys.executable, "-m", "venv", "--clear", str(VENV))
        run(str(python), "-m", "pip", "install", "--quiet", *PINNED)
        marker.touch()
    # from a copy: a build in place leaves build/ and *.egg-info in the source tree
    with tempfile.TemporaryDirectory() as copy:
        shutil.copytree(HERE, copy, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
        run(str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall", copy)
    if sys.argv[1:] == ["--install"]:
        print(python)
        return
    run(str(python), str(HERE / "generate.py"), "--check")
    # the installed package, not the source tree: run from the tests' folder
    os.chdir(HERE / "tests")
    run(str(python), "-m", "unittest", "-v", "test_client", "test_function")


if __name__ == "__main__":
    try:
        main()
    except subprocess.CalledProcessError as e:
        sys.exit(e.returncode or 1)
