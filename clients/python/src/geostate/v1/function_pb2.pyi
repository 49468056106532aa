from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeResponse(_message.Message):
    __slots__ = ("name", "version", "runtime")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    runtime: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., runtime: _Optional[str] = ...) -> None: ...

class FunctionInput(_message.Message):
    __slots__ = ("key", "window_start_ms", "window_end_ms", "values")
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    KEY_FIELD_NUMBER: _ClassVar[int]
    WINDOW_START_MS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_END_MS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    key: str
    window_start_ms: int
    window_end_ms: int
    values: _containers.ScalarMap[str, int]
    def __init__(self, key: _Optional[str] = ..., window_start_ms: _Optional[int] = ..., window_end_ms: _Optional[int] = ..., values: _Optional[_Mapping[str, int]] = ...) -> None: ...

class ComputeRequest(_message.Message):
    __slots__ = ("function", "params", "inputs")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    function: str
    params: _containers.ScalarMap[str, float]
    inputs: _containers.RepeatedCompositeFieldContainer[FunctionInput]
    def __init__(self, function: _Optional[str] = ..., params: _Optional[_Mapping[str, float]] = ..., inputs: _Optional[_Iterable[_Union[FunctionInput, _Mapping]]] = ...) -> None: ...

class FunctionResult(_message.Message):
    __slots__ = ("value",)
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: int
    def __init__(self, value: _Optional[int] = ...) -> None: ...

class ComputeResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[FunctionResult]
    def __init__(self, results: _Optional[_Iterable[_Union[FunctionResult, _Mapping]]] = ...) -> None: ...
