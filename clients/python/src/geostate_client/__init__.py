"""A client of geostate's regional gRPC API (`proto/geostate/v1/state.proto`).

    from geostate_client import Client

    with Client("127.0.0.1:7001") as geo:
        geo.add("requests/9q8yy", 1)                 # a counter: +1, acknowledged once applied
        demand = geo.counter("requests/9q8yy")       # its value in this region
        geo.set("zones/9q8yy", "downtown")           # a shared register
        value = geo.get("requests/9q8yy")            # value, freshness, window
        print(value.counter, value.freshness.lag_ms)

Every write carries an idempotency id (one is made when the caller gives none). A write
whose outcome is unknown (the node was unavailable, the deadline passed, the connection
broke on the way) is sent again with the same id, so it is applied once however often it
is retried; a write the node refused (INVALID_ARGUMENT, FAILED_PRECONDITION, …) is not.
Reads are retried too. With `route=True` (the default) each key's requests go straight to
the node of the region serving its partition (`Admin/Route`), and the route is asked again
after a node answered that the partition moved; any node serves any key either way (it
forwards), routing only saves the hop.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Iterator, Optional, Sequence, Union

import grpc

from geostate.v1 import state_pb2, state_pb2_grpc, update_pb2

__all__ = [
    "Client",
    "GeostateError",
    "Position",
    "Value",
    "Window",
    "Freshness",
    "RemoteFreshness",
    "StaleCopy",
    "Stamp",
]

# Outcomes that leave a write's fate unknown (or a read unanswered): sent again.
RETRIED = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

Bytes = Union[bytes, str]


class GeostateError(Exception):
    """A call that failed for good: the gRPC status code and the node's message."""

    def __init__(self, code: grpc.StatusCode, message: str, attempts: int = 1):
        super().__init__(f"{code.name}: {message}" + (f" (after {attempts} attempts)" if attempts > 1 else ""))
        self.code = code
        self.message = message
        self.attempts = attempts


@dataclass(frozen=True)
class Position:
    """Where a write was appended in the region's updates topic."""

    partition: int
    offset: int


@dataclass(frozen=True)
class Stamp:
    """A register value's order stamp: (epoch, hybrid clock, origin region)."""

    epoch: int
    wall_nanos: int
    logical: int
    origin: str


@dataclass(frozen=True)
class RemoteFreshness:
    """What the read holds of one remote region: its newest delta merged here."""

    region: str
    applied_wall_nanos: int
    lag_ms: int


@dataclass(frozen=True)
class StaleCopy:
    """A copy answering a read: what its node applied of the region's updates topic (through
    `applied_offset`, -1: none) until `age_ms` ago, nothing since."""

    age_ms: int
    applied_offset: int


@dataclass(frozen=True)
class Freshness:
    """How current a read is: per remote region, the lease epoch of an owned value, and
    `copy` when the node answered from its copy of a partition it no longer owns, while no
    node of its region was known to own it (its region's Kafka unreachable, or the
    partition between nodes)."""

    remotes: tuple = ()
    epoch: int = 0
    copy: Optional[StaleCopy] = None

    @property
    def lag_ms(self) -> int:
        """The largest lag over the remote regions (0 with none)."""
        return max((r.lag_ms for r in self.remotes), default=0)


@dataclass(frozen=True)
class Window:
    """A windowed value's window and whether it is final (the same in every region, for good)."""

    start_ms: int
    end_ms: int
    closes_at_ms: int
    is_final: bool
    behind: tuple = ()


@dataclass(frozen=True)
class Value:
    """One key's value in this region."""

    key: str
    kind: str  # "g_counter" | "pn_counter" | "lww_register"
    counter: Optional[int] = None
    register: Optional[bytes] = None
    stamp: Optional[Stamp] = None
    freshness: Freshness = field(default_factory=Freshness)
    window: Optional[Window] = None
    saturated: bool = False


_KINDS = {
    state_pb2.CRDT_KIND_G_COUNTER: "g_counter",
    state_pb2.CRDT_KIND_PN_COUNTER: "pn_counter",
    state_pb2.CRDT_KIND_LWW_REGISTER: "lww_register",
}


def _stamp(s) -> Stamp:
    return Stamp(s.epoch, s.hlc.wall_nanos, s.hlc.logical, s.origin)


def _value(v: state_pb2.Value) -> Value:
    which = v.WhichOneof("value")
    f = v.freshness
    freshness = Freshness(
        tuple(RemoteFreshness(r.region, r.applied.wall_nanos, r.lag_ms) for r in f.remotes),
        f.epoch,
        StaleCopy(f.copy.age_ms, f.copy.applied_offset) if f.HasField("copy") else None,
    )
    window = None
    if v.HasField("window"):
        w = v.window
        behind = tuple((b.region, b.watermark_ms if b.known else None) for b in w.behind)
        window = Window(w.start_ms, w.end_ms, w.closes_at_ms, w.is_final, behind)
    return Value(
        key=v.key,
        kind=_KINDS.get(v.kind, "unspecified"),
        counter=v.counter if which == "counter" else None,
        register=v.register if which == "register" else None,
        stamp=_stamp(v.stamp) if v.HasField("stamp") else None,
        freshness=freshness,
        window=window,
        saturated=v.saturated,
    )


def _bytes(b: Bytes) -> bytes:
    return b.encode() if isinstance(b, str) else bytes(b)


def _selector(window) -> Optional[state_pb2.WindowSelector]:
    """`None` (a plain key, or the current window), "current", "latest_final", a start in ms,
    or a (from_ms, to_ms) range."""
    if window is None:
        return None
    if window == "current":
        return state_pb2.WindowSelector(current=True)
    if window == "latest_final":
        return state_pb2.WindowSelector(latest_final=True)
    if isinstance(window, tuple):
        return state_pb2.WindowSelector(range=state_pb2.WindowRange(from_ms=window[0], to_ms=window[1]))
    return state_pb2.WindowSelector(start_ms=int(window))


class Client:
    """A client of one region. `target` is any node of the region ("host:port").

    timeout   seconds each attempt may take (the gRPC deadline)
    retries   how often a call whose outcome is unknown is sent again (with the same id)
    backoff   the first pause between attempts, doubled each time (with jitter), in seconds
    route     send each key to the node serving its partition (`Admin/Route`)
    credentials, token   grpc channel credentials (TLS) and a bearer token for `[api.auth]`
    """

    def __init__(
        self,
        target: str,
        *,
        timeout: float = 10.0,
        retries: int = 5,
        backoff: float = 0.05,
        route: bool = True,
        credentials: Optional[grpc.ChannelCredentials] = None,
        token: Optional[str] = None,
    ):
        self._target = target
        self._timeout = timeout
        self._retries = retries
        self._backoff = backoff
        self._route = route
        self._credentials = credentials
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._lock = threading.Lock()
        self._channels: dict = {}
        self._routes: dict = {}  # partition -> node address
        self._partitions: Optional[int] = None

    # -- connections ------------------------------------------------------------------

    def _channel(self, target: str) -> grpc.Channel:
        with self._lock:
            channel = self._channels.get(target)
            if channel is None:
                if self._credentials is not None:
                    channel = grpc.secure_channel(target, self._credentials)
                else:
                    channel = grpc.insecure_channel(target)
                self._channels[target] = channel
            return channel

    def close(self) -> None:
        with self._lock:
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def route(self, key: str) -> str:
        """The address of the node this client sends `key`'s requests to: the one serving
        its partition (`Admin/Route`, asked once per partition), else the seed target."""
        return self._node_for(key)

    def _node_for(self, key: str) -> str:
        """The node serving `key`'s partition, if known (else the seed target)."""
        if not self._route:
            return self._target
        with self._lock:
            partitions = self._partitions
        if partitions is not None:
            node = self._routes.get(partition_of(key, partitions))
            if node:
                return node
        try:
            r = state_pb2_grpc.AdminStub(self._channel(self._target)).Route(
                state_pb2.RouteRequest(key=key), timeout=self._timeout, metadata=self._metadata
            )
        except grpc.RpcError:
            return self._target  # the seed node forwards
        with self._lock:
            self._partitions = r.partitions
            if r.node:
                self._routes[r.partition] = r.node
        return r.node or self._target

    def _forget_route(self, key: str) -> None:
        with self._lock:
            if self._partitions is not None:
                self._routes.pop(partition_of(key, self._partitions), None)

    def _call(self, key: Optional[str], method: str, request, service: str = "State"):
        """Calls `method` (on the node of `key`, if any), retrying unknown outcomes."""
        pause, attempt = self._backoff, 0
        while True:
            attempt += 1
            target = self._node_for(key) if key is not None else self._target
            stub_type = state_pb2_grpc.StateStub if service == "State" else state_pb2_grpc.AdminStub
            stub = stub_type(self._channel(target))
            try:
                return getattr(stub, method)(request, timeout=self._timeout, metadata=self._metadata)
            except grpc.RpcError as e:
                # the node may be gone, or the partition moved: ask the route again
                if key is not None and e.code() == grpc.StatusCode.UNAVAILABLE:
                    self._forget_route(key)
                if e.code() not in RETRIED or attempt > self._retries:
                    raise GeostateError(e.code(), e.details() or "", attempt) from None
            time.sleep(pause * (0.5 + random.random()))
            pause *= 2

    # -- writes -----------------------------------------------------------------------

    def _update(self, request: state_pb2.UpdateRequest) -> state_pb2.UpdateResponse:
        if not request.id:
            request.id = f"py-{uuid.uuid4()}"
        return self._call(request.key, "Update", request)

    def add(self, key: str, n: int, *, id: Optional[str] = None, event_time_ms: int = 0) -> Position:
        """Adds `n` to a counter (a g_counter takes n > 0); answers once applied here."""
        r = self._update(state_pb2.UpdateRequest(key=key, add=n, id=id or "", event_time_ms=event_time_ms))
        return Position(r.position.partition, r.position.offset)

    def set(self, key: str, value: Bytes, *, id: Optional[str] = None) -> Stamp:
        """Writes a register; answers the write's order stamp."""
        r = self._update(state_pb2.UpdateRequest(key=key, set=_bytes(value), id=id or ""))
        return _stamp(r.stamp)

    def compare_and_set(
        self, key: str, expected: Optional[Bytes], value: Bytes, *, id: Optional[str] = None
    ) -> Stamp:
        """Writes an owned register if it holds `expected` (`None`: never set). A mismatch
        raises GeostateError with FAILED_PRECONDITION naming the current value."""
        cas = update_pb2.CompareAndSet(value=_bytes(value))
        if expected is not None:
            cas.expected = _bytes(expected)
        r = self._update(state_pb2.UpdateRequest(key=key, cas=cas, id=id or ""))
        return _stamp(r.stamp)

    # -- reads ------------------------------------------------------------------------

    def get(self, key: str, *, leaseholder: bool = False, window=None) -> Optional[Value]:
        """The key's value here (`None` for a register never set). `window` picks a window
        of a windowed key: "current", "latest_final" or a start in ms. `leaseholder`: an owned
        key read at its lease holder only (it sees every write the holder acknowledged)."""
        request = state_pb2.GetRequest(key=key, leaseholder=leaseholder, window=_selector(window))
        try:
            return _value(self._call(key, "Get", request))
        except GeostateError as e:
            if e.code == grpc.StatusCode.NOT_FOUND:
                return None
            raise

    def counter(self, key: str, *, window=None) -> int:
        """A counter's value (0 if never touched)."""
        v = self.get(key, window=window)
        return 0 if v is None or v.counter is None else v.counter

    def register(self, key: str, *, leaseholder: bool = False) -> Optional[bytes]:
        """A register's value, `None` if never set."""
        v = self.get(key, leaseholder=leaseholder)
        return None if v is None else v.register

    def windows(self, key: str, from_ms: int, to_ms: int) -> list:
        """Every window of a windowed key starting in [from_ms, to_ms), oldest first."""
        r = self._call(None, "BatchGet", state_pb2.BatchGetRequest(keys=[key], window=_selector((from_ms, to_ms))))
        return [_value(v) for v in r.values]

    def freshness(self, key: str) -> Freshness:
        """How current this region's copy of the key's partition is."""
        v = self.get(key)
        return Freshness() if v is None else v.freshness

    def batch_get(self, keys: Sequence[str]) -> dict:
        """Several keys at once (one request; the node asks the others for theirs):
        key -> Value, registers never set left out."""
        r = self._call(None, "BatchGet", state_pb2.BatchGetRequest(keys=list(keys)))
        return {v.key: _value(v) for v in r.values}

    def scan(self, prefix: str, *, page: int = 100) -> Iterator[Value]:
        """Every key with `prefix`, in key order, fetched a page at a time."""
        token = ""
        while True:
            r = self._call(None, "Scan", state_pb2.ScanRequest(prefix=prefix, page_token=token, limit=page))
            for v in r.values:
                yield _value(v)
            if not r.next_page_token:
                return
            token = r.next_page_token

    def status(self) -> state_pb2.StatusResponse:
        """`Admin/Status` of the seed node (the raw message)."""
        return self._call(None, "Status", state_pb2.StatusRequest(), service="Admin")


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (the Java producer's `Utils.murmur2`)."""
    m, r = 0x5BD1E995, 24
    h = (0x9747B28C ^ len(data)) & 0xFFFFFFFF
    for i in range(0, len(data) - len(data) % 4, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    tail = data[len(data) - len(data) % 4:]
    if len(tail) == 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if len(tail) >= 1:
        h ^= tail[0]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def partition_of(key: str, partitions: int) -> int:
    """The partition of `key` among `partitions`, as every geostate topic places it."""
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions
