#!/usr/bin/env python3
"""A pricing service's use of geostate, to copy: record ride requests and driver pings per
geohash (windowed counters, event time = now), and quote a ride from the surge multiplier
the region's pricer wrote (`prices/<geohash>`, JSON), falling back to 1.0 while none is
written yet. Prints each quote with how fresh this region's view of the other regions is.

    python examples/pricing_service.py 127.0.0.1:7001 9q8yy
"""

import json
import sys
import time

from geostate_client import Client


def quote(geo: Client, geohash: str) -> tuple:
    """(multiplier, the window it was computed from or None, lag of the slowest region)."""
    price = geo.get(f"prices/{geohash}")
    lag = 0 if price is None else price.freshness.lag_ms
    if price is None or price.register is None:
        return 1.0, None, lag
    result = json.loads(price.register)
    return float(result["value"]), (result["start_ms"], result["end_ms"]), lag


def main(argv: list, rounds: int = 5) -> None:
    target = argv[0] if argv else "127.0.0.1:7001"
    geohash = argv[1] if len(argv) > 1 else "9q8yy"
    with Client(target) as geo:
        for i in range(rounds):
            now = int(time.time() * 1000)
            geo.add(f"requests/{geohash}", 1, event_time_ms=now)  # a rider asks
            geo.add(f"supply/{geohash}", 1, event_time_ms=now)  # a driver pings
            multiplier, window, lag = quote(geo, geohash)
            print(f"{geohash}: x{multiplier:.2f} (window {window}, other regions {lag} ms behind)")
            if i + 1 < rounds:
                time.sleep(1)


if __name__ == "__main__":
    main(sys.argv[1:])
