"""The function SDK, served for real on a Unix socket and on loopback TCP: the surge
example passes the conformance suite (clients/conformance/surge.json) over gRPC, a batch
for another function is refused, and a function that raises fails its batch only."""

import importlib.util
import json
import socket
import tempfile
import unittest
from pathlib import Path

import grpc

from geostate.v1 import function_pb2, function_pb2_grpc
from geostate_client.function import function, serve

CLIENTS = Path(__file__).resolve().parents[2]
SUITE = json.loads((CLIENTS / "conformance" / "surge.json").read_text())


def load_example():
    spec = importlib.util.spec_from_file_location(
        "surge_function", CLIENTS / "python" / "examples" / "surge_function.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def request(case, name="surge"):
    return function_pb2.ComputeRequest(
        function=name, params=case["params"],
        inputs=[function_pb2.FunctionInput(**i) for i in case["inputs"]])


class FunctionTest(unittest.TestCase):
    def test_the_surge_example_passes_the_conformance_suite_over_unix_and_tcp(self):
        surge = load_example().surge
        with tempfile.TemporaryDirectory() as tmp:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            for address in (f"unix://{tmp}/surge.sock", f"127.0.0.1:{port}"):
                server = serve(surge, address)
                try:
                    with grpc.insecure_channel(address) as channel:
                        stub = function_pb2_grpc.FunctionStub(channel)
                        described = stub.Describe(function_pb2.DescribeRequest(), timeout=5)
                        self.assertEqual((described.name, described.runtime), ("surge", "python"))
                        for case in SUITE["cases"]:
                            got = stub.Compute(request(case), timeout=5)
                            self.assertEqual([r.value for r in got.results], case["expected"],
                                             case["params"])
                finally:
                    server.stop(None)

    def test_a_batch_for_another_function_is_refused_and_a_raise_fails_only_its_batch(self):
        @function("surge")
        def flaky(params, inputs):
            if any(i.values.get("demand") == 13 for i in inputs):
                raise ValueError("unlucky demand")
            return [100 for _ in inputs]

        with tempfile.TemporaryDirectory() as tmp:
            address = f"unix://{tmp}/flaky.sock"
            server = serve(flaky, address)
            try:
                with grpc.insecure_channel(address) as channel:
                    stub = function_pb2_grpc.FunctionStub(channel)
                    case = SUITE["cases"][0]
                    with self.assertRaises(grpc.RpcError) as refused:
                        stub.Compute(request(case, name="other"), timeout=5)
                    self.assertEqual(refused.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
                    with self.assertRaises(grpc.RpcError) as raised:
                        stub.Compute(request(case), timeout=5)
                    self.assertEqual(raised.exception.code(), grpc.StatusCode.INTERNAL)
                    self.assertIn("unlucky demand", raised.exception.details())
                    calm = dict(case, inputs=[i for i in case["inputs"]
                                              if i["values"]["demand"] != 13])
                    got = stub.Compute(request(calm), timeout=5)
                    self.assertEqual([r.value for r in got.results], [100] * len(calm["inputs"]))
            finally:
                server.stop(None)


if __name__ == "__main__":
    unittest.main()
