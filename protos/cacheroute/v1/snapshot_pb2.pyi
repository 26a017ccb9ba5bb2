from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class KeyColumns(_message.Message):
    __slots__ = ("keys", "rate_per_s", "ewma_rate_per_s", "prompt_tokens", "cached_tokens", "interarrival_cv", "reuse_fraction", "reusable_prefix_tokens", "requests", "last_destination", "last_destination_names")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    RATE_PER_S_FIELD_NUMBER: _ClassVar[int]
    EWMA_RATE_PER_S_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    INTERARRIVAL_CV_FIELD_NUMBER: _ClassVar[int]
    REUSE_FRACTION_FIELD_NUMBER: _ClassVar[int]
    REUSABLE_PREFIX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    LAST_DESTINATION_FIELD_NUMBER: _ClassVar[int]
    LAST_DESTINATION_NAMES_FIELD_NUMBER: _ClassVar[int]
    keys: bytes
    rate_per_s: _containers.RepeatedScalarFieldContainer[float]
    ewma_rate_per_s: _containers.RepeatedScalarFieldContainer[float]
    prompt_tokens: _containers.RepeatedScalarFieldContainer[float]
    cached_tokens: _containers.RepeatedScalarFieldContainer[float]
    interarrival_cv: _containers.RepeatedScalarFieldContainer[float]
    reuse_fraction: _containers.RepeatedScalarFieldContainer[float]
    reusable_prefix_tokens: _containers.RepeatedScalarFieldContainer[float]
    requests: _containers.RepeatedScalarFieldContainer[int]
    last_destination: _containers.RepeatedScalarFieldContainer[int]
    last_destination_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, keys: _Optional[bytes] = ..., rate_per_s: _Optional[_Iterable[float]] = ..., ewma_rate_per_s: _Optional[_Iterable[float]] = ..., prompt_tokens: _Optional[_Iterable[float]] = ..., cached_tokens: _Optional[_Iterable[float]] = ..., interarrival_cv: _Optional[_Iterable[float]] = ..., reuse_fraction: _Optional[_Iterable[float]] = ..., reusable_prefix_tokens: _Optional[_Iterable[float]] = ..., requests: _Optional[_Iterable[int]] = ..., last_destination: _Optional[_Iterable[int]] = ..., last_destination_names: _Optional[_Iterable[str]] = ...) -> None: ...

class DestinationStats(_message.Message):
    __slots__ = ("destination", "arrival_rate_per_s", "prompt_tokens", "cached_tokens", "mean_queue_depth", "p99_e2e_ms")
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_RATE_PER_S_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MEAN_QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    P99_E2E_MS_FIELD_NUMBER: _ClassVar[int]
    destination: str
    arrival_rate_per_s: float
    prompt_tokens: float
    cached_tokens: float
    mean_queue_depth: float
    p99_e2e_ms: float
    def __init__(self, destination: _Optional[str] = ..., arrival_rate_per_s: _Optional[float] = ..., prompt_tokens: _Optional[float] = ..., cached_tokens: _Optional[float] = ..., mean_queue_depth: _Optional[float] = ..., p99_e2e_ms: _Optional[float] = ...) -> None: ...

class RateSnapshot(_message.Message):
    __slots__ = ("window_start_ms", "window_end_ms", "source_partition", "partition_count", "part_index", "part_count", "worker_id", "recovering", "keys", "destinations", "overflow_keys", "overflow_rate_per_s", "active_keys", "dead_letters", "duplicates_dropped", "published_at_ms", "key_id", "signature")
    WINDOW_START_MS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_END_MS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_PARTITION_FIELD_NUMBER: _ClassVar[int]
    PARTITION_COUNT_FIELD_NUMBER: _ClassVar[int]
    PART_INDEX_FIELD_NUMBER: _ClassVar[int]
    PART_COUNT_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    RECOVERING_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    DESTINATIONS_FIELD_NUMBER: _ClassVar[int]
    OVERFLOW_KEYS_FIELD_NUMBER: _ClassVar[int]
    OVERFLOW_RATE_PER_S_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_KEYS_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_DROPPED_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    window_start_ms: int
    window_end_ms: int
    source_partition: int
    partition_count: int
    part_index: int
    part_count: int
    worker_id: str
    recovering: bool
    keys: KeyColumns
    destinations: _containers.RepeatedCompositeFieldContainer[DestinationStats]
    overflow_keys: int
    overflow_rate_per_s: float
    active_keys: int
    dead_letters: int
    duplicates_dropped: int
    published_at_ms: int
    key_id: str
    signature: bytes
    def __init__(self, window_start_ms: _Optional[int] = ..., window_end_ms: _Optional[int] = ..., source_partition: _Optional[int] = ..., partition_count: _Optional[int] = ..., part_index: _Optional[int] = ..., part_count: _Optional[int] = ..., worker_id: _Optional[str] = ..., recovering: _Optional[bool] = ..., keys: _Optional[_Union[KeyColumns, _Mapping]] = ..., destinations: _Optional[_Iterable[_Union[DestinationStats, _Mapping]]] = ..., overflow_keys: _Optional[int] = ..., overflow_rate_per_s: _Optional[float] = ..., active_keys: _Optional[int] = ..., dead_letters: _Optional[int] = ..., duplicates_dropped: _Optional[int] = ..., published_at_ms: _Optional[int] = ..., key_id: _Optional[str] = ..., signature: _Optional[bytes] = ...) -> None: ...
