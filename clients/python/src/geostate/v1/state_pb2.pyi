from geostate.v1 import crdt_pb2 as _crdt_pb2
from geostate.v1 import update_pb2 as _update_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CrdtKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CRDT_KIND_UNSPECIFIED: _ClassVar[CrdtKind]
    CRDT_KIND_G_COUNTER: _ClassVar[CrdtKind]
    CRDT_KIND_PN_COUNTER: _ClassVar[CrdtKind]
    CRDT_KIND_LWW_REGISTER: _ClassVar[CrdtKind]
CRDT_KIND_UNSPECIFIED: CrdtKind
CRDT_KIND_G_COUNTER: CrdtKind
CRDT_KIND_PN_COUNTER: CrdtKind
CRDT_KIND_LWW_REGISTER: CrdtKind

class RouteRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    def __init__(self, key: _Optional[str] = ...) -> None: ...

class RouteResponse(_message.Message):
    __slots__ = ("key", "partition", "partitions", "region", "node")
    KEY_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    key: str
    partition: int
    partitions: int
    region: str
    node: str
    def __init__(self, key: _Optional[str] = ..., partition: _Optional[int] = ..., partitions: _Optional[int] = ..., region: _Optional[str] = ..., node: _Optional[str] = ...) -> None: ...

class LeasesRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    def __init__(self, key: _Optional[str] = ...) -> None: ...

class ShardLease(_message.Message):
    __slots__ = ("shard", "home", "prefix", "holder", "epoch", "expires_in_ms", "held_here")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    HOME_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_MS_FIELD_NUMBER: _ClassVar[int]
    HELD_HERE_FIELD_NUMBER: _ClassVar[int]
    shard: int
    home: str
    prefix: str
    holder: str
    epoch: int
    expires_in_ms: int
    held_here: bool
    def __init__(self, shard: _Optional[int] = ..., home: _Optional[str] = ..., prefix: _Optional[str] = ..., holder: _Optional[str] = ..., epoch: _Optional[int] = ..., expires_in_ms: _Optional[int] = ..., held_here: _Optional[bool] = ...) -> None: ...

class LeasesResponse(_message.Message):
    __slots__ = ("region", "shards", "leader", "term", "clocks")
    REGION_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    CLOCKS_FIELD_NUMBER: _ClassVar[int]
    region: str
    shards: _containers.RepeatedCompositeFieldContainer[ShardLease]
    leader: int
    term: int
    clocks: _containers.RepeatedCompositeFieldContainer[MemberClock]
    def __init__(self, region: _Optional[str] = ..., shards: _Optional[_Iterable[_Union[ShardLease, _Mapping]]] = ..., leader: _Optional[int] = ..., term: _Optional[int] = ..., clocks: _Optional[_Iterable[_Union[MemberClock, _Mapping]]] = ...) -> None: ...

class MemberClock(_message.Message):
    __slots__ = ("member", "offset_micros", "uncertainty_micros")
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    OFFSET_MICROS_FIELD_NUMBER: _ClassVar[int]
    UNCERTAINTY_MICROS_FIELD_NUMBER: _ClassVar[int]
    member: int
    offset_micros: int
    uncertainty_micros: int
    def __init__(self, member: _Optional[int] = ..., offset_micros: _Optional[int] = ..., uncertainty_micros: _Optional[int] = ...) -> None: ...

class TransferLeaseRequest(_message.Message):
    __slots__ = ("shard", "to_region")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    TO_REGION_FIELD_NUMBER: _ClassVar[int]
    shard: int
    to_region: str
    def __init__(self, shard: _Optional[int] = ..., to_region: _Optional[str] = ...) -> None: ...

class TransferLeaseResponse(_message.Message):
    __slots__ = ("lease",)
    LEASE_FIELD_NUMBER: _ClassVar[int]
    lease: ShardLease
    def __init__(self, lease: _Optional[_Union[ShardLease, _Mapping]] = ...) -> None: ...

class CheckpointRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CheckpointResponse(_message.Message):
    __slots__ = ("id", "manifest", "files", "bytes_total", "bytes_uploaded", "duration_ms")
    ID_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BYTES_UPLOADED_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    id: str
    manifest: str
    files: int
    bytes_total: int
    bytes_uploaded: int
    duration_ms: int
    def __init__(self, id: _Optional[str] = ..., manifest: _Optional[str] = ..., files: _Optional[int] = ..., bytes_total: _Optional[int] = ..., bytes_uploaded: _Optional[int] = ..., duration_ms: _Optional[int] = ...) -> None: ...

class SavepointRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SavepointResponse(_message.Message):
    __slots__ = ("id", "location", "entries", "bytes")
    ID_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    id: str
    location: str
    entries: int
    bytes: int
    def __init__(self, id: _Optional[str] = ..., location: _Optional[str] = ..., entries: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class CheckpointStatus(_message.Message):
    __slots__ = ("last_id", "last_age_ms", "last_duration_ms", "last_bytes_uploaded", "taken", "failures", "restored_from", "target")
    LAST_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_BYTES_UPLOADED_FIELD_NUMBER: _ClassVar[int]
    TAKEN_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    RESTORED_FROM_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    last_id: str
    last_age_ms: int
    last_duration_ms: int
    last_bytes_uploaded: int
    taken: int
    failures: int
    restored_from: str
    target: str
    def __init__(self, last_id: _Optional[str] = ..., last_age_ms: _Optional[int] = ..., last_duration_ms: _Optional[int] = ..., last_bytes_uploaded: _Optional[int] = ..., taken: _Optional[int] = ..., failures: _Optional[int] = ..., restored_from: _Optional[str] = ..., target: _Optional[str] = ...) -> None: ...

class UpdateRequest(_message.Message):
    __slots__ = ("key", "add", "set", "cas", "id", "event_time_ms")
    KEY_FIELD_NUMBER: _ClassVar[int]
    ADD_FIELD_NUMBER: _ClassVar[int]
    SET_FIELD_NUMBER: _ClassVar[int]
    CAS_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    key: str
    add: int
    set: bytes
    cas: _update_pb2.CompareAndSet
    id: str
    event_time_ms: int
    def __init__(self, key: _Optional[str] = ..., add: _Optional[int] = ..., set: _Optional[bytes] = ..., cas: _Optional[_Union[_update_pb2.CompareAndSet, _Mapping]] = ..., id: _Optional[str] = ..., event_time_ms: _Optional[int] = ...) -> None: ...

class Position(_message.Message):
    __slots__ = ("partition", "offset")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    partition: int
    offset: int
    def __init__(self, partition: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class UpdateResponse(_message.Message):
    __slots__ = ("position", "stamp")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    STAMP_FIELD_NUMBER: _ClassVar[int]
    position: Position
    stamp: _crdt_pb2.OrderStamp
    def __init__(self, position: _Optional[_Union[Position, _Mapping]] = ..., stamp: _Optional[_Union[_crdt_pb2.OrderStamp, _Mapping]] = ...) -> None: ...

class Freshness(_message.Message):
    __slots__ = ("remotes", "epoch", "copy")
    REMOTES_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    COPY_FIELD_NUMBER: _ClassVar[int]
    remotes: _containers.RepeatedCompositeFieldContainer[RemoteFreshness]
    epoch: int
    copy: StaleCopy
    def __init__(self, remotes: _Optional[_Iterable[_Union[RemoteFreshness, _Mapping]]] = ..., epoch: _Optional[int] = ..., copy: _Optional[_Union[StaleCopy, _Mapping]] = ...) -> None: ...

class StaleCopy(_message.Message):
    __slots__ = ("age_ms", "applied_offset")
    AGE_MS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    age_ms: int
    applied_offset: int
    def __init__(self, age_ms: _Optional[int] = ..., applied_offset: _Optional[int] = ...) -> None: ...

class RemoteFreshness(_message.Message):
    __slots__ = ("region", "applied", "lag_ms")
    REGION_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    LAG_MS_FIELD_NUMBER: _ClassVar[int]
    region: str
    applied: _crdt_pb2.HlcTimestamp
    lag_ms: int
    def __init__(self, region: _Optional[str] = ..., applied: _Optional[_Union[_crdt_pb2.HlcTimestamp, _Mapping]] = ..., lag_ms: _Optional[int] = ...) -> None: ...

class Value(_message.Message):
    __slots__ = ("key", "kind", "counter", "register", "stamp", "freshness", "saturated", "window")
    KEY_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    COUNTER_FIELD_NUMBER: _ClassVar[int]
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    STAMP_FIELD_NUMBER: _ClassVar[int]
    FRESHNESS_FIELD_NUMBER: _ClassVar[int]
    SATURATED_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    key: str
    kind: CrdtKind
    counter: int
    register: bytes
    stamp: _crdt_pb2.OrderStamp
    freshness: Freshness
    saturated: bool
    window: WindowInfo
    def __init__(self, key: _Optional[str] = ..., kind: _Optional[_Union[CrdtKind, str]] = ..., counter: _Optional[int] = ..., register: _Optional[bytes] = ..., stamp: _Optional[_Union[_crdt_pb2.OrderStamp, _Mapping]] = ..., freshness: _Optional[_Union[Freshness, _Mapping]] = ..., saturated: _Optional[bool] = ..., window: _Optional[_Union[WindowInfo, _Mapping]] = ...) -> None: ...

class WindowSelector(_message.Message):
    __slots__ = ("current", "latest_final", "start_ms", "range")
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    LATEST_FINAL_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    RANGE_FIELD_NUMBER: _ClassVar[int]
    current: bool
    latest_final: bool
    start_ms: int
    range: WindowRange
    def __init__(self, current: _Optional[bool] = ..., latest_final: _Optional[bool] = ..., start_ms: _Optional[int] = ..., range: _Optional[_Union[WindowRange, _Mapping]] = ...) -> None: ...

class WindowRange(_message.Message):
    __slots__ = ("from_ms", "to_ms")
    FROM_MS_FIELD_NUMBER: _ClassVar[int]
    TO_MS_FIELD_NUMBER: _ClassVar[int]
    from_ms: int
    to_ms: int
    def __init__(self, from_ms: _Optional[int] = ..., to_ms: _Optional[int] = ...) -> None: ...

class WindowInfo(_message.Message):
    __slots__ = ("start_ms", "end_ms", "closes_at_ms", "is_final", "behind")
    START_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    CLOSES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    IS_FINAL_FIELD_NUMBER: _ClassVar[int]
    BEHIND_FIELD_NUMBER: _ClassVar[int]
    start_ms: int
    end_ms: int
    closes_at_ms: int
    is_final: bool
    behind: _containers.RepeatedCompositeFieldContainer[RegionWatermark]
    def __init__(self, start_ms: _Optional[int] = ..., end_ms: _Optional[int] = ..., closes_at_ms: _Optional[int] = ..., is_final: _Optional[bool] = ..., behind: _Optional[_Iterable[_Union[RegionWatermark, _Mapping]]] = ...) -> None: ...

class RegionWatermark(_message.Message):
    __slots__ = ("region", "watermark_ms", "known")
    REGION_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_MS_FIELD_NUMBER: _ClassVar[int]
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    region: str
    watermark_ms: int
    known: bool
    def __init__(self, region: _Optional[str] = ..., watermark_ms: _Optional[int] = ..., known: _Optional[bool] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("key", "leaseholder", "window")
    KEY_FIELD_NUMBER: _ClassVar[int]
    LEASEHOLDER_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    key: str
    leaseholder: bool
    window: WindowSelector
    def __init__(self, key: _Optional[str] = ..., leaseholder: _Optional[bool] = ..., window: _Optional[_Union[WindowSelector, _Mapping]] = ...) -> None: ...

class BatchGetRequest(_message.Message):
    __slots__ = ("keys", "window")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    window: WindowSelector
    def __init__(self, keys: _Optional[_Iterable[str]] = ..., window: _Optional[_Union[WindowSelector, _Mapping]] = ...) -> None: ...

class BatchGetResponse(_message.Message):
    __slots__ = ("values", "missing")
    VALUES_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedCompositeFieldContainer[Value]
    missing: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, values: _Optional[_Iterable[_Union[Value, _Mapping]]] = ..., missing: _Optional[_Iterable[str]] = ...) -> None: ...

class ScanRequest(_message.Message):
    __slots__ = ("prefix", "page_token", "limit", "window")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    page_token: str
    limit: int
    window: WindowSelector
    def __init__(self, prefix: _Optional[str] = ..., page_token: _Optional[str] = ..., limit: _Optional[int] = ..., window: _Optional[_Union[WindowSelector, _Mapping]] = ...) -> None: ...

class ScanResponse(_message.Message):
    __slots__ = ("values", "next_page_token", "partitions")
    VALUES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedCompositeFieldContainer[Value]
    next_page_token: str
    partitions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, values: _Optional[_Iterable[_Union[Value, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., partitions: _Optional[_Iterable[int]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("prefix",)
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    def __init__(self, prefix: _Optional[str] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PartitionStatus(_message.Message):
    __slots__ = ("partition", "applied_offset", "end_offset", "lag")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    APPLIED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    partition: int
    applied_offset: int
    end_offset: int
    lag: int
    def __init__(self, partition: _Optional[int] = ..., applied_offset: _Optional[int] = ..., end_offset: _Optional[int] = ..., lag: _Optional[int] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("region", "incarnation", "updates_topic", "partitions", "events_applied", "events_dead_lettered", "remotes", "checkpoint", "owned_partitions", "node", "functions")
    REGION_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    UPDATES_TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_APPLIED_FIELD_NUMBER: _ClassVar[int]
    EVENTS_DEAD_LETTERED_FIELD_NUMBER: _ClassVar[int]
    REMOTES_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    OWNED_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    FUNCTIONS_FIELD_NUMBER: _ClassVar[int]
    region: str
    incarnation: int
    updates_topic: str
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionStatus]
    events_applied: int
    events_dead_lettered: int
    remotes: _containers.RepeatedCompositeFieldContainer[RemoteStatus]
    checkpoint: CheckpointStatus
    owned_partitions: _containers.RepeatedScalarFieldContainer[int]
    node: str
    functions: _containers.RepeatedCompositeFieldContainer[FunctionStatus]
    def __init__(self, region: _Optional[str] = ..., incarnation: _Optional[int] = ..., updates_topic: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[PartitionStatus, _Mapping]]] = ..., events_applied: _Optional[int] = ..., events_dead_lettered: _Optional[int] = ..., remotes: _Optional[_Iterable[_Union[RemoteStatus, _Mapping]]] = ..., checkpoint: _Optional[_Union[CheckpointStatus, _Mapping]] = ..., owned_partitions: _Optional[_Iterable[int]] = ..., node: _Optional[str] = ..., functions: _Optional[_Iterable[_Union[FunctionStatus, _Mapping]]] = ...) -> None: ...

class FunctionStatus(_message.Message):
    __slots__ = ("name", "addr", "healthy", "version", "runtime", "latency_us", "error", "checked_ms_ago")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDR_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    LATENCY_US_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CHECKED_MS_AGO_FIELD_NUMBER: _ClassVar[int]
    name: str
    addr: str
    healthy: bool
    version: str
    runtime: str
    latency_us: int
    error: str
    checked_ms_ago: int
    def __init__(self, name: _Optional[str] = ..., addr: _Optional[str] = ..., healthy: _Optional[bool] = ..., version: _Optional[str] = ..., runtime: _Optional[str] = ..., latency_us: _Optional[int] = ..., error: _Optional[str] = ..., checked_ms_ago: _Optional[int] = ...) -> None: ...

class RemoteStatus(_message.Message):
    __slots__ = ("region", "topic", "partitions", "applied", "lag_ms", "deltas_merged", "deltas_refused", "caught_up", "heard_from_all_since_nanos")
    REGION_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    LAG_MS_FIELD_NUMBER: _ClassVar[int]
    DELTAS_MERGED_FIELD_NUMBER: _ClassVar[int]
    DELTAS_REFUSED_FIELD_NUMBER: _ClassVar[int]
    CAUGHT_UP_FIELD_NUMBER: _ClassVar[int]
    HEARD_FROM_ALL_SINCE_NANOS_FIELD_NUMBER: _ClassVar[int]
    region: str
    topic: str
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionStatus]
    applied: _crdt_pb2.HlcTimestamp
    lag_ms: int
    deltas_merged: int
    deltas_refused: int
    caught_up: bool
    heard_from_all_since_nanos: int
    def __init__(self, region: _Optional[str] = ..., topic: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[PartitionStatus, _Mapping]]] = ..., applied: _Optional[_Union[_crdt_pb2.HlcTimestamp, _Mapping]] = ..., lag_ms: _Optional[int] = ..., deltas_merged: _Optional[int] = ..., deltas_refused: _Optional[int] = ..., caught_up: _Optional[bool] = ..., heard_from_all_since_nanos: _Optional[int] = ...) -> None: ...
