#!/usr/bin/env python3
"""A surge sidecar that misbehaves on purpose, for geostate's failure-handling tests
(tests/functions.rs): `--mode slow` answers after 10 s, `garbage` answers multipliers
below 1 (out of range), `raise` fails every batch with INTERNAL.

    python faulty_function.py --listen unix:///tmp/faulty.sock --mode slow
"""

import argparse
import time

from geostate_client.function import function, serve


def faulty(mode):
    @function("surge", version=f"faulty-{mode}")
    def compute(params, inputs):
        if mode == "slow":
            time.sleep(10)
            return [100 for _ in inputs]
        if mode == "garbage":
            return [-1 for _ in inputs]
        raise RuntimeError("this sidecar fails every batch")

    return compute


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", required=True)
    parser.add_argument("--mode", choices=["slow", "garbage", "raise"], required=True)
    args = parser.parse_args()
    server = serve(faulty(args.mode), args.listen)
    print(f"faulty ({args.mode}) serving on {args.listen}", flush=True)
    server.wait_for_termination()
