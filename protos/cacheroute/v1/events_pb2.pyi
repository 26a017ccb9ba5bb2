from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RequestEvent(_message.Message):
    __slots__ = ("routing_key", "destination", "prompt_tokens", "reusable_prefix_tokens", "inflight", "router_id")
    ROUTING_KEY_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REUSABLE_PREFIX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    ROUTER_ID_FIELD_NUMBER: _ClassVar[int]
    routing_key: str
    destination: str
    prompt_tokens: int
    reusable_prefix_tokens: int
    inflight: int
    router_id: str
    def __init__(self, routing_key: _Optional[str] = ..., destination: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., reusable_prefix_tokens: _Optional[int] = ..., inflight: _Optional[int] = ..., router_id: _Optional[str] = ...) -> None: ...

class CacheHitEvent(_message.Message):
    __slots__ = ("routing_key", "destination", "prompt_tokens", "cached_tokens", "output_tokens", "queue_depth", "ttft_ms", "e2e_ms")
    ROUTING_KEY_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    E2E_MS_FIELD_NUMBER: _ClassVar[int]
    routing_key: str
    destination: str
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    queue_depth: int
    ttft_ms: float
    e2e_ms: float
    def __init__(self, routing_key: _Optional[str] = ..., destination: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., queue_depth: _Optional[int] = ..., ttft_ms: _Optional[float] = ..., e2e_ms: _Optional[float] = ...) -> None: ...

class ErrorEvent(_message.Message):
    __slots__ = ("routing_key", "destination", "status_code", "kind", "router_id")
    ROUTING_KEY_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    STATUS_CODE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ROUTER_ID_FIELD_NUMBER: _ClassVar[int]
    routing_key: str
    destination: str
    status_code: int
    kind: str
    router_id: str
    def __init__(self, routing_key: _Optional[str] = ..., destination: _Optional[str] = ..., status_code: _Optional[int] = ..., kind: _Optional[str] = ..., router_id: _Optional[str] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("producer_id", "sequence", "timestamp_ms", "request", "cache_hit", "error")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    CACHE_HIT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    producer_id: str
    sequence: int
    timestamp_ms: int
    request: RequestEvent
    cache_hit: CacheHitEvent
    error: ErrorEvent
    def __init__(self, producer_id: _Optional[str] = ..., sequence: _Optional[int] = ..., timestamp_ms: _Optional[int] = ..., request: _Optional[_Union[RequestEvent, _Mapping]] = ..., cache_hit: _Optional[_Union[CacheHitEvent, _Mapping]] = ..., error: _Optional[_Union[ErrorEvent, _Mapping]] = ...) -> None: ...

class EventBatch(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[Event]
    def __init__(self, events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ...) -> None: ...

class DeadLetter(_message.Message):
    __slots__ = ("reason", "detail", "raw", "source_topic", "source_partition", "source_offset", "rejected_at_ms")
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    RAW_FIELD_NUMBER: _ClassVar[int]
    SOURCE_TOPIC_FIELD_NUMBER: _ClassVar[int]
    SOURCE_PARTITION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    REJECTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    reason: str
    detail: str
    raw: bytes
    source_topic: str
    source_partition: int
    source_offset: int
    rejected_at_ms: int
    def __init__(self, reason: _Optional[str] = ..., detail: _Optional[str] = ..., raw: _Optional[bytes] = ..., source_topic: _Optional[str] = ..., source_partition: _Optional[int] = ..., source_offset: _Optional[int] = ..., rejected_at_ms: _Optional[int] = ...) -> None: ...
