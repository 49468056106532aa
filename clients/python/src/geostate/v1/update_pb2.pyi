from geostate.v1 import crdt_pb2 as _crdt_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Update(_message.Message):
    __slots__ = ("key", "add", "set", "cas", "id", "event_time_ms", "hlc", "epoch")
    KEY_FIELD_NUMBER: _ClassVar[int]
    ADD_FIELD_NUMBER: _ClassVar[int]
    SET_FIELD_NUMBER: _ClassVar[int]
    CAS_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    HLC_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    key: str
    add: int
    set: bytes
    cas: CompareAndSet
    id: str
    event_time_ms: int
    hlc: _crdt_pb2.HlcTimestamp
    epoch: int
    def __init__(self, key: _Optional[str] = ..., add: _Optional[int] = ..., set: _Optional[bytes] = ..., cas: _Optional[_Union[CompareAndSet, _Mapping]] = ..., id: _Optional[str] = ..., event_time_ms: _Optional[int] = ..., hlc: _Optional[_Union[_crdt_pb2.HlcTimestamp, _Mapping]] = ..., epoch: _Optional[int] = ...) -> None: ...

class CompareAndSet(_message.Message):
    __slots__ = ("expected", "value")
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    expected: bytes
    value: bytes
    def __init__(self, expected: _Optional[bytes] = ..., value: _Optional[bytes] = ...) -> None: ...
