from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class EngineSignals(_message.Message):
    __slots__ = ("destination", "observed_at_ms", "engine", "kv_events", "blocks_resident", "block_size", "blocks_stored_per_s", "blocks_removed_per_s", "residency_s", "kv_gaps", "kv_resyncs", "kv_garbage", "metrics", "running", "waiting", "kv_usage", "prefix_hit_rate", "ttft_p50_s", "ttft_p99_s", "preemptions_per_s", "metrics_error")
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    KV_EVENTS_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_RESIDENT_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_STORED_PER_S_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_REMOVED_PER_S_FIELD_NUMBER: _ClassVar[int]
    RESIDENCY_S_FIELD_NUMBER: _ClassVar[int]
    KV_GAPS_FIELD_NUMBER: _ClassVar[int]
    KV_RESYNCS_FIELD_NUMBER: _ClassVar[int]
    KV_GARBAGE_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    KV_USAGE_FIELD_NUMBER: _ClassVar[int]
    PREFIX_HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    TTFT_P50_S_FIELD_NUMBER: _ClassVar[int]
    TTFT_P99_S_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_PER_S_FIELD_NUMBER: _ClassVar[int]
    METRICS_ERROR_FIELD_NUMBER: _ClassVar[int]
    destination: str
    observed_at_ms: int
    engine: str
    kv_events: bool
    blocks_resident: int
    block_size: int
    blocks_stored_per_s: float
    blocks_removed_per_s: float
    residency_s: float
    kv_gaps: int
    kv_resyncs: int
    kv_garbage: int
    metrics: bool
    running: float
    waiting: float
    kv_usage: float
    prefix_hit_rate: float
    ttft_p50_s: float
    ttft_p99_s: float
    preemptions_per_s: float
    metrics_error: str
    def __init__(self, destination: _Optional[str] = ..., observed_at_ms: _Optional[int] = ..., engine: _Optional[str] = ..., kv_events: _Optional[bool] = ..., blocks_resident: _Optional[int] = ..., block_size: _Optional[int] = ..., blocks_stored_per_s: _Optional[float] = ..., blocks_removed_per_s: _Optional[float] = ..., residency_s: _Optional[float] = ..., kv_gaps: _Optional[int] = ..., kv_resyncs: _Optional[int] = ..., kv_garbage: _Optional[int] = ..., metrics: _Optional[bool] = ..., running: _Optional[float] = ..., waiting: _Optional[float] = ..., kv_usage: _Optional[float] = ..., prefix_hit_rate: _Optional[float] = ..., ttft_p50_s: _Optional[float] = ..., ttft_p99_s: _Optional[float] = ..., preemptions_per_s: _Optional[float] = ..., metrics_error: _Optional[str] = ...) -> None: ...
