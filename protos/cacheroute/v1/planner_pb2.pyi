from cacheroute.v1 import plan_pb2 as _plan_pb2
from cacheroute.v1 import signals_pb2 as _signals_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODE_UNSPECIFIED: _ClassVar[Mode]
    PLANNED: _ClassVar[Mode]
    FALLBACK: _ClassVar[Mode]
MODE_UNSPECIFIED: Mode
PLANNED: Mode
FALLBACK: Mode

class GetStatusRequest(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: str
    def __init__(self, pool: _Optional[str] = ...) -> None: ...

class Penalties(_message.Message):
    __slots__ = ("staleness_rate_modelled", "staleness_rate_measured", "staleness_accumulated", "rewarm_cost", "measured_used")
    STALENESS_RATE_MODELLED_FIELD_NUMBER: _ClassVar[int]
    STALENESS_RATE_MEASURED_FIELD_NUMBER: _ClassVar[int]
    STALENESS_ACCUMULATED_FIELD_NUMBER: _ClassVar[int]
    REWARM_COST_FIELD_NUMBER: _ClassVar[int]
    MEASURED_USED_FIELD_NUMBER: _ClassVar[int]
    staleness_rate_modelled: float
    staleness_rate_measured: float
    staleness_accumulated: float
    rewarm_cost: float
    measured_used: bool
    def __init__(self, staleness_rate_modelled: _Optional[float] = ..., staleness_rate_measured: _Optional[float] = ..., staleness_accumulated: _Optional[float] = ..., rewarm_cost: _Optional[float] = ..., measured_used: _Optional[bool] = ...) -> None: ...

class Drift(_message.Message):
    __slots__ = ("total_variation", "admission_churn_share", "imbalance_change")
    TOTAL_VARIATION_FIELD_NUMBER: _ClassVar[int]
    ADMISSION_CHURN_SHARE_FIELD_NUMBER: _ClassVar[int]
    IMBALANCE_CHANGE_FIELD_NUMBER: _ClassVar[int]
    total_variation: float
    admission_churn_share: float
    imbalance_change: float
    def __init__(self, total_variation: _Optional[float] = ..., admission_churn_share: _Optional[float] = ..., imbalance_change: _Optional[float] = ...) -> None: ...

class Decision(_message.Message):
    __slots__ = ("id", "at_ms", "action", "reason", "drift", "penalties", "installed", "moved_traffic_share", "request_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    AT_MS_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DRIFT_FIELD_NUMBER: _ClassVar[int]
    PENALTIES_FIELD_NUMBER: _ClassVar[int]
    INSTALLED_FIELD_NUMBER: _ClassVar[int]
    MOVED_TRAFFIC_SHARE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    at_ms: int
    action: str
    reason: str
    drift: Drift
    penalties: Penalties
    installed: _plan_pb2.PlanVersion
    moved_traffic_share: float
    request_id: str
    def __init__(self, id: _Optional[int] = ..., at_ms: _Optional[int] = ..., action: _Optional[str] = ..., reason: _Optional[str] = ..., drift: _Optional[_Union[Drift, _Mapping]] = ..., penalties: _Optional[_Union[Penalties, _Mapping]] = ..., installed: _Optional[_Union[_plan_pb2.PlanVersion, _Mapping]] = ..., moved_traffic_share: _Optional[float] = ..., request_id: _Optional[str] = ...) -> None: ...

class PlannerStatus(_message.Message):
    __slots__ = ("mode", "installed", "installed_age_s", "drift", "penalties", "last_decision", "rates_age_s", "rates_recovering", "config", "pinned", "mode_reason", "role", "leader_id", "engines", "measured_warm_slots", "measured_warm_slots_destinations", "measured_mean_prefix_tokens", "saturated", "measured_q_cap", "measured_q_cap_source", "measured_q_cap_destinations", "q_cap_in_use", "warm_slots_in_use", "measured_q_cap_slo_bound")
    MODE_FIELD_NUMBER: _ClassVar[int]
    INSTALLED_FIELD_NUMBER: _ClassVar[int]
    INSTALLED_AGE_S_FIELD_NUMBER: _ClassVar[int]
    DRIFT_FIELD_NUMBER: _ClassVar[int]
    PENALTIES_FIELD_NUMBER: _ClassVar[int]
    LAST_DECISION_FIELD_NUMBER: _ClassVar[int]
    RATES_AGE_S_FIELD_NUMBER: _ClassVar[int]
    RATES_RECOVERING_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    MODE_REASON_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    MEASURED_WARM_SLOTS_FIELD_NUMBER: _ClassVar[int]
    MEASURED_WARM_SLOTS_DESTINATIONS_FIELD_NUMBER: _ClassVar[int]
    MEASURED_MEAN_PREFIX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SATURATED_FIELD_NUMBER: _ClassVar[int]
    MEASURED_Q_CAP_FIELD_NUMBER: _ClassVar[int]
    MEASURED_Q_CAP_SOURCE_FIELD_NUMBER: _ClassVar[int]
    MEASURED_Q_CAP_DESTINATIONS_FIELD_NUMBER: _ClassVar[int]
    Q_CAP_IN_USE_FIELD_NUMBER: _ClassVar[int]
    WARM_SLOTS_IN_USE_FIELD_NUMBER: _ClassVar[int]
    MEASURED_Q_CAP_SLO_BOUND_FIELD_NUMBER: _ClassVar[int]
    mode: Mode
    installed: _plan_pb2.PlanVersion
    installed_age_s: float
    drift: Drift
    penalties: Penalties
    last_decision: Decision
    rates_age_s: float
    rates_recovering: bool
    config: PlannerConfig
    pinned: bool
    mode_reason: str
    role: str
    leader_id: str
    engines: _containers.RepeatedCompositeFieldContainer[_signals_pb2.EngineSignals]
    measured_warm_slots: float
    measured_warm_slots_destinations: int
    measured_mean_prefix_tokens: float
    saturated: _containers.RepeatedCompositeFieldContainer[SaturatedDestination]
    measured_q_cap: float
    measured_q_cap_source: str
    measured_q_cap_destinations: int
    q_cap_in_use: float
    warm_slots_in_use: int
    measured_q_cap_slo_bound: float
    def __init__(self, mode: _Optional[_Union[Mode, str]] = ..., installed: _Optional[_Union[_plan_pb2.PlanVersion, _Mapping]] = ..., installed_age_s: _Optional[float] = ..., drift: _Optional[_Union[Drift, _Mapping]] = ..., penalties: _Optional[_Union[Penalties, _Mapping]] = ..., last_decision: _Optional[_Union[Decision, _Mapping]] = ..., rates_age_s: _Optional[float] = ..., rates_recovering: _Optional[bool] = ..., config: _Optional[_Union[PlannerConfig, _Mapping]] = ..., pinned: _Optional[bool] = ..., mode_reason: _Optional[str] = ..., role: _Optional[str] = ..., leader_id: _Optional[str] = ..., engines: _Optional[_Iterable[_Union[_signals_pb2.EngineSignals, _Mapping]]] = ..., measured_warm_slots: _Optional[float] = ..., measured_warm_slots_destinations: _Optional[int] = ..., measured_mean_prefix_tokens: _Optional[float] = ..., saturated: _Optional[_Iterable[_Union[SaturatedDestination, _Mapping]]] = ..., measured_q_cap: _Optional[float] = ..., measured_q_cap_source: _Optional[str] = ..., measured_q_cap_destinations: _Optional[int] = ..., q_cap_in_use: _Optional[float] = ..., warm_slots_in_use: _Optional[int] = ..., measured_q_cap_slo_bound: _Optional[float] = ...) -> None: ...

class SaturatedDestination(_message.Message):
    __slots__ = ("destination", "reason", "since_ms", "clear_since_ms", "derated", "knee_per_s", "configured_weight", "planned_weight")
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    CLEAR_SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    DERATED_FIELD_NUMBER: _ClassVar[int]
    KNEE_PER_S_FIELD_NUMBER: _ClassVar[int]
    CONFIGURED_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    PLANNED_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    destination: str
    reason: str
    since_ms: int
    clear_since_ms: int
    derated: bool
    knee_per_s: float
    configured_weight: float
    planned_weight: float
    def __init__(self, destination: _Optional[str] = ..., reason: _Optional[str] = ..., since_ms: _Optional[int] = ..., clear_since_ms: _Optional[int] = ..., derated: _Optional[bool] = ..., knee_per_s: _Optional[float] = ..., configured_weight: _Optional[float] = ..., planned_weight: _Optional[float] = ...) -> None: ...

class GetCurrentVersionRequest(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: str
    def __init__(self, pool: _Optional[str] = ...) -> None: ...

class CurrentVersion(_message.Message):
    __slots__ = ("version", "digest", "created_at_ms")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    version: _plan_pb2.PlanVersion
    digest: bytes
    created_at_ms: int
    def __init__(self, version: _Optional[_Union[_plan_pb2.PlanVersion, _Mapping]] = ..., digest: _Optional[bytes] = ..., created_at_ms: _Optional[int] = ...) -> None: ...

class GetPlanRequest(_message.Message):
    __slots__ = ("version", "pool")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    version: _plan_pb2.PlanVersion
    pool: str
    def __init__(self, version: _Optional[_Union[_plan_pb2.PlanVersion, _Mapping]] = ..., pool: _Optional[str] = ...) -> None: ...

class PlanChunk(_message.Message):
    __slots__ = ("payload", "index", "count")
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    index: int
    count: int
    def __init__(self, payload: _Optional[bytes] = ..., index: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class ListPlanVersionsRequest(_message.Message):
    __slots__ = ("limit", "pool")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    limit: int
    pool: str
    def __init__(self, limit: _Optional[int] = ..., pool: _Optional[str] = ...) -> None: ...

class PlanVersionInfo(_message.Message):
    __slots__ = ("version", "digest", "created_at_ms", "admitted_keys", "imbalance_max_over_mean", "built_by", "current")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_KEYS_FIELD_NUMBER: _ClassVar[int]
    IMBALANCE_MAX_OVER_MEAN_FIELD_NUMBER: _ClassVar[int]
    BUILT_BY_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    version: _plan_pb2.PlanVersion
    digest: bytes
    created_at_ms: int
    admitted_keys: int
    imbalance_max_over_mean: float
    built_by: str
    current: bool
    def __init__(self, version: _Optional[_Union[_plan_pb2.PlanVersion, _Mapping]] = ..., digest: _Optional[bytes] = ..., created_at_ms: _Optional[int] = ..., admitted_keys: _Optional[int] = ..., imbalance_max_over_mean: _Optional[float] = ..., built_by: _Optional[str] = ..., current: _Optional[bool] = ...) -> None: ...

class ListPlanVersionsResponse(_message.Message):
    __slots__ = ("versions",)
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    versions: _containers.RepeatedCompositeFieldContainer[PlanVersionInfo]
    def __init__(self, versions: _Optional[_Iterable[_Union[PlanVersionInfo, _Mapping]]] = ...) -> None: ...

class DiffPlansRequest(_message.Message):
    __slots__ = ("a", "b", "pool")
    A_FIELD_NUMBER: _ClassVar[int]
    B_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    a: _plan_pb2.PlanVersion
    b: _plan_pb2.PlanVersion
    pool: str
    def __init__(self, a: _Optional[_Union[_plan_pb2.PlanVersion, _Mapping]] = ..., b: _Optional[_Union[_plan_pb2.PlanVersion, _Mapping]] = ..., pool: _Optional[str] = ...) -> None: ...

class PlanDiff(_message.Message):
    __slots__ = ("added_keys", "removed_keys", "moved_keys", "moved_key_share", "moved_traffic_share", "load_change_per_s", "destinations")
    ADDED_KEYS_FIELD_NUMBER: _ClassVar[int]
    REMOVED_KEYS_FIELD_NUMBER: _ClassVar[int]
    MOVED_KEYS_FIELD_NUMBER: _ClassVar[int]
    MOVED_KEY_SHARE_FIELD_NUMBER: _ClassVar[int]
    MOVED_TRAFFIC_SHARE_FIELD_NUMBER: _ClassVar[int]
    LOAD_CHANGE_PER_S_FIELD_NUMBER: _ClassVar[int]
    DESTINATIONS_FIELD_NUMBER: _ClassVar[int]
    added_keys: int
    removed_keys: int
    moved_keys: int
    moved_key_share: float
    moved_traffic_share: float
    load_change_per_s: _containers.RepeatedScalarFieldContainer[float]
    destinations: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, added_keys: _Optional[int] = ..., removed_keys: _Optional[int] = ..., moved_keys: _Optional[int] = ..., moved_key_share: _Optional[float] = ..., moved_traffic_share: _Optional[float] = ..., load_change_per_s: _Optional[_Iterable[float]] = ..., destinations: _Optional[_Iterable[str]] = ...) -> None: ...

class WatchPlansRequest(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: str
    def __init__(self, pool: _Optional[str] = ...) -> None: ...

class PlannerEvent(_message.Message):
    __slots__ = ("decision", "installed")
    DECISION_FIELD_NUMBER: _ClassVar[int]
    INSTALLED_FIELD_NUMBER: _ClassVar[int]
    decision: Decision
    installed: PlanVersionInfo
    def __init__(self, decision: _Optional[_Union[Decision, _Mapping]] = ..., installed: _Optional[_Union[PlanVersionInfo, _Mapping]] = ...) -> None: ...

class ReplanRequest(_message.Message):
    __slots__ = ("dry_run", "fresh", "force", "request_id", "pool")
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    FRESH_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    dry_run: bool
    fresh: bool
    force: bool
    request_id: str
    pool: str
    def __init__(self, dry_run: _Optional[bool] = ..., fresh: _Optional[bool] = ..., force: _Optional[bool] = ..., request_id: _Optional[str] = ..., pool: _Optional[str] = ...) -> None: ...

class ReplanResponse(_message.Message):
    __slots__ = ("candidate", "diff", "penalties", "installed", "decision")
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    DIFF_FIELD_NUMBER: _ClassVar[int]
    PENALTIES_FIELD_NUMBER: _ClassVar[int]
    INSTALLED_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    candidate: PlanVersionInfo
    diff: PlanDiff
    penalties: Penalties
    installed: bool
    decision: Decision
    def __init__(self, candidate: _Optional[_Union[PlanVersionInfo, _Mapping]] = ..., diff: _Optional[_Union[PlanDiff, _Mapping]] = ..., penalties: _Optional[_Union[Penalties, _Mapping]] = ..., installed: _Optional[bool] = ..., decision: _Optional[_Union[Decision, _Mapping]] = ...) -> None: ...

class RollbackRequest(_message.Message):
    __slots__ = ("version", "request_id", "release", "pool")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    version: _plan_pb2.PlanVersion
    request_id: str
    release: bool
    pool: str
    def __init__(self, version: _Optional[_Union[_plan_pb2.PlanVersion, _Mapping]] = ..., request_id: _Optional[str] = ..., release: _Optional[bool] = ..., pool: _Optional[str] = ...) -> None: ...

class RollbackResponse(_message.Message):
    __slots__ = ("installed", "pinned")
    INSTALLED_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    installed: PlanVersionInfo
    pinned: bool
    def __init__(self, installed: _Optional[_Union[PlanVersionInfo, _Mapping]] = ..., pinned: _Optional[bool] = ...) -> None: ...

class SetModeRequest(_message.Message):
    __slots__ = ("mode", "reason", "pool")
    MODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    mode: Mode
    reason: str
    pool: str
    def __init__(self, mode: _Optional[_Union[Mode, str]] = ..., reason: _Optional[str] = ..., pool: _Optional[str] = ...) -> None: ...

class SetModeResponse(_message.Message):
    __slots__ = ("mode",)
    MODE_FIELD_NUMBER: _ClassVar[int]
    mode: Mode
    def __init__(self, mode: _Optional[_Union[Mode, str]] = ...) -> None: ...

class GuardConfig(_message.Message):
    __slots__ = ("active_keys_min", "active_keys_max", "p99_ms_max", "hit_rate_min", "enter_after_s", "resume_dwell_s", "min_fallback_s", "p99_resume_margin", "hit_gap_max", "affinity_gain_min", "gain_low_windows")
    ACTIVE_KEYS_MIN_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_KEYS_MAX_FIELD_NUMBER: _ClassVar[int]
    P99_MS_MAX_FIELD_NUMBER: _ClassVar[int]
    HIT_RATE_MIN_FIELD_NUMBER: _ClassVar[int]
    ENTER_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    RESUME_DWELL_S_FIELD_NUMBER: _ClassVar[int]
    MIN_FALLBACK_S_FIELD_NUMBER: _ClassVar[int]
    P99_RESUME_MARGIN_FIELD_NUMBER: _ClassVar[int]
    HIT_GAP_MAX_FIELD_NUMBER: _ClassVar[int]
    AFFINITY_GAIN_MIN_FIELD_NUMBER: _ClassVar[int]
    GAIN_LOW_WINDOWS_FIELD_NUMBER: _ClassVar[int]
    active_keys_min: int
    active_keys_max: int
    p99_ms_max: float
    hit_rate_min: float
    enter_after_s: float
    resume_dwell_s: float
    min_fallback_s: float
    p99_resume_margin: float
    hit_gap_max: float
    affinity_gain_min: float
    gain_low_windows: int
    def __init__(self, active_keys_min: _Optional[int] = ..., active_keys_max: _Optional[int] = ..., p99_ms_max: _Optional[float] = ..., hit_rate_min: _Optional[float] = ..., enter_after_s: _Optional[float] = ..., resume_dwell_s: _Optional[float] = ..., min_fallback_s: _Optional[float] = ..., p99_resume_margin: _Optional[float] = ..., hit_gap_max: _Optional[float] = ..., affinity_gain_min: _Optional[float] = ..., gain_low_windows: _Optional[int] = ...) -> None: ...

class PlannerConfig(_message.Message):
    __slots__ = ("q_cap", "warm_slots_per_destination", "interval_s", "hysteresis", "min_dwell_s", "imbalance_tolerance", "max_plan_age_s", "destinations", "guard", "byte_aware", "admission_hysteresis", "balance_effort", "rate_noise_z", "learn_warm_slots", "learn_q_cap", "hashed_tail", "replica_hysteresis", "warm_placement")
    Q_CAP_FIELD_NUMBER: _ClassVar[int]
    WARM_SLOTS_PER_DESTINATION_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    HYSTERESIS_FIELD_NUMBER: _ClassVar[int]
    MIN_DWELL_S_FIELD_NUMBER: _ClassVar[int]
    IMBALANCE_TOLERANCE_FIELD_NUMBER: _ClassVar[int]
    MAX_PLAN_AGE_S_FIELD_NUMBER: _ClassVar[int]
    DESTINATIONS_FIELD_NUMBER: _ClassVar[int]
    GUARD_FIELD_NUMBER: _ClassVar[int]
    BYTE_AWARE_FIELD_NUMBER: _ClassVar[int]
    ADMISSION_HYSTERESIS_FIELD_NUMBER: _ClassVar[int]
    BALANCE_EFFORT_FIELD_NUMBER: _ClassVar[int]
    RATE_NOISE_Z_FIELD_NUMBER: _ClassVar[int]
    LEARN_WARM_SLOTS_FIELD_NUMBER: _ClassVar[int]
    LEARN_Q_CAP_FIELD_NUMBER: _ClassVar[int]
    HASHED_TAIL_FIELD_NUMBER: _ClassVar[int]
    REPLICA_HYSTERESIS_FIELD_NUMBER: _ClassVar[int]
    WARM_PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    q_cap: float
    warm_slots_per_destination: int
    interval_s: float
    hysteresis: float
    min_dwell_s: float
    imbalance_tolerance: float
    max_plan_age_s: float
    destinations: _containers.RepeatedCompositeFieldContainer[_plan_pb2.Destination]
    guard: GuardConfig
    byte_aware: bool
    admission_hysteresis: float
    balance_effort: float
    rate_noise_z: float
    learn_warm_slots: bool
    learn_q_cap: bool
    hashed_tail: bool
    replica_hysteresis: float
    warm_placement: bool
    def __init__(self, q_cap: _Optional[float] = ..., warm_slots_per_destination: _Optional[int] = ..., interval_s: _Optional[float] = ..., hysteresis: _Optional[float] = ..., min_dwell_s: _Optional[float] = ..., imbalance_tolerance: _Optional[float] = ..., max_plan_age_s: _Optional[float] = ..., destinations: _Optional[_Iterable[_Union[_plan_pb2.Destination, _Mapping]]] = ..., guard: _Optional[_Union[GuardConfig, _Mapping]] = ..., byte_aware: _Optional[bool] = ..., admission_hysteresis: _Optional[float] = ..., balance_effort: _Optional[float] = ..., rate_noise_z: _Optional[float] = ..., learn_warm_slots: _Optional[bool] = ..., learn_q_cap: _Optional[bool] = ..., hashed_tail: _Optional[bool] = ..., replica_hysteresis: _Optional[float] = ..., warm_placement: _Optional[bool] = ...) -> None: ...

class UpdateConfigRequest(_message.Message):
    __slots__ = ("q_cap", "warm_slots_per_destination", "interval_s", "hysteresis", "min_dwell_s", "imbalance_tolerance", "add_destinations", "drain_destinations", "remove_destinations", "request_id", "guard", "set_weights", "byte_aware", "admission_hysteresis", "balance_effort", "rate_noise_z", "learn_warm_slots", "learn_q_cap", "hashed_tail", "replica_hysteresis", "warm_placement", "pool")
    class SetWeightsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    Q_CAP_FIELD_NUMBER: _ClassVar[int]
    WARM_SLOTS_PER_DESTINATION_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    HYSTERESIS_FIELD_NUMBER: _ClassVar[int]
    MIN_DWELL_S_FIELD_NUMBER: _ClassVar[int]
    IMBALANCE_TOLERANCE_FIELD_NUMBER: _ClassVar[int]
    ADD_DESTINATIONS_FIELD_NUMBER: _ClassVar[int]
    DRAIN_DESTINATIONS_FIELD_NUMBER: _ClassVar[int]
    REMOVE_DESTINATIONS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    GUARD_FIELD_NUMBER: _ClassVar[int]
    SET_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    BYTE_AWARE_FIELD_NUMBER: _ClassVar[int]
    ADMISSION_HYSTERESIS_FIELD_NUMBER: _ClassVar[int]
    BALANCE_EFFORT_FIELD_NUMBER: _ClassVar[int]
    RATE_NOISE_Z_FIELD_NUMBER: _ClassVar[int]
    LEARN_WARM_SLOTS_FIELD_NUMBER: _ClassVar[int]
    LEARN_Q_CAP_FIELD_NUMBER: _ClassVar[int]
    HASHED_TAIL_FIELD_NUMBER: _ClassVar[int]
    REPLICA_HYSTERESIS_FIELD_NUMBER: _ClassVar[int]
    WARM_PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    q_cap: float
    warm_slots_per_destination: int
    interval_s: float
    hysteresis: float
    min_dwell_s: float
    imbalance_tolerance: float
    add_destinations: _containers.RepeatedCompositeFieldContainer[_plan_pb2.Destination]
    drain_destinations: _containers.RepeatedScalarFieldContainer[str]
    remove_destinations: _containers.RepeatedScalarFieldContainer[str]
    request_id: str
    guard: GuardConfig
    set_weights: _containers.ScalarMap[str, float]
    byte_aware: bool
    admission_hysteresis: float
    balance_effort: float
    rate_noise_z: float
    learn_warm_slots: bool
    learn_q_cap: bool
    hashed_tail: bool
    replica_hysteresis: float
    warm_placement: bool
    pool: str
    def __init__(self, q_cap: _Optional[float] = ..., warm_slots_per_destination: _Optional[int] = ..., interval_s: _Optional[float] = ..., hysteresis: _Optional[float] = ..., min_dwell_s: _Optional[float] = ..., imbalance_tolerance: _Optional[float] = ..., add_destinations: _Optional[_Iterable[_Union[_plan_pb2.Destination, _Mapping]]] = ..., drain_destinations: _Optional[_Iterable[str]] = ..., remove_destinations: _Optional[_Iterable[str]] = ..., request_id: _Optional[str] = ..., guard: _Optional[_Union[GuardConfig, _Mapping]] = ..., set_weights: _Optional[_Mapping[str, float]] = ..., byte_aware: _Optional[bool] = ..., admission_hysteresis: _Optional[float] = ..., balance_effort: _Optional[float] = ..., rate_noise_z: _Optional[float] = ..., learn_warm_slots: _Optional[bool] = ..., learn_q_cap: _Optional[bool] = ..., hashed_tail: _Optional[bool] = ..., replica_hysteresis: _Optional[float] = ..., warm_placement: _Optional[bool] = ..., pool: _Optional[str] = ...) -> None: ...

class UpdateConfigResponse(_message.Message):
    __slots__ = ("config",)
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    config: PlannerConfig
    def __init__(self, config: _Optional[_Union[PlannerConfig, _Mapping]] = ...) -> None: ...

class ListDecisionsRequest(_message.Message):
    __slots__ = ("limit", "pool")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    limit: int
    pool: str
    def __init__(self, limit: _Optional[int] = ..., pool: _Optional[str] = ...) -> None: ...

class ListDecisionsResponse(_message.Message):
    __slots__ = ("decisions",)
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    decisions: _containers.RepeatedCompositeFieldContainer[Decision]
    def __init__(self, decisions: _Optional[_Iterable[_Union[Decision, _Mapping]]] = ...) -> None: ...

class ListRoutersRequest(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: str
    def __init__(self, pool: _Optional[str] = ...) -> None: ...

class RouterSync(_message.Message):
    __slots__ = ("status", "state")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    status: _plan_pb2.RouterStatus
    state: str
    def __init__(self, status: _Optional[_Union[_plan_pb2.RouterStatus, _Mapping]] = ..., state: _Optional[str] = ...) -> None: ...

class ListRoutersResponse(_message.Message):
    __slots__ = ("routers",)
    ROUTERS_FIELD_NUMBER: _ClassVar[int]
    routers: _containers.RepeatedCompositeFieldContainer[RouterSync]
    def __init__(self, routers: _Optional[_Iterable[_Union[RouterSync, _Mapping]]] = ...) -> None: ...

class ExplainKeyRequest(_message.Message):
    __slots__ = ("key", "history", "pool")
    KEY_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    key: str
    history: int
    pool: str
    def __init__(self, key: _Optional[str] = ..., history: _Optional[int] = ..., pool: _Optional[str] = ...) -> None: ...

class KeyPlacement(_message.Message):
    __slots__ = ("version", "destinations")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DESTINATIONS_FIELD_NUMBER: _ClassVar[int]
    version: str
    destinations: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, version: _Optional[str] = ..., destinations: _Optional[_Iterable[str]] = ...) -> None: ...

class KeyExplanation(_message.Message):
    __slots__ = ("key", "seen", "rate_per_s", "rank", "keys_with_traffic", "replicas", "replicas_why", "admitted", "reason", "destinations", "destination_loads_per_s", "planned_rate_per_s", "cutoff_rate_per_s", "slots_used", "slots", "admitted_next", "next_destinations", "history", "version")
    KEY_FIELD_NUMBER: _ClassVar[int]
    SEEN_FIELD_NUMBER: _ClassVar[int]
    RATE_PER_S_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    KEYS_WITH_TRAFFIC_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_WHY_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DESTINATIONS_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_LOADS_PER_S_FIELD_NUMBER: _ClassVar[int]
    PLANNED_RATE_PER_S_FIELD_NUMBER: _ClassVar[int]
    CUTOFF_RATE_PER_S_FIELD_NUMBER: _ClassVar[int]
    SLOTS_USED_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_NEXT_FIELD_NUMBER: _ClassVar[int]
    NEXT_DESTINATIONS_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    key: str
    seen: bool
    rate_per_s: float
    rank: int
    keys_with_traffic: int
    replicas: int
    replicas_why: str
    admitted: bool
    reason: str
    destinations: _containers.RepeatedScalarFieldContainer[str]
    destination_loads_per_s: _containers.RepeatedScalarFieldContainer[float]
    planned_rate_per_s: float
    cutoff_rate_per_s: float
    slots_used: int
    slots: int
    admitted_next: bool
    next_destinations: _containers.RepeatedScalarFieldContainer[str]
    history: _containers.RepeatedCompositeFieldContainer[KeyPlacement]
    version: _plan_pb2.PlanVersion
    def __init__(self, key: _Optional[str] = ..., seen: _Optional[bool] = ..., rate_per_s: _Optional[float] = ..., rank: _Optional[int] = ..., keys_with_traffic: _Optional[int] = ..., replicas: _Optional[int] = ..., replicas_why: _Optional[str] = ..., admitted: _Optional[bool] = ..., reason: _Optional[str] = ..., destinations: _Optional[_Iterable[str]] = ..., destination_loads_per_s: _Optional[_Iterable[float]] = ..., planned_rate_per_s: _Optional[float] = ..., cutoff_rate_per_s: _Optional[float] = ..., slots_used: _Optional[int] = ..., slots: _Optional[int] = ..., admitted_next: _Optional[bool] = ..., next_destinations: _Optional[_Iterable[str]] = ..., history: _Optional[_Iterable[_Union[KeyPlacement, _Mapping]]] = ..., version: _Optional[_Union[_plan_pb2.PlanVersion, _Mapping]] = ...) -> None: ...

class GetPlanReportRequest(_message.Message):
    __slots__ = ("version", "pool")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    version: _plan_pb2.PlanVersion
    pool: str
    def __init__(self, version: _Optional[_Union[_plan_pb2.PlanVersion, _Mapping]] = ..., pool: _Optional[str] = ...) -> None: ...

class PlanReport(_message.Message):
    __slots__ = ("version", "windows", "dip_windows", "predicted_hit_rate", "hit_rate", "hit_gap", "predicted_imbalance", "imbalance", "destinations", "predicted_loads_per_s", "loads_per_s", "hit_rate_since_install", "q_cap", "predicted_utilisation", "utilisation", "p99_ms", "p99_target_ms", "capacity_verdict", "capacity_reason")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    DIP_WINDOWS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    HIT_GAP_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_IMBALANCE_FIELD_NUMBER: _ClassVar[int]
    IMBALANCE_FIELD_NUMBER: _ClassVar[int]
    DESTINATIONS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_LOADS_PER_S_FIELD_NUMBER: _ClassVar[int]
    LOADS_PER_S_FIELD_NUMBER: _ClassVar[int]
    HIT_RATE_SINCE_INSTALL_FIELD_NUMBER: _ClassVar[int]
    Q_CAP_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_UTILISATION_FIELD_NUMBER: _ClassVar[int]
    UTILISATION_FIELD_NUMBER: _ClassVar[int]
    P99_MS_FIELD_NUMBER: _ClassVar[int]
    P99_TARGET_MS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_VERDICT_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_REASON_FIELD_NUMBER: _ClassVar[int]
    version: _plan_pb2.PlanVersion
    windows: int
    dip_windows: int
    predicted_hit_rate: float
    hit_rate: float
    hit_gap: float
    predicted_imbalance: float
    imbalance: float
    destinations: _containers.RepeatedScalarFieldContainer[str]
    predicted_loads_per_s: _containers.RepeatedScalarFieldContainer[float]
    loads_per_s: _containers.RepeatedScalarFieldContainer[float]
    hit_rate_since_install: float
    q_cap: float
    predicted_utilisation: _containers.RepeatedScalarFieldContainer[float]
    utilisation: _containers.RepeatedScalarFieldContainer[float]
    p99_ms: _containers.RepeatedScalarFieldContainer[float]
    p99_target_ms: float
    capacity_verdict: str
    capacity_reason: str
    def __init__(self, version: _Optional[_Union[_plan_pb2.PlanVersion, _Mapping]] = ..., windows: _Optional[int] = ..., dip_windows: _Optional[int] = ..., predicted_hit_rate: _Optional[float] = ..., hit_rate: _Optional[float] = ..., hit_gap: _Optional[float] = ..., predicted_imbalance: _Optional[float] = ..., imbalance: _Optional[float] = ..., destinations: _Optional[_Iterable[str]] = ..., predicted_loads_per_s: _Optional[_Iterable[float]] = ..., loads_per_s: _Optional[_Iterable[float]] = ..., hit_rate_since_install: _Optional[float] = ..., q_cap: _Optional[float] = ..., predicted_utilisation: _Optional[_Iterable[float]] = ..., utilisation: _Optional[_Iterable[float]] = ..., p99_ms: _Optional[_Iterable[float]] = ..., p99_target_ms: _Optional[float] = ..., capacity_verdict: _Optional[str] = ..., capacity_reason: _Optional[str] = ...) -> None: ...

class ListPoolsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PoolInfo(_message.Message):
    __slots__ = ("name", "models", "destinations", "namespace", "running", "error", "failures", "installed", "mode", "role")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    DESTINATIONS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    INSTALLED_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    name: str
    models: _containers.RepeatedScalarFieldContainer[str]
    destinations: _containers.RepeatedScalarFieldContainer[str]
    namespace: str
    running: bool
    error: str
    failures: int
    installed: _plan_pb2.PlanVersion
    mode: Mode
    role: str
    def __init__(self, name: _Optional[str] = ..., models: _Optional[_Iterable[str]] = ..., destinations: _Optional[_Iterable[str]] = ..., namespace: _Optional[str] = ..., running: _Optional[bool] = ..., error: _Optional[str] = ..., failures: _Optional[int] = ..., installed: _Optional[_Union[_plan_pb2.PlanVersion, _Mapping]] = ..., mode: _Optional[_Union[Mode, str]] = ..., role: _Optional[str] = ...) -> None: ...

class ListPoolsResponse(_message.Message):
    __slots__ = ("pools", "unclaimed_keys", "pools_file", "pools_file_error", "stranded_keys")
    POOLS_FIELD_NUMBER: _ClassVar[int]
    UNCLAIMED_KEYS_FIELD_NUMBER: _ClassVar[int]
    POOLS_FILE_FIELD_NUMBER: _ClassVar[int]
    POOLS_FILE_ERROR_FIELD_NUMBER: _ClassVar[int]
    STRANDED_KEYS_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[PoolInfo]
    unclaimed_keys: int
    pools_file: str
    pools_file_error: str
    stranded_keys: int
    def __init__(self, pools: _Optional[_Iterable[_Union[PoolInfo, _Mapping]]] = ..., unclaimed_keys: _Optional[int] = ..., pools_file: _Optional[str] = ..., pools_file_error: _Optional[str] = ..., stranded_keys: _Optional[int] = ...) -> None: ...
