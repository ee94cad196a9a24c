"""Targets: fixed thresholds, never adjusted to the results, judged MET / MISSED.

Each section of results.json has one rule (`TARGET_RULES`) that reads its
measurements and states its targets; `evaluate_targets` judges them all, the
checkpoint benchmark's included (it only measures them). A target that cannot be
evaluated is N/A with the reason; a row marked `(info)` is shown beside a target for
information and is not one of the stated targets. The scaling, containers and
construction rules are in their sections' modules (`scaling`, `containers`,
`construction`), which build on this one.
"""

from collections.abc import Callable, Collection, Iterable
from typing import cast, TypeVar

from .. import models as M
from ..schema import (
    Comparison,
    Failed,
    FirstCall,
    FirstCallVariant,
    INFO_PREFIX,
    judge,
    MET,
    MISSED,
    NOT_JUDGED,
    Ratio,
    RealModel,
    RealModels,
    Results,
    Serialisation,
    Stat,
    Target,
    TraceCount,
    TrainingVariant,
    TreeOpsGroup,
)
from .format import (
    AUTO_JIT,
    DICT_JIT,
    EQX_FILTER_FILTER,
    EQX_STATIC_FILTER,
    FAIR_TWIN,
    fmt_ratio,
    fmt_stat_us,
    mlp_depths,
    OP_LABELS,
    ref_label,
)

TARGETS_DEPTH = 256  # the MLP depth the tree-op, dispatch and first-call targets name
INFO_ONLY = "information only, not one of the stated targets"


def judged_target(
    name: str,
    value: float | None,
    op: Comparison,
    threshold: float,
    detail: str,
    where: str,
    note: str = "",
    info: bool = False,
) -> Target:
    """A target row judged on `value`; `info`: shown for information only. Its
    `section` is filled in by `evaluate_targets`."""
    status = judge(value, op, threshold)
    return {
        "target": name,
        "where": where,
        "value": value,
        "op": op,
        "threshold": threshold,
        "status": INFO_PREFIX + status if info else status,
        "detail": detail,
        "note": note,
        "section": "",
    }


def choose_depth(available: Iterable[int]) -> tuple[int | None, str]:
    """The MLP depth a target is read on (`TARGETS_DEPTH`, else the deepest
    measured), and a note where it is not the stated one."""
    sizes = sorted(available)
    if not sizes:
        return None, "not measured"
    if TARGETS_DEPTH in sizes:
        return TARGETS_DEPTH, ""
    return (
        sizes[-1],
        f"evaluated on N={sizes[-1]}: the target is stated for N={TARGETS_DEPTH}, which this run did not measure",
    )


def median_of(r: Stat | None) -> float | None:
    """A ratio's median, None if not measured."""
    return r["median"] if r else None


Measured = TypeVar("Measured")


def if_measured(entry: Measured | Failed | None) -> Measured | None:
    """A measured entry, or None for one that failed or is missing."""
    if not entry or (isinstance(entry, dict) and "fails" in entry):
        return None
    return cast(Measured, entry)


# --------------------------------------------------------------------------------------
# Pytree operations and dispatch, on the MLP of `TARGETS_DEPTH` layers.
# --------------------------------------------------------------------------------------

# (op, reference, threshold, information only). The (info) row: AutoModule's unflatten
# is lazy (fields are filled in on first read), so the unflatten target alone flatters
# it; beside it, with every read.
TREE_OP_TARGETS: tuple[tuple[str, str, float, bool], ...] = (
    ("flatten", "eqx-static", 0.5, False),
    ("flatten", "dict", 3.0, False),
    ("unflatten", "eqx-static", 0.5, False),
    ("unflatten", "dict", 3.0, False),
    ("unflatten_read", "eqx-static", 0.5, True),
)
# (reference variant, threshold, information only). The stated targets are vs
# eqx.filter_jit and the dict floor; the (info) row beside them is the like-for-like
# comparison with the fair twin (not slower than it).
DISPATCH_TARGETS: tuple[tuple[str, float, bool], ...] = (
    (EQX_FILTER_FILTER, 0.35, False),
    (FAIR_TWIN, 1.0, True),
    (DICT_JIT, 1.5, False),
)


def _tree_op_target(
    res: TreeOpsGroup | None,
    where: str,
    depth_note: str,
    row: tuple[str, str, float, bool],
) -> Target:
    """One row of `TREE_OP_TARGETS`, judged."""
    op, ref, thr, info = row
    ratios = res["ratios"].get(ref, {}) if res else {}
    ops_us = res["ops_us"] if res else {}
    r = ratios.get("autostatic", {}).get(op)
    floor = ratios.get(M.PYNODE, {}).get(op)
    floor_note = (
        f"for scale: a minimal Python-registered node ({M.PYNODE}) is {fmt_ratio(floor)} {ref}"
        if ref == "dict" and floor
        else ""
    )
    lazy_note = (
        "lazy: fields are filled in on first read; with every field read, "
        "the (info) unflatten + read all row"
        if op == "unflatten" and ref == "eqx-static"
        else ""
    )
    return judged_target(
        f"{'(info) ' if info else ''}{OP_LABELS.get(op, op)} <= {thr}x {ref}",
        median_of(r),
        "<=",
        thr,
        f"{fmt_ratio(r, iqr=True)}; autostatic {fmt_stat_us(ops_us.get('autostatic', {}).get(op), True)}, "
        f"{ref} {fmt_stat_us(ops_us.get(ref, {}).get(op), True)}",
        where,
        "; ".join(x for x in (depth_note, floor_note, lazy_note) if x),
        info,
    )


def _dispatch_target(
    res: TreeOpsGroup | None, where: str, depth_note: str, row: tuple[str, float, bool]
) -> Target:
    """One row of `DISPATCH_TARGETS`, judged."""
    ref, thr, info = row
    dispatch = res["dispatch_us"] if res else {}
    ours = if_measured(dispatch.get(AUTO_JIT))
    r = ours["ratios"].get(ref) if ours else None
    return judged_target(
        f"{'(info) ' if info else ''}dispatch {AUTO_JIT} <= {thr}x {ref_label(ref)}",
        median_of(r),
        "<=",
        thr,
        f"{fmt_ratio(r, iqr=True)}; autostatic {fmt_stat_us(ours, True) if ours else '-'}, "
        f"ref {fmt_stat_us(if_measured(dispatch.get(ref)), True)}",
        where,
        "; ".join(x for x in (depth_note, INFO_ONLY if info else "") if x),
        info,
    )


def tree_ops_targets(results: Results) -> list[Target]:
    """Flatten, unflatten and dispatch against each reference, on the target MLP."""
    tree_ops = results.get("tree_ops", {})
    n, note = choose_depth(mlp_depths(tree_ops))
    where = f"mlp-{n}" if n else "-"
    res = tree_ops.get(where)
    return [_tree_op_target(res, where, note, row) for row in TREE_OP_TARGETS] + [
        _dispatch_target(res, where, note, row) for row in DISPATCH_TARGETS
    ]


# --------------------------------------------------------------------------------------
# Retracing, time to first call, training.
# --------------------------------------------------------------------------------------


def _count(entry: TraceCount | None) -> int | None:
    """A trace count, None if not measured."""
    return entry["count"] if entry else None


def retracing_targets(results: Results) -> list[Target]:
    """Trace counts equal to the dict floor's wherever the static values are equal."""
    rt = results.get("retracing")
    if not rt:
        return [
            judged_target(
                "trace counts == dict floor", None, "<=", 0.0, "not measured", "-"
            )
        ]
    auto = rt["counts"].get(AUTO_JIT, {})
    ref = rt["counts"].get(DICT_JIT, {})
    equal = [s for s, d in rt["scenarios"].items() if d["static_values_equal"]]
    diffs = [
        f"{s}: {_count(auto.get(s))}{' (error)' if 'error' in auto.get(s, {}) else ''} vs dict {_count(ref.get(s))}"
        for s in equal
        if _count(auto.get(s)) != _count(ref.get(s)) or "error" in auto.get(s, {})
    ]
    others = [
        f"{s}: {_count(auto.get(s))} (ideal {d['ideal']}, dict {_count(ref.get(s))}{' stale' if ref.get(s, {}).get('stale') else ''})"
        for s, d in rt["scenarios"].items()
        if not d["static_values_equal"]
    ]
    return [
        judged_target(
            "trace counts == dict floor where static values are equal",
            float(len(diffs)),
            "<=",
            0.0,
            ("all equal" if not diffs else "differ: " + "; ".join(diffs))
            + f" ({', '.join(equal)})",
            f"mlp-{rt['depth']}",
            "where static values change the dict floor is not a valid reference (it goes stale); "
            "autostatic there: " + "; ".join(others),
        )
    ]


def _first_call_of(
    first_calls: dict[str, FirstCall], n: int | None
) -> FirstCallVariant | None:
    """AutoModule's first call on the MLP of depth `n`."""
    res = first_calls.get(str(n)) if n else None
    return if_measured(res["variants"].get(AUTO_JIT)) if res else None


def _forward_note(results: Results, n: int | None) -> str:
    """The forward-pass first call (--full only), as information next to the target."""
    v = _first_call_of(results.get("first_call_forward", {}), n)
    r = v["ratios"].get(FAIR_TWIN) if v else None
    if not v or not r:
        return "the whole forward pass is timed in --full only"
    return f"whole forward pass: {fmt_ratio(r, iqr=True)} ({v['median']:.0f} ms)"


def first_call_targets(results: Results) -> list[Target]:
    """Time to first call not slower than the fair twin's (within 5%)."""
    n, note = choose_depth(int(k) for k in results.get("first_call", {}))
    v = _first_call_of(results.get("first_call", {}), n)
    r = v["ratios"].get(FAIR_TWIN) if v else None
    median, reps = (v["median"], v["n"]) if v else (float("nan"), 0)
    return [
        judged_target(
            f"time to first call {AUTO_JIT} <= 1.05x {FAIR_TWIN}",
            median_of(r),
            "<=",
            1.05,
            f"{fmt_ratio(r, iqr=True)}; autostatic {median:.1f} ms over {reps} reps "
            "(fresh jitted `lambda m: m.layers[0].bias + 1`)",
            f"mlp-{n}",
            note + ("; " if note else "") + _forward_note(results, n),
        )
    ]


def _throughput_target(
    name: str,
    entry: TrainingVariant | None,
    ref: str,
    where: str,
    note: str,
    info: bool,
) -> Target:
    """ "throughput >= `ref`" for AutoModule's training entry."""
    r = entry["throughput_ratios"].get(ref) if entry else None
    steps_per_s = entry["steps_per_s"] if entry else float("nan")
    return judged_target(
        name,
        median_of(r),
        ">=",
        1.0,
        f"{fmt_ratio(r, iqr=True)}; {steps_per_s:.0f} steps/s",
        where,
        note,
        info,
    )


def training_targets(results: Results) -> list[Target]:
    """Training throughput against eqx.filter_jit on the static-marked model (and,
    for information, against the fair twin and on the transformer)."""
    tr = results.get("training", {})
    n, note = choose_depth(mlp_depths(tr))
    if note and n is not None:
        note = (
            f"evaluated on mlp-{n}: training the {TARGETS_DEPTH}-layer MLP is only in --full "
            "(its train step takes ~10 s per variant to compile on 2 CPU cores)"
        )
    mlp = tr.get(f"mlp-{n}") if n else None
    entry = if_measured(mlp["variants"].get(AUTO_JIT)) if mlp else None
    where = f"mlp-{n}"
    targets = [
        _throughput_target(
            f"training throughput {AUTO_JIT} >= {EQX_STATIC_FILTER}",
            entry,
            EQX_STATIC_FILTER,
            where,
            note,
            False,
        ),
        # The like-for-like comparison: the same step code under plain jax.jit (the
        # target above also counts eqx.filter_jit's own overhead and Equinox's idiom).
        _throughput_target(
            f"(info) training throughput {AUTO_JIT} >= {FAIR_TWIN} (fair twin)",
            entry,
            FAIR_TWIN,
            where,
            "the same comparison against the fair twin (same step code, plain "
            "jax.jit); information only, not one of the stated targets",
            True,
        ),
    ]
    # Not a stated target (which names the MLP); shown for information.
    transformer = tr.get("transformer")
    entry = if_measured(transformer["variants"].get(AUTO_JIT)) if transformer else None
    for ref in (EQX_STATIC_FILTER, FAIR_TWIN) if entry else ():
        targets.append(
            _throughput_target(
                f"(info) training throughput {AUTO_JIT} >= {ref_label(ref)}",
                entry,
                ref,
                "transformer",
                "information only: not one of the stated targets",
                True,
            )
        )
    return targets


# --------------------------------------------------------------------------------------
# Checkpoints and real models.
# --------------------------------------------------------------------------------------


def serialisation_targets(ser: Serialisation | None) -> list[Target]:
    """The checkpoint targets `serialisation.run` measured (`results["targets"]`),
    judged here like every other; none from a result without such a list."""
    if not ser:
        return []
    where = "checkpoint"
    if ser["status"] != "ok" or "results" not in ser:
        detail = f"{ser['status']}: {ser.get('error', '')}"
        return [
            judged_target("checkpoint speed targets", None, ">=", 1.0, detail, where)
        ]
    return [
        judged_target(
            t["target"],
            t["value"],
            t["op"],
            t["threshold"],
            t["detail"],
            where,
            t["note"],
        )
        for t in ser["results"].get("targets", [])
    ]


# (op, models, reference, threshold, name if not "<op> <= <threshold>x <reference>"):
# each a ratio of autostatic to the reference measured in the same run.
REAL_TARGETS: tuple[tuple[str, tuple[str, ...], str, float, str], ...] = (
    ("flatten", ("linear-256", "transformer"), "eqx-static", 0.5, ""),
    ("flatten", ("linear-256",), "dict", 1.5, ""),
    (
        "dispatch",
        ("linear-256", "transformer"),
        "eqx-static",
        0.6,
        "jax.jit dispatch <= 0.6x eqx-static / jax.jit",
    ),
    (
        "dispatch",
        ("linear-256", "transformer"),
        "eqx-filter",
        0.35,
        "jax.jit dispatch <= 0.35x eqx-filter / eqx.filter_jit",
    ),
    ("unflatten_read", ("linear-256",), "eqx-static", 0.5, ""),
    ("build", ("mixed-stack",), "eqx-static", 1.0, ""),
    (
        "build",
        ("linear-256", "transformer", "mixed-stack", "nested"),
        "eqx-static",
        1.25,
        "",
    ),
    ("flatten", ("mixed-stack",), "eqx-static", 0.5, ""),
    ("unflatten_read", ("mixed-stack",), "eqx-static", 1.0, ""),
    ("treedef_eq", ("mixed-stack",), "eqx-static", 1.0, ""),
)
# Information only, beside the dispatch target that is N/A where plain `jax.jit` refuses
# the fair twin: the same ratio against the fair twin partitioned once by
# `eqx.partition`.
REAL_INFO_TARGETS: tuple[tuple[str, tuple[str, ...], str, float, str], ...] = (
    (
        "dispatch_partitioned",
        ("transformer", "mixed-stack"),
        "eqx-static",
        0.6,
        "jax.jit dispatch <= 0.6x eqx-static / eqx.partition once + jax.jit",
    ),
)


def _real_measurement(
    models: dict[str, RealModel], name: str, op: str, ref: str
) -> tuple[float | None, str]:
    """Autostatic's paired ratio to `ref` on one model's op, and its detail."""
    res = models.get(name)
    if res is None:
        return None, "not measured"
    stats = res["ops_us"].get(op, {})
    r: Ratio | None = res["ratios"].get(op, {}).get(ref)
    ref_stat = stats.get(ref, {})
    if "fails" in ref_stat:
        return None, f"{ref} fails: {ref_stat['fails']}"
    us = ", ".join(
        f"{i} {fmt_stat_us(if_measured(stats.get(i)), True)}"
        for i in ("autostatic", ref)
        if stats.get(i)
    )
    return median_of(r), f"{fmt_ratio(r, iqr=True)}; {us}"


def _worst_tree_at_target(real: RealModels, op: str) -> Target:
    """`eqx.tree_at` not slower than the same (routed) call on the eqx-static model,
    on the worst of the models."""
    models = real["models"]
    per_model = {
        name: _real_measurement(models, name, op, "eqx-static") for name in models
    }
    measured = [(v, n) for n, (v, _) in per_model.items() if v is not None]
    worst: tuple[float | None, str] = max(measured, default=(None, "-"))
    return judged_target(
        f"{real['ops'][op]} <= 1.0x eqx-static (worst model)",
        worst[0],
        "<=",
        1.0,
        "; ".join(
            f"{n} {fmt_ratio(models[n]['ratios'][op].get('eqx-static'))}"
            for n in per_model
        ),
        f"real: {worst[1]}",
    )


def real_models_targets(real: RealModels | None) -> list[Target]:
    """`REAL_TARGETS` and `REAL_INFO_TARGETS` on each model they name, and the
    `eqx.tree_at` targets on the worst model."""
    if not real:
        return [
            judged_target("real models", None, "<=", 1.0, "not measured", "real_models")
        ]
    targets = []
    for info, rows in ((False, REAL_TARGETS), (True, REAL_INFO_TARGETS)):
        for op, names, ref, thr, title in rows:
            for name in names:
                if op not in real["ops"]:  # a results.json from before the op existed
                    continue
                value, text = _real_measurement(real["models"], name, op, ref)
                targets.append(
                    judged_target(
                        title or f"{real['ops'][op]} <= {thr}x {ref}",
                        value,
                        "<=",
                        thr,
                        text,
                        f"real: {name}",
                        info=info,
                    )
                )
    for op in ("tree_at_array", "tree_at_layer"):
        targets.append(_worst_tree_at_target(real, op))
    return targets


# --------------------------------------------------------------------------------------
# All of them.
# --------------------------------------------------------------------------------------

# Each section's rule, in the order the targets are listed.
TARGET_RULES: dict[str, Callable[[Results], list[Target]]] = {
    "scaling": lambda results: _scaling_targets(results),
    "containers": lambda results: _containers_targets(results),
    "tree_ops": tree_ops_targets,
    "retracing": retracing_targets,
    "first_call": first_call_targets,
    "training": training_targets,
    "serialisation": lambda results: serialisation_targets(
        results.get("serialisation")
    ),
    "real_models": lambda results: real_models_targets(results.get("real_models")),
    "construction": lambda results: _construction_targets(results),
}


def _withhold_judgement(target: Target) -> None:
    """A smoke run's MET or MISSED becomes NOT_JUDGED (N/A stays, with its reason)."""
    info = INFO_PREFIX if target["status"].startswith(INFO_PREFIX) else ""
    if target["status"].removeprefix(info) in (MET, MISSED):
        target["status"] = info + NOT_JUDGED


def _scaling_targets(results: Results) -> list[Target]:
    from .scaling import scaling_targets  # the scaling report builds on this module

    return scaling_targets(results)


def _containers_targets(results: Results) -> list[Target]:
    from .containers import containers_targets  # builds on this module too

    return containers_targets(results)


def _construction_targets(results: Results) -> list[Target]:
    from .construction import construction_targets  # builds on this module too

    return construction_targets(results.get("construction"))


def evaluate_targets(
    results: Results,
    sections: Collection[str] | None = None,
    judged: bool = True,
) -> list[Target]:
    """The targets, each tagged with its section; only those of `sections` (default
    all). With `judged=False` (a smoke run, whose numbers mean nothing) no target is
    MET or MISSED: those are `NOT_JUDGED` (`N/A` stays, with its reason)."""
    targets: list[Target] = []
    for section, rule in TARGET_RULES.items():
        if sections is not None and section not in sections:
            continue
        for target in rule(results):
            target["section"] = section
            if not judged:
                _withhold_judgement(target)
            targets.append(target)
    return targets
