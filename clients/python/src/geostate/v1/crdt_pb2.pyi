from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Actor(_message.Message):
    __slots__ = ("region", "incarnation")
    REGION_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    region: str
    incarnation: int
    def __init__(self, region: _Optional[str] = ..., incarnation: _Optional[int] = ...) -> None: ...

class CounterEntry(_message.Message):
    __slots__ = ("actor", "count")
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    actor: Actor
    count: int
    def __init__(self, actor: _Optional[_Union[Actor, _Mapping]] = ..., count: _Optional[int] = ...) -> None: ...

class GCounterState(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[CounterEntry]
    def __init__(self, entries: _Optional[_Iterable[_Union[CounterEntry, _Mapping]]] = ...) -> None: ...

class PnCounterState(_message.Message):
    __slots__ = ("increments", "decrements")
    INCREMENTS_FIELD_NUMBER: _ClassVar[int]
    DECREMENTS_FIELD_NUMBER: _ClassVar[int]
    increments: _containers.RepeatedCompositeFieldContainer[CounterEntry]
    decrements: _containers.RepeatedCompositeFieldContainer[CounterEntry]
    def __init__(self, increments: _Optional[_Iterable[_Union[CounterEntry, _Mapping]]] = ..., decrements: _Optional[_Iterable[_Union[CounterEntry, _Mapping]]] = ...) -> None: ...

class HlcTimestamp(_message.Message):
    __slots__ = ("wall_nanos", "logical")
    WALL_NANOS_FIELD_NUMBER: _ClassVar[int]
    LOGICAL_FIELD_NUMBER: _ClassVar[int]
    wall_nanos: int
    logical: int
    def __init__(self, wall_nanos: _Optional[int] = ..., logical: _Optional[int] = ...) -> None: ...

class OrderStamp(_message.Message):
    __slots__ = ("epoch", "hlc", "origin")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    HLC_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    hlc: HlcTimestamp
    origin: str
    def __init__(self, epoch: _Optional[int] = ..., hlc: _Optional[_Union[HlcTimestamp, _Mapping]] = ..., origin: _Optional[str] = ...) -> None: ...

class LwwRegisterState(_message.Message):
    __slots__ = ("value", "stamp")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    STAMP_FIELD_NUMBER: _ClassVar[int]
    value: bytes
    stamp: OrderStamp
    def __init__(self, value: _Optional[bytes] = ..., stamp: _Optional[_Union[OrderStamp, _Mapping]] = ...) -> None: ...

class CrdtState(_message.Message):
    __slots__ = ("g_counter", "pn_counter", "lww_register")
    G_COUNTER_FIELD_NUMBER: _ClassVar[int]
    PN_COUNTER_FIELD_NUMBER: _ClassVar[int]
    LWW_REGISTER_FIELD_NUMBER: _ClassVar[int]
    g_counter: GCounterState
    pn_counter: PnCounterState
    lww_register: LwwRegisterState
    def __init__(self, g_counter: _Optional[_Union[GCounterState, _Mapping]] = ..., pn_counter: _Optional[_Union[PnCounterState, _Mapping]] = ..., lww_register: _Optional[_Union[LwwRegisterState, _Mapping]] = ...) -> None: ...

class Delta(_message.Message):
    __slots__ = ("key", "origin", "state", "origin_time", "epoch", "recent_ids")
    KEY_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_TIME_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    RECENT_IDS_FIELD_NUMBER: _ClassVar[int]
    key: str
    origin: str
    state: CrdtState
    origin_time: HlcTimestamp
    epoch: int
    recent_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, key: _Optional[str] = ..., origin: _Optional[str] = ..., state: _Optional[_Union[CrdtState, _Mapping]] = ..., origin_time: _Optional[_Union[HlcTimestamp, _Mapping]] = ..., epoch: _Optional[int] = ..., recent_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ResumePoint(_message.Message):
    __slots__ = ("origin", "incarnation", "updates_topic", "updates_offsets", "hlc_high_water", "fences", "watermarks", "outputs_through")
    class UpdatesOffsetsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    class WatermarksEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    class OutputsThroughEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    UPDATES_TOPIC_FIELD_NUMBER: _ClassVar[int]
    UPDATES_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    HLC_HIGH_WATER_FIELD_NUMBER: _ClassVar[int]
    FENCES_FIELD_NUMBER: _ClassVar[int]
    WATERMARKS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_THROUGH_FIELD_NUMBER: _ClassVar[int]
    origin: str
    incarnation: int
    updates_topic: str
    updates_offsets: _containers.ScalarMap[int, int]
    hlc_high_water: HlcTimestamp
    fences: _containers.RepeatedCompositeFieldContainer[Fence]
    watermarks: _containers.ScalarMap[int, int]
    outputs_through: _containers.ScalarMap[int, int]
    def __init__(self, origin: _Optional[str] = ..., incarnation: _Optional[int] = ..., updates_topic: _Optional[str] = ..., updates_offsets: _Optional[_Mapping[int, int]] = ..., hlc_high_water: _Optional[_Union[HlcTimestamp, _Mapping]] = ..., fences: _Optional[_Iterable[_Union[Fence, _Mapping]]] = ..., watermarks: _Optional[_Mapping[int, int]] = ..., outputs_through: _Optional[_Mapping[int, int]] = ...) -> None: ...

class LateEvent(_message.Message):
    __slots__ = ("key", "payload", "partition", "offset", "event_time_ms", "watermark_ms", "closed_at_ms", "reason")
    KEY_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    EVENT_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_MS_FIELD_NUMBER: _ClassVar[int]
    CLOSED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    payload: bytes
    partition: int
    offset: int
    event_time_ms: int
    watermark_ms: int
    closed_at_ms: int
    reason: str
    def __init__(self, key: _Optional[bytes] = ..., payload: _Optional[bytes] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ..., event_time_ms: _Optional[int] = ..., watermark_ms: _Optional[int] = ..., closed_at_ms: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class Fence(_message.Message):
    __slots__ = ("shard", "partition", "epoch")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    shard: int
    partition: int
    epoch: int
    def __init__(self, shard: _Optional[int] = ..., partition: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...
