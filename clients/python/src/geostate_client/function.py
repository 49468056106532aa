"""Write a geostate user function in Python and serve it as a gRPC sidecar.

geostate calls a function (`geostate.v1.Function`, proto/geostate/v1/function.proto) with
batches of final windows, one call per batch, never per event; the function answers one
integer per input and touches no state. `geostate pricer` writes each answer with a
compare-and-set from the window before, so a retried batch never publishes twice.

    from geostate_client.function import function, serve

    @function("surge", version="1")
    def surge(params, inputs):
        return [my_formula(params, i.values["demand"], i.values["supply"]) for i in inputs]

    serve(surge, "unix:///run/geostate/surge.sock").wait_for_termination()

A function must be deterministic: the same params and inputs give the same values in
every region and on every retry. An exception answers the batch INTERNAL (geostate
retries it with a backoff); a batch for another function name is refused.
"""

from __future__ import annotations

import argparse
import os
from concurrent import futures
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Sequence

import grpc

from geostate.v1 import function_pb2, function_pb2_grpc

__all__ = ["Input", "Function", "function", "serve", "main"]


@dataclass(frozen=True)
class Input:
    """One final window of one key, and the values geostate read for it."""

    key: str
    window_start_ms: int
    window_end_ms: int
    values: Mapping[str, int]


class Function:
    """A user function: subclass it and implement `compute`, or use `@function`."""

    name: str = ""
    version: str = "0"

    def compute(self, params: Mapping[str, float], inputs: Sequence[Input]) -> List[int]:
        """One value per input, in order."""
        raise NotImplementedError


Compute = Callable[[Mapping[str, float], Sequence[Input]], Sequence[int]]


def function(name: str, version: str = "0") -> Callable[[Compute], Function]:
    """Makes a `Function` named `name` of a plain `compute(params, inputs)`."""

    def wrap(compute: Compute) -> Function:
        class Wrapped(Function):
            def compute(self, params, inputs):
                return list(compute(params, inputs))

        Wrapped.name, Wrapped.version = name, version
        Wrapped.__doc__ = compute.__doc__
        return Wrapped()

    return wrap


class _Servicer(function_pb2_grpc.FunctionServicer):
    def __init__(self, fn: Function):
        if not fn.name:
            raise ValueError("a function needs a name")
        self.fn = fn

    def Describe(self, request, context):
        return function_pb2.DescribeResponse(
            name=self.fn.name, version=self.fn.version, runtime="python")

    def Compute(self, request, context):
        if request.function != self.fn.name:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"this sidecar serves {self.fn.name!r}, not {request.function!r}")
        inputs = [Input(i.key, i.window_start_ms, i.window_end_ms, dict(i.values))
                  for i in request.inputs]
        try:
            values = self.fn.compute(dict(request.params), inputs)
        except Exception as e:  # the batch fails, the sidecar keeps serving
            context.abort(grpc.StatusCode.INTERNAL, f"{self.fn.name}: {type(e).__name__}: {e}")
        if len(values) != len(inputs):
            context.abort(grpc.StatusCode.INTERNAL,
                          f"{self.fn.name} gave {len(values)} values for {len(inputs)} inputs")
        return function_pb2.ComputeResponse(
            results=[function_pb2.FunctionResult(value=int(v)) for v in values])


def serve(fn: Function, address: str, *, workers: int = 4) -> grpc.Server:
    """Serves `fn` at `address`: `unix:///path/to.sock` or `host:port`; started."""
    if address.startswith("unix://"):
        path = address[len("unix://"):]
        if os.path.exists(path):
            os.unlink(path)  # a socket a previous run left
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    function_pb2_grpc.add_FunctionServicer_to_server(_Servicer(fn), server)
    if server.add_insecure_port(address) == 0 and not address.startswith("unix://"):
        raise OSError(f"cannot listen on {address}")
    server.start()
    return server


def main(fn: Function, argv: Sequence[str] | None = None) -> None:
    """A sidecar's command line: `--listen ADDRESS`, serving until killed."""
    parser = argparse.ArgumentParser(description=f"geostate function {fn.name!r}")
    parser.add_argument("--listen", required=True,
                        help="unix:///path/to.sock or host:port")
    args = parser.parse_args(argv)
    server = serve(fn, args.listen)
    print(f"{fn.name} {fn.version} serving on {args.listen}", flush=True)
    server.wait_for_termination()
