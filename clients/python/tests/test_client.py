"""The Python client against the real local cluster (`make test` runs these through
tests/clients.rs): GEOSTATE_CLUSTER names its cluster.json."""

import json
import os
import socket
import sys
import time
import unittest
import uuid
from pathlib import Path

import grpc

from geostate_client import Client, GeostateError, partition_of


def cluster() -> dict:
    with open(os.environ["GEOSTATE_CLUSTER"]) as f:
        return json.load(f)


def node(region: str) -> str:
    return cluster()["regions"][region]["grpc"]


def unique(prefix: str) -> str:
    return f"{prefix}py-{uuid.uuid4().hex[:12]}"


class Partitioning(unittest.TestCase):
    def test_keys_land_where_the_java_producer_puts_them(self):
        # the keys and partitions (of 12) of tests/partitioner.rs, from kafka-clients 4.1.1
        java = {"foobar": 6, "a-little-bit-longer-string": 11, "requests/9q8yy": 1,
                "surge/9q8yy": 5, "drivers/u4pruyd": 4, "zones/é": 9}
        for key, partition in java.items():
            self.assertEqual(partition_of(key, 12), partition, key)


class AgainstTheCluster(unittest.TestCase):
    def setUp(self):
        self.us = Client(node("us-east-1"))
        self.eu = Client(node("eu-west-1"))

    def tearDown(self):
        self.us.close()
        self.eu.close()

    def test_a_counter_counts_an_id_once_and_reaches_the_other_region(self):
        key = unique("drivers/")
        self.us.add(key, 5)
        self.us.add(key, -2, id="the-same-write")
        # a retry of the same write (the client's own retries reuse the id the same way)
        self.us.add(key, -2, id="the-same-write")
        self.assertEqual(self.us.counter(key), 3)
        value = self.us.get(key)
        self.assertEqual(value.kind, "pn_counter")
        deadline = time.monotonic() + 60
        while self.eu.counter(key) != 3:
            self.assertLess(time.monotonic(), deadline, "eu-west-1 never merged the adds")
            time.sleep(0.2)
        remotes = {r.region: r for r in self.eu.freshness(key).remotes}
        self.assertIn("us-east-1", remotes)
        self.assertGreater(remotes["us-east-1"].applied_wall_nanos, 0)

    def test_a_register_reads_back_with_its_stamp_and_an_unset_one_is_none(self):
        key = unique("zones/")
        self.assertIsNone(self.us.get(key))
        self.assertIsNone(self.us.register(key))
        stamp = self.us.set(key, "downtown")
        self.assertEqual(stamp.origin, "us-east-1")
        value = self.us.get(key)
        self.assertEqual(value.register, b"downtown")
        self.assertEqual(value.stamp, stamp)
        self.assertEqual(self.us.batch_get([key])[key].register, b"downtown")
        self.assertEqual([v.key for v in self.us.scan(key)], [key])

    def test_a_refused_write_is_not_retried(self):
        with self.assertRaises(GeostateError) as refused:
            self.us.add(unique("zones/"), 1)  # a register takes no add
        self.assertEqual(refused.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertEqual(refused.exception.attempts, 1)

    def test_an_unreachable_node_is_retried_then_reported(self):
        closed = Client("127.0.0.1:1", retries=2, backoff=0.01, timeout=2, route=False)
        with self.assertRaises(GeostateError) as failed:
            closed.add(unique("drivers/"), 1)
        self.assertEqual(failed.exception.code, grpc.StatusCode.UNAVAILABLE)
        self.assertEqual(failed.exception.attempts, 3)
        closed.close()

    def test_keys_are_routed_to_the_node_serving_their_partition(self):
        key = unique("trips/")
        # seeded under another name of the node than the one it advertises: the route
        # names the advertised address only if Admin/Route was asked
        seed = node("us-east-1").replace("127.0.0.1", "localhost")
        with Client(seed) as geo:
            geo.add(key, 2)
            # one node per region here: the region's node serves every partition
            self.assertEqual(geo.route(key), self.us.status().node)

    def test_a_window_reads_its_events_and_certificate(self):
        key = unique("requests/")
        now = int(time.time() * 1000)
        start = now - now % 60_000
        self.us.add(key, 4, event_time_ms=now)
        value = self.us.get(key, window=start)
        self.assertEqual(value.counter, 4)
        self.assertEqual((value.window.start_ms, value.window.end_ms), (start, start + 60_000))
        self.assertFalse(value.window.is_final)
        windows = self.us.windows(key, start - 60_000, start + 60_000)
        self.assertEqual([w.window.start_ms for w in windows if w.counter], [start])


class TheExample(unittest.TestCase):
    def test_the_pricing_service_example_records_and_quotes(self):
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
        import pricing_service

        geohash = unique("")
        pricing_service.main([node("us-east-1"), geohash], rounds=1)
        with Client(node("us-east-1")) as geo:
            now = int(time.time() * 1000)
            windows = geo.windows(f"requests/{geohash}", now - 120_000, now + 60_000)
            self.assertEqual(sum(w.counter or 0 for w in windows), 1)
            self.assertEqual(pricing_service.quote(geo, geohash)[0], 1.0)  # no price yet


if __name__ == "__main__":
    unittest.main()
