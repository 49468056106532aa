#!/usr/bin/env python3
"""The surge multiplier as a geostate user function, served as a gRPC sidecar.

    python surge_function.py --listen unix:///tmp/surge.sock

and in the region file:

    [pricing]
    function = "unix:///tmp/surge.sock"

It gives the same values as the built-in formula (clients/conformance/surge.json):
multiplier = clamp(1 + slope * (demand / max(supply, 1) - threshold), 1, max), rounded
half away from zero to the nearest step, in hundredths.
"""

import math

from geostate_client.function import function, main


def round_half_away(x: float) -> float:
    """Rust's f64::round for x >= 0 (Python's round() rounds half to even). x - floor(x)
    is exact, so ties are found exactly."""
    whole = math.floor(x)
    return whole + 1 if x - whole >= 0.5 else whole


def hundredths(params, demand: int, supply: int) -> int:
    threshold, slope, top, step = (params["threshold"], params["slope"], params["max"],
                                   params["step"])
    ratio = demand / max(supply, 1)
    raw = min(max(1.0 + slope * (ratio - threshold), 1.0), top)
    stepped = round_half_away(raw / step) * step
    return int(round_half_away(min(max(stepped, 1.0), top) * 100.0))


@function("surge", version="1")
def surge(params, inputs):
    """One multiplier per final window of a geohash, from its demand and supply."""
    return [hundredths(params, i.values.get("demand", 0), i.values.get("supply", 0))
            for i in inputs]


if __name__ == "__main__":
    main(surge)
