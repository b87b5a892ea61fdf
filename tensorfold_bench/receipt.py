"""The receipt's data as typed objects: `Receipt.from_dict(store.read(path))`, and back with
`to_dict()`. The session builds the receipt's data as a dict, its streams' records the client's
objects (client.stream.StreamRecord, same fields as `Record`), which report.store writes as JSON;
the report and the analysis read it through these classes (`as_receipt` takes either).

Every class is a `Node`: its fields are the keys a receipt of any schema version may hold, each
None where the receipt lacks it. A receipt is a record of what happened, written over many
versions, so reading it must lose nothing: a key no field names is kept in `extra`, and the keys'
order and presence as read are kept too, so `from_dict(d).to_dict() == d` for every receipt
(a key absent from `d` stays absent, a key present with None stays present). Maps whose keys are
data (variant names, figure names, stream names) are dicts; what the engine says of itself
(`EngineInfo.engine`, its config) and a scenario's own settings and figures stay dicts, typed as
such, because their keys belong to the engine and the scenario, not to the receipt."""
from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar

N = TypeVar("N", bound="Node")


@dataclass(kw_only=True)
class Node:
    """One object of a receipt: typed fields, with what it read kept to give back (see above)."""
    extra: dict[str, Any] = field(default_factory=dict, repr=False)  # keys no field names
    _keys: tuple[str, ...] | None = field(default=None, repr=False, compare=False)  # as read, in order

    @classmethod
    def from_dict(cls: type[N], d: dict) -> N:
        kinds = _kinds(cls)
        node = cls(**{k: _load(kinds[k], v) for k, v in d.items() if k in kinds},
                   extra={k: v for k, v in d.items() if k not in kinds})
        node._keys = tuple(d)
        return node

    def holds(self, key: str) -> bool:
        """Whether `key` was read (even as None) or set since: a None a writer stored is not a key
        an older writer never wrote."""
        return key in (self._keys or ()) or key in self.extra or getattr(self, key, None) is not None

    def __bool__(self) -> bool:
        """False for an object read from an empty dict (and holding nothing since), as that dict was."""
        return bool(self._keys or self.extra) or any(getattr(self, k) is not None for k in _kinds(type(self)))

    def to_dict(self) -> dict:
        """The keys as read, in their order, then any field set since (to something but None)."""
        kinds = _kinds(type(self))
        keys = list(self._keys) if self._keys is not None else []
        keys += [k for k in kinds if k not in keys and getattr(self, k) is not None]
        keys += [k for k in self.extra if k not in keys]
        return {k: _dump(kinds[k], getattr(self, k)) if k in kinds else self.extra[k] for k in keys}


@functools.cache
def _kinds(cls: type) -> dict[str, Any]:
    """field name -> the Node class its value (or each of its items) is read into; Any for a plain value."""
    hints = typing.get_type_hints(cls)
    return {f.name: _node_kind(hints[f.name]) for f in dataclasses.fields(cls) if f.name not in ("extra", "_keys")}


def _node_kind(tp: Any) -> Any:
    """`X | None` -> X; `list[X]` -> (list, X); `dict[str, X]` -> (dict, X), for a Node class X (else
    Any: the value is kept as it is); a union of several -> ("any", kinds), told apart by the value's shape."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        kinds = [k for a in typing.get_args(tp) if (k := _node_kind(a)) is not Any]
        return Any if not kinds else kinds[0] if len(kinds) == 1 else ("any", tuple(kinds))
    origin = typing.get_origin(tp)
    if origin in (list, dict):
        inner = _node_kind(typing.get_args(tp)[-1])
        return (origin, inner) if inner is not Any else Any
    return tp if isinstance(tp, type) and issubclass(tp, Node) else Any


def _fits(kind: Any, v: Any) -> bool:
    return isinstance(v, kind[0]) if isinstance(kind, tuple) else isinstance(v, dict)


def _load(kind: Any, v: Any) -> Any:
    # a value not of the declared shape (an older writer's None or string) is kept as it is
    if kind is Any:
        return v
    if isinstance(kind, tuple) and kind[0] == "any":
        return next((_load(k, v) for k in kind[1] if _fits(k, v)), v)
    if isinstance(kind, tuple):
        container, inner = kind
        if container is list and isinstance(v, list):
            return [_load(inner, x) for x in v]
        if container is dict and isinstance(v, dict):
            return {k: _load(inner, x) for k, x in v.items()}
        return v
    return kind.from_dict(v) if isinstance(v, dict) else v


def _dump(kind: Any, v: Any) -> Any:
    if kind is Any:
        return v
    if isinstance(kind, tuple) and kind[0] == "any":
        return next((_dump(k, v) for k in kind[1] if _fits(k, v) or (not isinstance(k, tuple) and isinstance(v, k))), v)
    if isinstance(kind, tuple):
        container, inner = kind
        if container is list and isinstance(v, list):
            return [_dump(inner, x) for x in v]
        if container is dict and isinstance(v, dict):
            return {k: _dump(inner, x) for k, x in v.items()}
        return v
    return v.to_dict() if isinstance(v, Node) else v


# ---- the session's settings and the host ----------------------------------------------------

@dataclass(kw_only=True)
class Host(Node):
    python: str | None = None
    platform: str | None = None
    machine: str | None = None
    tfbench: str | None = None
    harness_commit: str | None = None


@dataclass(kw_only=True)
class EngineSettings(Node):
    """How tfbench starts tfengine (settings.engine): the flags every variant shares."""
    model: str | None = None
    device: str | None = None
    dtype: str | None = None
    parallel: int | None = None
    prefill_rows: int | None = None
    max_model_len: int | None = None
    seed: int | None = None
    trace: bool | None = None
    extra_args: list[str] | None = None
    tensor_parallel: int | None = None


@dataclass(kw_only=True)
class Sampling(Node):
    temperature: float | None = None
    seed: int | None = None
    request_seed: str | None = None


@dataclass(kw_only=True)
class Settings(Node):
    engine: EngineSettings | None = None
    engine_flags: list[str] | None = None
    script: dict[str, Any] | None = None  # the scenario's own settings (b_at, levels, a script's path, ...)
    order: list[str] | None = None
    url: str | None = None
    plain_check: bool | None = None
    run_dir: str | None = None
    base: str | None = None
    margin: float | None = None
    token_ids: bool | None = None
    sampling: Sampling | None = None
    scaled_down: Any = None
    script_text: str | None = None
    figure_keys: list[str] | None = None
    seed: int | None = None
    workload: dict[str, Any] | None = None
    levels: list[Level] | None = None  # a load's levels, as set (a run's Level holds what each played)
    slo: dict[str, Any] | None = None
    max_concurrency: int | None = None
    late_p99_ms: float | None = None
    # the gate's
    preset: str | None = None
    preset_values: dict[str, Any] | None = None  # the preset's sizes (scenarios.gate's Preset)
    base_ref: str | None = None
    long_margin: float | None = None
    new_env: dict[str, str] | None = None
    accept_new_outputs: bool | None = None
    load_rate: float | None = None


# ---- variants, servers and what they say of themselves ----------------------------------------

@dataclass(kw_only=True)
class Source(Node):
    path: str | None = None
    commit: str | None = None
    ref: str | None = None
    dirty: bool | None = None


@dataclass(kw_only=True)
class Variant(Node):
    name: str | None = None
    args: list[str] | None = None
    env: dict[str, str] | None = None
    ref: str | None = None
    source: Source | None = None
    command: list[str] | None = None
    health: str | None = None
    start_timeout: float | None = None
    url: str | None = None


@dataclass(kw_only=True)
class Server(Node):
    """A run's server process as launched (or simulated)."""
    load_before: Any = None
    pgid: int | None = None
    argv: list[str] | None = None
    root: str | None = None
    command: str | None = None
    checked: Any = None
    simulated: Any = None


@dataclass(kw_only=True)
class EngineInfo(Node):
    """tfengine's /v1/engine: its free-form description of the device and kernels, and its config."""
    engine: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    commit: str | None = None
    prefill_share: float | None = None
    nonce: str | None = None
    caps: dict[str, Any] | None = None
    simulated: Any = None
    device_name: str | None = None
    model: str | None = None


@dataclass(kw_only=True)
class Identity(Node):
    """A server's own account of itself: /v1/models, its version, how it was launched."""
    url: str | None = None
    name: str | None = None
    version: str | None = None
    model: str | None = None
    owned_by: str | None = None
    root: str | None = None
    max_model_len: int | None = None
    vocab_size: int | None = None
    launched: bool | None = None
    command: str | None = None
    checked: Any = None
    models: list[dict[str, Any]] | None = None
    system_fingerprint: str | None = None


@dataclass(kw_only=True)
class Environment(Node):
    engine: EngineInfo | None = None
    models: dict[str, Any] | None = None
    simulated: Any = None
    device: dict[str, Any] | None = None
    model: dict[str, Any] | None = None


@dataclass(kw_only=True)
class Simulated(Node):
    """The cost profile a simulated receipt played on, and what a simulation cannot know."""
    profile: str | None = None
    device: str | None = None
    device_type: str | None = None
    model: str | None = None
    engine_commit: str | None = None
    source: str | None = None
    created: str | None = None
    fits: dict[str, Any] | None = None
    cannot_know: list[str] | None = None


# ---- runs: streams, their token records, the engine's trace ------------------------------------

@dataclass(kw_only=True)
class Record(Node):
    """One stream's raw record: when it was sent, every token's time and id, how it ended."""
    name: str | None = None
    path: str | None = None
    prompt_len: int | None = None
    max_tokens: int | None = None
    scheduled: float | None = None
    sent: float | None = None
    token_times: list[float] | None = None
    token_ids: list[int] | None = None
    finish_reason: str | None = None
    error: str | None = None
    usage: dict[str, Any] | None = None
    server_sha: str | None = None
    cancelled: Any = None
    ended: float | None = None
    counted_by: str | None = None
    cached_tokens: int | None = None
    system_fingerprint: str | None = None


@dataclass(kw_only=True)
class StreamHash(Node):
    tokens: int | None = None
    sha256: str | None = None
    server_sha: str | None = None
    server_sha_matches: bool | None = None


@dataclass(kw_only=True)
class TraceEvent(Node):
    """One step of the engine's lane host: a prompt cut or a decode round."""
    t: float | None = None
    dur: float | None = None
    kind: str | None = None
    rows: int | None = None
    streams: Any = None
    seq: int | None = None


@dataclass(kw_only=True)
class Batch(Node):
    """A sweep's burst: one level, cell and rep."""
    level: int | None = None
    cell: int | None = None
    rep: int | None = None
    tok_s: float | None = None
    tokens: int | None = None
    wall_s: float | None = None
    hashes: list[str] | None = None
    errors: list[str] | None = None
    sent: list[float] | None = None
    last_token: float | None = None
    gaps_us: list[list[int]] | None = None
    counted_by: str | None = None
    system_fingerprint: str | None = None
    peak_open: int | None = None
    server_open: Any = None
    server_running: Any = None
    server_waiting: Any = None


@dataclass(kw_only=True)
class Request(Node):
    """A load level's request record."""
    id: Any = None
    kind: str | None = None
    warmup: bool | None = None
    scheduled: float | None = None
    released: float | None = None
    sent: float | None = None
    gaps_us: list[int] | None = None
    ended: float | None = None
    error: str | None = None
    prompt_len: int | None = None
    max_tokens: int | None = None
    tokens: int | None = None
    cached: int | None = None
    sha: str | None = None
    pkey: Any = None
    session: Any = None
    turn: int | None = None


@dataclass(kw_only=True)
class Level(Node):
    """A load level: its kind, value and label as set, and in a run its requests and their figures."""
    kind: str | None = None
    value: Any = None
    label: str | None = None
    source: Any = None
    client: dict[str, Any] | None = None
    records: list[Request] | None = None
    figures: dict[str, Any] | None = None


@dataclass(kw_only=True)
class Cold(Node):
    """How a run's long prompt was held to be cold: by the server's cached_tokens, or by being fresh."""
    by: str | None = None
    cached_tokens: int | None = None
    held: bool | None = None


@dataclass(kw_only=True)
class Run(Node):
    index: int | None = None
    variant: str | None = None
    figures: dict[str, Any] | None = None  # figure name -> value; the names are the scenario's
    records: dict[str, Record] | None = None
    hashes: dict[str, StreamHash] | None = None
    trace: list[TraceEvent] | None = None
    log: str | None = None
    server: Server | None = None
    engine: EngineInfo | None = None
    started: Any = None
    batches: list[Batch] | None = None
    errors: Any = None
    cold: Cold | None = None
    counted_by: str | None = None
    system_fingerprint: str | None = None
    identity: Identity | None = None
    t0: float | None = None
    client: dict[str, Any] | None = None  # the client's self-check (tensorfold_bench.client.selfcheck)
    levels: list[Level] | None = None
    alone: dict[str, Any] | None = None
    valid: bool | None = None
    invalid_reasons: list[str] | None = None
    lanes: Any = None
    # a gate run's parts, each as its scenario keeps a run (batches, records, figures, client)
    sweep: dict[str, Any] | None = None
    long_prompt: dict[str, Any] | None = None
    load: dict[str, Any] | None = None


@dataclass(kw_only=True)
class Idle(Node):
    confirmed: bool | None = None
    waited_s: float | None = None


@dataclass(kw_only=True)
class Alone(Node):
    """A variant's B sent alone to an idle server: the prompt's own time, for reference."""
    record: Record | None = None
    run: Any = None
    b_first_token: float | None = None
    error: str | None = None
    idle: Idle | None = None
    trace: list[TraceEvent] | None = None
    a_record: Record | None = None


@dataclass(kw_only=True)
class Plain(Node):
    """The plain reference: one stream at a time, whole prefill, no cache, no drafts."""
    variant: Variant | None = None
    records: dict[str, Record] | None = None
    hashes: dict[str, StreamHash] | None = None
    log: str | None = None
    server: Server | None = None
    engine: EngineInfo | None = None


# ---- what was computed: exactness, predictions, hashes ----------------------------------------

@dataclass(kw_only=True)
class Comparison(Node):
    """One stream's reply against another's: equal, or where it diverges."""
    stream: str | None = None
    equal: bool | None = None
    detail: str | None = None
    diverge_at: int | None = None


@dataclass(kw_only=True)
class ReplyCount(Node):
    """A load receipt's replies of one variant: how many were equal (to the first base run's, or
    to the plain reference's), of how many."""
    equal: int | None = None
    of: int | None = None
    unknown: int | None = None
    no_reference: int | None = None


@dataclass(kw_only=True)
class ServerSha(Node):
    """The servers' token_sha against ours: how many matched, differed, were absent, and which
    runs' server sent none."""
    match: int | None = None
    mismatch: int | None = None
    absent: int | None = None
    none_from_runs: list[int] | None = None


@dataclass(kw_only=True)
class Exactness(Node):
    # run index (or variant) -> its streams compared; a load receipt's: variant -> its count
    across_runs: dict[str, list[Comparison] | ReplyCount] | None = None
    refs: dict[str, Any] | None = None
    vs_plain: dict[str, list[Comparison] | ReplyCount] | None = None
    server_sha: ServerSha | None = None
    a_prefix: Any = None
    hashes: dict[str, dict[str, Any]] | None = None
    no_reply: dict[str, Any] | None = None
    flagged: Any = None
    ok: bool | None = None
    not_judged: Any = None
    # the gate's: per part, label -> its replies' count
    sweep: dict[str, SweepHashes] | None = None
    long_prompt: dict[str, ReplyCount] | None = None
    load: dict[str, ReplyCount] | None = None


@dataclass(kw_only=True)
class PredictionItem(Node):
    variant: str | None = None
    key: str | None = None
    lo: float | None = None
    hi: float | None = None
    value: float | None = None
    status: str | None = None


@dataclass(kw_only=True)
class Predictions(Node):
    """Read and stamped before the first run, then checked against the results."""
    path: str | None = None
    sha256: str | None = None
    read_at: str | None = None
    items: list[PredictionItem] | None = None
    hits: int | None = None
    checked: int | None = None


@dataclass(kw_only=True)
class SweepHashes(Node):
    """A sweep's replies' hashes against the reference of each prompt."""
    prompts: Any = None
    replies: int | None = None
    equal: int | None = None
    reference: dict[str, Any] | None = None
    flagged: Any = None
    ok: bool | None = None
    unknown: int | None = None


@dataclass(kw_only=True)
class Partial(Node):
    why: str | None = None
    done: int | None = None
    total: int | None = None
    missing: list[str] | None = None


@dataclass(kw_only=True)
class Receipt(Node):
    schema: str | None = None
    scenario: str | None = None
    created: str | None = None
    host: Host | None = None
    settings: Settings | None = None
    variants: list[Variant] | None = None
    runs: list[Run] | None = None
    alone: dict[str, Alone] | None = None  # variant -> its B alone
    plain: Plain | None = None
    environment: Environment | None = None
    not_run: list[str] | None = None
    exactness: Exactness | None = None
    predictions: Predictions | None = None
    expected_hashes: dict[str, Any] | None = None
    # figure -> its statistics, each read through tensorfold_bench.analysis.stats.FigureStats.from_dict
    stats: dict[str, dict[str, Any]] | None = None
    hashes: SweepHashes | None = None
    identities: dict[str, Identity] | None = None  # variant -> its server's account
    vocab: int | None = None
    partial: Partial | None = None
    simulated: Simulated | None = None
    # the gate's verdict, why, and what it could see
    passed: bool | None = None
    reasons: list[str] | None = None
    notes: list[str] | None = None
    detectable: dict[str, float] | None = None
    schedule: dict[str, Any] | None = None  # the schedule layer's section (scenarios.gate_schedule)
    missing_base: str | None = None
    accepted_outputs: Any = None


def as_receipt(data: Receipt | dict) -> Receipt:
    """The typed receipt, from a receipt's data as read (report.store.read) or already typed."""
    return data if isinstance(data, Receipt) else Receipt.from_dict(data)
