#!/usr/bin/env python3
"""Local multi-region infrastructure for geostate: one KRaft Kafka cluster per region,
MirrorMaker 2 (dedicated mode) mirroring every region's `geostate.deltas` into every other
region as `<region>.geostate.deltas`, and an S3-compatible server with a checkpoint bucket.

    python3 regions/local/cluster.py install   # system packages, Kafka jars, S3 server (once)
    python3 regions/local/cluster.py up        # start everything, write run/cluster.json
    python3 regions/local/cluster.py status    # health of every process (exit 1 if any is down)
    python3 regions/local/cluster.py down      # stop everything, leave no process behind

Everything comes from package registries: Debian packages with apt, Apache Kafka and
MirrorMaker 2 jars from Maven Central with Maven, the S3 server (s3s-fs) from crates.io.
Downloads and builds go to a cache outside the repository ($GEOSTATE_CACHE, default
~/.cache/geostate); run state, data and logs go to regions/local/run/ ($GEOSTATE_RUN_DIR).

Only the standard library is used, so this runs before anything else is installed.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from geocluster.common import *  # noqa: E402,F401,F403  (bench/peers/peers.py reads these)
from geocluster.cli import main  # noqa: E402

if __name__ == "__main__":
    main(__doc__.split("\n\n")[0])
