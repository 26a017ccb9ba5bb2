from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PlanVersion(_message.Message):
    __slots__ = ("epoch", "seq")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    seq: int
    def __init__(self, epoch: _Optional[int] = ..., seq: _Optional[int] = ...) -> None: ...

class PlanConfig(_message.Message):
    __slots__ = ("q_cap", "warm_slots_per_destination", "warm_slots", "byte_aware", "imbalance_tolerance", "built_by", "fallback", "hashed_tail")
    Q_CAP_FIELD_NUMBER: _ClassVar[int]
    WARM_SLOTS_PER_DESTINATION_FIELD_NUMBER: _ClassVar[int]
    WARM_SLOTS_FIELD_NUMBER: _ClassVar[int]
    BYTE_AWARE_FIELD_NUMBER: _ClassVar[int]
    IMBALANCE_TOLERANCE_FIELD_NUMBER: _ClassVar[int]
    BUILT_BY_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_FIELD_NUMBER: _ClassVar[int]
    HASHED_TAIL_FIELD_NUMBER: _ClassVar[int]
    q_cap: float
    warm_slots_per_destination: int
    warm_slots: int
    byte_aware: bool
    imbalance_tolerance: float
    built_by: str
    fallback: bool
    hashed_tail: bool
    def __init__(self, q_cap: _Optional[float] = ..., warm_slots_per_destination: _Optional[int] = ..., warm_slots: _Optional[int] = ..., byte_aware: _Optional[bool] = ..., imbalance_tolerance: _Optional[float] = ..., built_by: _Optional[str] = ..., fallback: _Optional[bool] = ..., hashed_tail: _Optional[bool] = ...) -> None: ...

class Destination(_message.Message):
    __slots__ = ("id", "address", "capacity_weight", "draining")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    id: str
    address: str
    capacity_weight: float
    draining: bool
    def __init__(self, id: _Optional[str] = ..., address: _Optional[str] = ..., capacity_weight: _Optional[float] = ..., draining: _Optional[bool] = ...) -> None: ...

class KeyTable(_message.Message):
    __slots__ = ("keys", "set_offsets_u32le", "members_u32le", "rates_f32le")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    SET_OFFSETS_U32LE_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_U32LE_FIELD_NUMBER: _ClassVar[int]
    RATES_F32LE_FIELD_NUMBER: _ClassVar[int]
    keys: bytes
    set_offsets_u32le: bytes
    members_u32le: bytes
    rates_f32le: bytes
    def __init__(self, keys: _Optional[bytes] = ..., set_offsets_u32le: _Optional[bytes] = ..., members_u32le: _Optional[bytes] = ..., rates_f32le: _Optional[bytes] = ...) -> None: ...

class PlanStats(_message.Message):
    __slots__ = ("admitted_rate_share", "cold_tail_rate_per_s", "expected_load_per_s", "imbalance_max_over_mean", "admitted_keys", "used_slots", "build_seconds")
    ADMITTED_RATE_SHARE_FIELD_NUMBER: _ClassVar[int]
    COLD_TAIL_RATE_PER_S_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_LOAD_PER_S_FIELD_NUMBER: _ClassVar[int]
    IMBALANCE_MAX_OVER_MEAN_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_KEYS_FIELD_NUMBER: _ClassVar[int]
    USED_SLOTS_FIELD_NUMBER: _ClassVar[int]
    BUILD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    admitted_rate_share: float
    cold_tail_rate_per_s: float
    expected_load_per_s: _containers.RepeatedScalarFieldContainer[float]
    imbalance_max_over_mean: float
    admitted_keys: int
    used_slots: int
    build_seconds: float
    def __init__(self, admitted_rate_share: _Optional[float] = ..., cold_tail_rate_per_s: _Optional[float] = ..., expected_load_per_s: _Optional[_Iterable[float]] = ..., imbalance_max_over_mean: _Optional[float] = ..., admitted_keys: _Optional[int] = ..., used_slots: _Optional[int] = ..., build_seconds: _Optional[float] = ...) -> None: ...

class RoutingPlan(_message.Message):
    __slots__ = ("schema", "version", "created_at_ms", "config", "destinations", "table", "stats", "rates_window_end_ms")
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    DESTINATIONS_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    RATES_WINDOW_END_MS_FIELD_NUMBER: _ClassVar[int]
    schema: int
    version: PlanVersion
    created_at_ms: int
    config: PlanConfig
    destinations: _containers.RepeatedCompositeFieldContainer[Destination]
    table: KeyTable
    stats: PlanStats
    rates_window_end_ms: int
    def __init__(self, schema: _Optional[int] = ..., version: _Optional[_Union[PlanVersion, _Mapping]] = ..., created_at_ms: _Optional[int] = ..., config: _Optional[_Union[PlanConfig, _Mapping]] = ..., destinations: _Optional[_Iterable[_Union[Destination, _Mapping]]] = ..., table: _Optional[_Union[KeyTable, _Mapping]] = ..., stats: _Optional[_Union[PlanStats, _Mapping]] = ..., rates_window_end_ms: _Optional[int] = ...) -> None: ...

class PlanDelta(_message.Message):
    __slots__ = ("schema", "base", "target", "base_digest", "target_digest", "removed_keys", "upserts", "destinations", "created_at_ms", "config", "stats", "same_destinations")
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    BASE_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    BASE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    TARGET_DIGEST_FIELD_NUMBER: _ClassVar[int]
    REMOVED_KEYS_FIELD_NUMBER: _ClassVar[int]
    UPSERTS_FIELD_NUMBER: _ClassVar[int]
    DESTINATIONS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    SAME_DESTINATIONS_FIELD_NUMBER: _ClassVar[int]
    schema: int
    base: PlanVersion
    target: PlanVersion
    base_digest: bytes
    target_digest: bytes
    removed_keys: bytes
    upserts: KeyTable
    destinations: _containers.RepeatedCompositeFieldContainer[Destination]
    created_at_ms: int
    config: PlanConfig
    stats: PlanStats
    same_destinations: bool
    def __init__(self, schema: _Optional[int] = ..., base: _Optional[_Union[PlanVersion, _Mapping]] = ..., target: _Optional[_Union[PlanVersion, _Mapping]] = ..., base_digest: _Optional[bytes] = ..., target_digest: _Optional[bytes] = ..., removed_keys: _Optional[bytes] = ..., upserts: _Optional[_Union[KeyTable, _Mapping]] = ..., destinations: _Optional[_Iterable[_Union[Destination, _Mapping]]] = ..., created_at_ms: _Optional[int] = ..., config: _Optional[_Union[PlanConfig, _Mapping]] = ..., stats: _Optional[_Union[PlanStats, _Mapping]] = ..., same_destinations: _Optional[bool] = ...) -> None: ...

class SignedBlob(_message.Message):
    __slots__ = ("payload", "digest", "signature", "key_id", "kind")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[SignedBlob.Kind]
        PLAN: _ClassVar[SignedBlob.Kind]
        DELTA: _ClassVar[SignedBlob.Kind]
    KIND_UNSPECIFIED: SignedBlob.Kind
    PLAN: SignedBlob.Kind
    DELTA: SignedBlob.Kind
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    digest: bytes
    signature: bytes
    key_id: str
    kind: SignedBlob.Kind
    def __init__(self, payload: _Optional[bytes] = ..., digest: _Optional[bytes] = ..., signature: _Optional[bytes] = ..., key_id: _Optional[str] = ..., kind: _Optional[_Union[SignedBlob.Kind, str]] = ...) -> None: ...

class PlanNotification(_message.Message):
    __slots__ = ("version", "digest")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    version: PlanVersion
    digest: bytes
    def __init__(self, version: _Optional[_Union[PlanVersion, _Mapping]] = ..., digest: _Optional[bytes] = ...) -> None: ...

class RouterStatus(_message.Message):
    __slots__ = ("router_id", "applied", "applied_at_ms", "last_rejection", "last_rejected", "reported_at_ms", "decisions_planned", "decisions_fallback", "mode", "unhealthy_destinations")
    ROUTER_ID_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    APPLIED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_REJECTION_FIELD_NUMBER: _ClassVar[int]
    LAST_REJECTED_FIELD_NUMBER: _ClassVar[int]
    REPORTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_PLANNED_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FALLBACK_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    UNHEALTHY_DESTINATIONS_FIELD_NUMBER: _ClassVar[int]
    router_id: str
    applied: PlanVersion
    applied_at_ms: int
    last_rejection: str
    last_rejected: PlanVersion
    reported_at_ms: int
    decisions_planned: int
    decisions_fallback: int
    mode: str
    unhealthy_destinations: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, router_id: _Optional[str] = ..., applied: _Optional[_Union[PlanVersion, _Mapping]] = ..., applied_at_ms: _Optional[int] = ..., last_rejection: _Optional[str] = ..., last_rejected: _Optional[_Union[PlanVersion, _Mapping]] = ..., reported_at_ms: _Optional[int] = ..., decisions_planned: _Optional[int] = ..., decisions_fallback: _Optional[int] = ..., mode: _Optional[str] = ..., unhealthy_destinations: _Optional[_Iterable[str]] = ...) -> None: ...
