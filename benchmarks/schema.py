"""The `results.json` format, defined once: every section's shape as a `TypedDict`.

The producers (`scenarios`, `training`, `real_models`, `scaling`, `containers`,
`construction`, `serialisation`, `runner`) build these, the report reads them, and the
tests write their hand-made results with them. The committed
`benchmarks/results/<backend>/results.json` and the notebook's plotting code read the
same format, so a key is renamed or dropped only together with them.

Conventions: times are medians with quartiles (`Stat`: µs, ms or MB/s, as the key
says); a ratio is paired per round (`Ratio`, the same shape: median and quartiles of
the per-round ratios); a cell that could not run holds `Failed` instead of numbers;
a variant is named `"<implementation> / <jit>"` (`models.variant_name`). Non-finite
numbers are written as `null` (`report.write_json`).

Besides the types, the two rules that fill this format's text fields live here, so
that a producer that must not import JAX (`serialisation`) shares them:
`describe_error` (the `fails` / `error` text) and `judge` (a target's status).
"""

import math
import re
from typing import Any, Literal

from typing_extensions import NotRequired, TypedDict

# --------------------------------------------------------------------------------------
# Building blocks.
# --------------------------------------------------------------------------------------


class Stat(TypedDict):
    """Median and quartiles of samples (`timing.summary`), and how many there were."""

    median: float
    q1: float
    q3: float
    n: int


# A paired ratio: the `Stat` of the per-round ratios `cell / reference` (for a speed
# or throughput ratio, `reference / cell`), so that a machine's drift cancels.
Ratio = Stat


Comparison = Literal["<=", ">="]  # how a target compares its value with its threshold


class Failed(TypedDict):
    """A cell that could not run, with the reason (`describe_error`)."""

    fails: str


class DispatchStat(Stat):
    """A variant's per-call dispatch time, µs, with its paired ratios by variant."""

    ratios: dict[str, Ratio]


# --------------------------------------------------------------------------------------
# Run header.
# --------------------------------------------------------------------------------------


class Machine(TypedDict):
    """Where and with what the run was made (`runner.describe_machine`)."""

    mode: str
    date: str
    platform: str
    processor: str
    cpu_count: int | None
    cpus_usable: int | None
    python: str
    backend: str
    device_kind: str
    device_count: int
    versions: dict[str, str | None]
    autostatic_import_error: str | None
    git_commit: str | None
    env: dict[str, str | None]


# --------------------------------------------------------------------------------------
# `tree_ops`: one group per synthetic model (`mlp-4`, `transformer`, ...).
# --------------------------------------------------------------------------------------


class TreeInfo(TypedDict):
    """The shape of one implementation's pytree."""

    leaves: int
    array_leaves: int
    treedef_nodes: int
    treedefs_equal: bool  # of two equal, separately built models
    first_paths: list[str]


class TreeOpsGroup(TypedDict):
    """Pytree operations and dispatch of one model, every cell interleaved."""

    model: str
    rounds: int
    rounds_slow_ops: int
    unavailable: dict[str, str]  # implementation -> why it could not be built
    info: dict[str, TreeInfo]
    ops_us: dict[str, dict[str, Stat]]  # implementation -> operation -> µs
    ratios: dict[str, dict[str, dict[str, Ratio]]]  # reference -> impl -> operation
    dispatch_us: dict[str, DispatchStat | Failed]  # by variant


# --------------------------------------------------------------------------------------
# `async_dispatch`.
# --------------------------------------------------------------------------------------

# One variant's steps with host work between them. `wall vs eqx-static /
# eqx.filter_jit` repeats `wall_ratios`' entry for that variant (`None` where it was
# not measured); it is kept because results.json has always had it.
AsyncVariant = TypedDict(
    "AsyncVariant",
    {
        "wall_ms_per_step": float,
        "wall_iqr_ms": list[float],
        "no_host_ms_per_step": float,
        "serial_ms_per_step": float,
        "ideal_ms_per_step": float,
        "hidden_ms_per_step": float,
        "hidden_fraction": float,
        "hidden_fraction_iqr": list[float],
        "wall vs eqx-static / eqx.filter_jit": Ratio | None,
        "wall_ratios": dict[str, Ratio],
    },
)


class AsyncDispatch(TypedDict):
    """Host work hidden behind device work, per variant."""

    depth: int
    steps: int
    rounds: int
    matmuls: int
    matrix: list[int]
    host_ms_per_step: float
    device_ms_per_step: float
    variants: dict[str, AsyncVariant | Failed]


# --------------------------------------------------------------------------------------
# `retracing`.
# --------------------------------------------------------------------------------------


class TraceCount(TypedDict):
    """How often a fresh jitted function traced in one scenario."""

    stale: NotRequired[bool]  # the result ignored a changed value
    error: NotRequired[str]
    count: int
    warnings: NotRequired[list[str]]


class ScriptedScenario(TypedDict):
    """One scripted retracing scenario on the MLP."""

    description: str
    ideal: int
    static_values_equal: bool


class ContrastScenario(TypedDict):
    """One scenario where eqx.Module and AutoModule retrace differently."""

    description: str
    why: str
    eqx_static_fields: list[str]  # what the fair twin marks static
    counts: dict[str, TraceCount]  # by variant


class Contrasts(TypedDict):
    """Every contrast scenario, each model rebuilt before each of `calls` calls."""

    calls: int
    variants: list[str]
    scenarios: dict[str, ContrastScenario]


class Retracing(TypedDict):
    """Trace counts of the scripted scenarios, and the contrasts."""

    depth: int
    repeats: int
    scenarios: dict[str, ScriptedScenario]
    counts: dict[str, dict[str, TraceCount]]  # variant -> scenario
    contrasts: Contrasts


# --------------------------------------------------------------------------------------
# `first_call` and `first_call_forward`: one entry per MLP depth (its key, a string).
# --------------------------------------------------------------------------------------

# Milliseconds of trace + compile + run. `vs eqx-static / jax.jit` repeats
# `ratios`' entry for the fair twin; it is kept because results.json has always had it.
FirstCallVariant = TypedDict(
    "FirstCallVariant",
    {
        "median": float,
        "q1": float,
        "q3": float,
        "n": int,
        "samples_ms": list[float],
        "vs eqx-static / jax.jit": NotRequired[Ratio],
        "ratios": dict[str, Ratio],
    },
)


class FirstCall(TypedDict):
    """Time to first call of a fresh jitted function on one MLP."""

    n: int
    fn: str  # "probe" (the dispatch benchmark's function) or "forward"
    reps: int
    variants: dict[str, FirstCallVariant | Failed]


# --------------------------------------------------------------------------------------
# `training`: one entry per trained model.
# --------------------------------------------------------------------------------------


class TrainingVariant(TypedDict):
    """Training-step throughput of one variant; ratios are of throughput (> 1 more)."""

    ms_per_step: float
    ms_iqr: list[float]
    steps_per_s: float
    rounds: int
    first_call_s: float
    throughput_ratios: dict[str, Ratio]


class Training(TypedDict):
    """Training-step throughput of one model."""

    model: str
    steps_per_batch: int
    variants: dict[str, TrainingVariant | Failed]


# --------------------------------------------------------------------------------------
# `serialisation`: the checkpoint benchmark.
# --------------------------------------------------------------------------------------


class MeasuredTarget(TypedDict):
    """A stated target with its measured value, not yet judged (`judge` does that)."""

    target: str
    value: float | None
    op: Comparison
    threshold: float
    detail: str
    note: str


class CheckpointRatios(TypedDict):
    """Ours / Equinox's: speeds (> 1 faster) and peak memory (< 1 less; `None` where
    Equinox's peak is too small to divide by)."""

    save_speed: float | None
    save_not_durable_speed: float | None
    load_host_speed: float | None
    load_device_speed: float | None
    save_peak_rss: float | None
    load_host_peak_rss: float | None
    load_device_peak_rss: float | None


class Checkpoint(TypedDict):
    """Save and load speed and peak memory per cell (`"<op>/<implementation>"`)."""

    size_mb: float
    quick: bool
    rounds: int
    seconds: dict[str, list[float]]
    mb_per_s: dict[str, Stat]
    peak_rss_mb: dict[str, float]
    peak_method: list[str]
    paired: dict[str, dict[str, Ratio]]  # cell -> "vs eqx" / "vs numpy floor"
    ratios: CheckpointRatios
    targets: list[MeasuredTarget]
    table: str  # markdown, shown as it is in the report


class Serialisation(TypedDict):
    """The checkpoint section: `results` when `status` is `ok`, else `error`."""

    status: str  # "ok", "skipped", "missing" or "failed"
    results: NotRequired[Checkpoint]
    error: NotRequired[str]


# --------------------------------------------------------------------------------------
# `real_models`: models built from eqx.nn layers.
# --------------------------------------------------------------------------------------


class RealInfo(TypedDict):
    """The shape of one implementation's pytree."""

    leaves: int
    treedef_nodes: int
    treedefs_equal: bool
    tree_at_layer_same_treedef: NotRequired[bool]


class RealModel(TypedDict):
    """Every operation of one model: `ops_us[op][impl]`, `ratios[op][reference]` (of
    autostatic to the reference)."""

    rounds: int
    info: dict[str, RealInfo]
    ops_us: dict[str, dict[str, Stat | Failed]]
    ratios: dict[str, dict[str, Ratio]]


class RealModels(TypedDict):
    """Every eqx.nn model, and what its operations and extra variants are."""

    impls: list[str]
    ops: dict[str, str]  # operation -> its label
    build_note: str
    models: dict[str, RealModel]
    variant_notes: dict[str, str]  # what each extra eqx-static configuration is


# --------------------------------------------------------------------------------------
# `construction`: building, tracing and compiling.
# --------------------------------------------------------------------------------------


class Spread(TypedDict):
    """Median, lowest and highest of a few values (one per process or process pair),
    and how many there were."""

    median: float
    min: float
    max: float
    n: int


class ConstructionBuilds(TypedDict):
    """Building models, every cell interleaved in one run: `ops_us[op][impl]`, and
    `ratios[op]["<impl> / <reference>"]`, paired per round."""

    rounds: int
    layers: int  # the made `eqx.nn.Linear(8, 8)`s wrapped by `wrap_layers`
    arrays: int  # the scalar arrays wrapped by `wrap_arrays`
    blocks: int  # the transformer blocks of `build_init`
    ops: dict[str, str]  # op -> its label
    impls: dict[str, str]  # implementation -> what it is
    ops_us: dict[str, dict[str, Stat | Failed]]
    ratios: dict[str, dict[str, Ratio]]
    note: str


class TraceTimes(TypedDict):
    """`jax.jit(fresh_fn).trace(*args)` of the eqx.nn transformer's forward pass and
    training step: `ms[fn][variant]`, and autostatic's ratio to the fair twin per
    function, paired per repetition."""

    reps: int
    blocks: int
    fns: dict[str, str]  # function -> what it is
    variants: dict[str, str]  # variant -> how it is jitted
    ms: dict[str, dict[str, Stat | Failed]]
    ratios: dict[str, Ratio]
    note: str


class EcosystemProcess(TypedDict):
    """One process of `benchmarks/ecosystem_trace.py`: whether its libraries were
    rebased, and per workload its medians (`lower_s`, `compile_s`, `total_s`)."""

    rebased: bool
    medians_s: dict[str, dict[str, float]]


class EcosystemWorkload(TypedDict):
    """One workload: per side, the per-process medians of trace + compile (ms), and
    the ratios rebased / stock of each adjacent pair of processes (of the total, and
    of its lowering and compiling parts)."""

    stock_ms: Spread
    rebased_ms: Spread
    ratio: Spread
    lower_ratio: Spread
    compile_ratio: Spread


class EcosystemTrace(TypedDict):
    """Trace + compile of diffrax / optimistix workloads, stock and rebased onto
    AutoModule, in alternating processes (not paired within a process)."""

    processes_per_side: int
    reps: int
    rebase_checked: bool  # every rebased process had AutoModule classes, no stock one
    rebase_summary: str  # what `python -m autostatic.rebased` reported
    command: str
    platform: str  # the backend the processes ran on (the host's CPU beside a TPU)
    processes: list[EcosystemProcess]
    workloads: dict[str, EcosystemWorkload]
    note: str


class Construction(TypedDict):
    """The construction section: each part absent if its step failed (the error is
    in `errors`)."""

    builds: NotRequired[ConstructionBuilds]
    trace: NotRequired[TraceTimes]
    ecosystem: NotRequired[EcosystemTrace]


# --------------------------------------------------------------------------------------
# Targets, errors, and the whole file.
# --------------------------------------------------------------------------------------

MET, MISSED, NOT_AVAILABLE = "MET", "MISSED", "N/A"
NOT_JUDGED = "not judged (smoke run)"
INFO_PREFIX = "info: "  # before the status of a row shown for information only


class Target(TypedDict):
    """A judged target: its `status` is MET, MISSED, N/A or NOT_JUDGED, after
    INFO_PREFIX for a row shown for information only."""

    target: str
    where: str
    value: float | None
    op: Comparison
    threshold: float
    status: str
    detail: str
    note: str
    section: str


class SectionError(TypedDict):
    """A section that crashed (the others still ran)."""

    section: str
    error: str


# --------------------------------------------------------------------------------------
# `scaling`.
# --------------------------------------------------------------------------------------


class ScalingDepth(TypedDict):
    """One depth of one kind of layer: per `"<impl>|<op>"` the time of one call (µs),
    per op AutoModule's paired ratio to the fair twin (`dispatch_filter_jit`: its
    `jax.jit` dispatch to `eqx.filter_jit`'s on the unmarked twin, absent from results
    made before it was measured), and the Python bytes one model keeps per
    implementation, with their ratio."""

    us: dict[str, Stat]
    ratios: dict[str, Ratio]
    memory_bytes: dict[str, float]
    memory_ratio: float


class Scaling(TypedDict):
    """`kinds`: `"own"` (the user's own AutoModule layers) and `"eqx.nn"`, each by
    depth (as a string)."""

    sizes: list[int]
    kinds: dict[str, dict[str, ScalingDepth]]


# --------------------------------------------------------------------------------------
# `containers`: one entry per kind of container.
# --------------------------------------------------------------------------------------


class ContainersSize(TypedDict):
    """One kind at one size: per `"<impl>|<op>"` the time of one call (µs); AutoModule's
    paired ratios (`flatten`, `unflatten`, `dispatch`: to the fair baseline;
    `dispatch_filter_jit`: its `jax.jit` dispatch to `eqx.filter_jit`'s on the
    unmarked twin); the Python bytes one model keeps, AutoModule's and the fair twin's
    class's holding the same containers, with their ratio."""

    us: dict[str, Stat]
    ratios: dict[str, Ratio]
    memory_bytes: dict[str, float]
    memory_ratio: float


class ContainersKind(TypedDict):
    """One kind of container: what its fair baseline holds (`SAME_CONTAINERS`, or in
    words what else), and each size (its number of entries, as a string)."""

    fair: str
    sizes: dict[str, ContainersSize]


SAME_CONTAINERS = "the same containers"  # a fair baseline holding the kind's own


class Results(TypedDict):
    """The whole `results.json`. A section that did not run (`--only`) is absent;
    one that ran but failed is `None` (or, for the per-model sections, empty)."""

    machine: Machine
    settings: dict[str, Any]  # `dataclasses.asdict` of `settings.Settings`
    sections: list[str]
    tree_ops: NotRequired[dict[str, TreeOpsGroup]]
    async_dispatch: NotRequired[AsyncDispatch | None]
    retracing: NotRequired[Retracing | None]
    first_call: NotRequired[dict[str, FirstCall]]
    first_call_forward: NotRequired[dict[str, FirstCall]]
    training: NotRequired[dict[str, Training]]
    serialisation: NotRequired[Serialisation | None]
    real_models: NotRequired[RealModels | None]
    construction: NotRequired[Construction]
    scaling: NotRequired[Scaling | None]
    containers: NotRequired[dict[str, ContainersKind]]
    targets: list[Target]
    errors: list[SectionError]
    plots: NotRequired[list[str]]
    plots_note: NotRequired[str]
    files: NotRequired[list[str]]
    wall_s: NotRequired[float]


# --------------------------------------------------------------------------------------
# The rules behind two text fields.
# --------------------------------------------------------------------------------------


def judge(value: float | None, op: str, threshold: float) -> str:
    """A target's status: MET or MISSED by `value op threshold`, N/A without a
    finite value."""
    if value is None or not math.isfinite(value):
        return NOT_AVAILABLE
    met = value <= threshold if op == "<=" else value >= threshold
    return MET if met else MISSED


_JAX_NON_ARRAY = re.compile(r"of type <class '([^']+)'>.* at path (\S+?)\.?$")


def describe_error(err: BaseException) -> str:
    """One line for a `fails` / `error` field: the exception type and the first line
    of its message, shortened (and jax.jit's non-array-leaf message condensed)."""
    lines = str(err).strip().splitlines()
    first = lines[0] if lines else ""
    found = _JAX_NON_ARRAY.search(first)
    if found and "abstract array" in first:  # jax.jit given a non-array leaf
        kind = found[1].rsplit(".", 1)[-1]
        first = f"jax.jit: non-array leaf of type {kind} at path {found[2]}"
    first = re.sub(r" at 0x[0-9a-f]+", "", first)
    return f"{type(err).__name__}: {first[:240]}"
