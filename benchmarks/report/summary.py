"""The verdict (what a reader sees first: in words, what AutoModule does faster and
slower than eqx.Module, then each model kind's dispatch on a line of its own) and the
summary (the short table at the end, against both baselines, with where we are
slower, the retracing differences, checkpoint speed, the wall time and the files
written).

Both read across sections; the per-section tables are in `tables`.
"""

import os

from ..schema import (
    Construction,
    Contrasts,
    Ratio,
    RealModels,
    Results,
    Serialisation,
    Training,
    TreeOpsGroup,
)
from .claims import (
    Claim,
    format_kind_dispatch,
    format_span,
    group_by_speed,
    KindDispatch,
    SAME_WITHIN,
    SPEED_GROUPS,
)
from .containers import containers_claims, containers_dispatch
from .format import (
    AUTO_JIT,
    EQX_FILTER_FILTER,
    FAIR_TWIN,
    fmt_ratio,
    mlp_depths,
    OP_LABELS,
    table,
)
from .retracing import retrace_text, retrace_verdict
from .scaling import scaling_claims, scaling_dispatch
from .tables import scale_variants
from .targets import choose_depth

PARTITIONED_MARK = "†"  # the fair twin partitioned once (plain jax.jit refuses it)
SCALE_MARK = "‡"  # beside it, the fair twin configured otherwise, for scale
SLOWER_BEYOND = 1.05  # a time ratio above this is "slower" in the summary


def find_fair_twin_ratio(
    real: RealModels, model: str, op: str
) -> tuple[Ratio | None, str]:
    """Autostatic's ratio to the fair twin on `op`, and its mark: where plain `jax.jit`
    refuses the fair twin, the dispatch ratio is against the fair twin partitioned once
    (`dispatch_partitioned`), marked `PARTITIONED_MARK`."""
    ratios = real["models"].get(model, {}).get("ratios", {})
    ratio = ratios.get(op, {}).get("eqx-static")
    if ratio is None and op == "dispatch":
        ratio = ratios.get("dispatch_partitioned", {}).get("eqx-static")
        return ratio, PARTITIONED_MARK if ratio else ""
    return ratio, ""


def _format_real_ratio(real: RealModels, model: str, op: str, ref: str) -> str:
    """Autostatic's ratio to `ref` on one real model's op, `-` if not measured."""
    ratio = real["models"].get(model, {}).get("ratios", {}).get(op, {}).get(ref)
    return f"{ratio['median']:.2f}x" if ratio else "-"


def find_step_time_ratio(
    training: dict[str, Training], model: str, ref: str
) -> float | None:
    """Time per training step of autostatic / `ref`, paired per round: the inverse of
    the median paired throughput ratio (exactly the median of the inverses for an odd
    number of rounds; for an even number, within the two middle ratios)."""
    entry = training.get(model, {}).get("variants", {}).get(AUTO_JIT, {})
    r = entry.get("throughput_ratios", {}).get(ref)
    if not r or not r.get("median"):
        return None
    return 1.0 / r["median"]


def read_checkpoint_speeds(ser: Serialisation | None) -> list[tuple[str, float]]:
    """(label, ours / Equinox's speed) pairs of the serialisation section, if any."""
    if not ser or "results" not in ser:
        return []
    ratios = ser["results"].get("ratios", {})
    return [
        (k.removesuffix("_speed").replace("_", " "), float(v))
        for k, v in ratios.items()
        if k.endswith("_speed") and isinstance(v, (int, float))
    ]


def shorten_path(path: str) -> str:
    """A path relative to the working directory when it lies below it, else absolute."""
    text = os.path.abspath(str(path))
    rel = os.path.relpath(text)
    return text if rel.startswith("..") else rel


# --------------------------------------------------------------------------------------
# The verdict.
# --------------------------------------------------------------------------------------

# The operations the verdict speaks of, in the words a user reads.
VERDICT_OPS: tuple[tuple[str, str], ...] = (
    ("dispatch", "a `jax.jit` call's dispatch"),
    ("flatten", "flattening a model"),
    ("treedef_eq", "comparing treedefs (`jax.jit`'s cache check)"),
    ("unflatten_read", "unflattening a model and reading every field"),
    ("build", "building a model around made layers"),
)


def _collect_real_claims(real: RealModels) -> list[Claim]:
    """A claim per verdict operation measured on the real models."""
    claims = []
    models = list(real["models"])
    for op, what in VERDICT_OPS:
        found = [r for m in models if (r := find_fair_twin_ratio(real, m, op)[0])]
        fair = [r["median"] for r in found]
        filtered = [
            r["median"]
            for m in models
            if (r := real["models"][m]["ratios"].get(op, {}).get("eqx-filter"))
        ]
        if fair:
            where = f"{', '.join(models)}"
            versus = (
                f"{format_span(filtered)} under `eqx.filter_jit`" if filtered else ""
            )
            spreads = [(r["q1"], r["q3"]) for r in found]
            claims.append(Claim(what, fair, f"{versus}; on {where}", spreads=spreads))
    return claims


def _make_training_claim(training: dict[str, Training]) -> Claim | None:
    """The training step's claim, if its ratios were measured."""
    models = list(training)
    fair = [v for m in models if (v := find_step_time_ratio(training, m, FAIR_TWIN))]
    filtered = [
        v for m in models if (v := find_step_time_ratio(training, m, EQX_FILTER_FILTER))
    ]
    if not fair:
        return None
    versus = f"{format_span(filtered)} under `eqx.filter_jit`" if filtered else ""
    spreads = [s for m in models if (s := _step_time_spread(training, m, FAIR_TWIN))]
    return Claim(
        "a training step",
        fair,
        f"{versus}; on {', '.join(models)}",
        spreads=spreads if len(spreads) == len(fair) else None,
    )


def _step_time_spread(
    training: dict[str, Training], model: str, ref: str
) -> tuple[float, float] | None:
    """The interquartile range of the step-time ratio: that of the paired throughput
    ratio, inverted."""
    entry = training.get(model, {}).get("variants", {}).get(AUTO_JIT, {})
    r = entry.get("throughput_ratios", {}).get(ref)
    if not r or not r.get("q1") or not r.get("q3"):
        return None
    return 1.0 / r["q3"], 1.0 / r["q1"]


def _construction_claims(cons: Construction) -> list[Claim]:
    """Wrapping in a list field (against the same eqx.Module), building with the
    layers' init and tracing (against the fair twin), and trace + compile with the
    libraries rebased (against the stock libraries)."""
    claims = []
    builds, trace, eco = cons.get("builds"), cons.get("trace"), cons.get("ecosystem")
    if builds:
        ratios = builds["ratios"]
        wrap = [
            r["median"]
            for op in ("wrap_layers", "wrap_arrays")
            if (r := ratios.get(op, {}).get("autostatic / eqx-filter"))
        ]
        if wrap:
            claims.append(
                Claim(
                    "wrapping made layers or arrays in a list field",
                    wrap,
                    f"{builds['layers']} Linear(8, 8), {builds['arrays']} scalar arrays",
                    "the same eqx.Module's time",
                )
            )
        init = ratios.get("build_init", {}).get("autostatic / eqx-static")
        if init:
            claims.append(
                Claim(
                    "building a model with its layers' init",
                    [init["median"]],
                    f"a {builds['blocks']}-block eqx.nn transformer",
                )
            )
    if trace and trace["ratios"]:
        claims.append(
            Claim(
                "tracing a forward pass and a training step (`jax.jit(f).trace`)",
                [r["median"] for r in trace["ratios"].values()],
                f"the {trace['blocks']}-block eqx.nn transformer; the fair twin "
                "partitioned once by `eqx.partition`, which plain `jax.jit` needs",
            )
        )
    if eco and eco["workloads"]:
        claims.append(
            Claim(
                "trace + compile with diffrax, lineax and optimistix rebased onto "
                "AutoModule",
                [w["ratio"]["median"] for w in eco["workloads"].values()],
                f"{', '.join(eco['workloads'])}; per pair of processes",
                "the stock libraries' time",
            )
        )
    return claims


def collect_verdict_claims(results: Results) -> list[Claim]:
    """Every claim of the verdict: the training step, every operation measured on the
    real models, and construction."""
    real, training = results.get("real_models"), results.get("training")
    claims = _collect_real_claims(real) if real else []
    claim = _make_training_claim(training) if training else None
    cons = results.get("construction")
    more = _construction_claims(cons) if cons else []
    scaled = results.get("scaling")
    held = results.get("containers")
    return (
        ([claim] if claim else [])
        + claims
        + (scaling_claims(scaled) if scaled else [])
        + (containers_claims(held) if held else [])
        + more
    )


def _real_dispatch(real: RealModels) -> list[KindDispatch]:
    """Each real model's line of the verdict's dispatch list (one size each)."""
    kinds = []
    for model, res in real["models"].items():
        fair, mark = find_fair_twin_ratio(real, model, "dispatch")
        filtered = res["ratios"].get("dispatch", {}).get("eqx-filter")
        name = "the fair twin partitioned once" + mark if mark else "the fair twin"
        kinds.append(
            KindDispatch(f"the real model `{model}`", [], "", [fair], [filtered], name)
        )
    return kinds


def collect_kind_dispatch(results: Results) -> list[KindDispatch]:
    """Every model kind's dispatch: the containers, the scaling section's layers and
    the real models, in that order."""
    held, scaled = results.get("containers"), results.get("scaling")
    real = results.get("real_models")
    return (
        (containers_dispatch(held) if held else [])
        + (scaling_dispatch(scaled) if scaled else [])
        + (_real_dispatch(real) if real else [])
    )


def _kind_dispatch_lines(kinds: list[KindDispatch]) -> list[str]:
    """The dispatch list: a line per model kind, so that no span hides a slow one."""
    if not kinds:
        return []
    lines = [
        "",
        "A `jax.jit` call's dispatch, model kind by model kind (time ratios of "
        "AutoModule, one per size measured, smallest first; the word in bold is where "
        "the ratios put the kind):",
        "",
    ]
    lines += [f"* {format_kind_dispatch(kind)}" for kind in kinds]
    if any(PARTITIONED_MARK in kind.fair_name for kind in kinds):
        lines += [
            "",
            f"{PARTITIONED_MARK}: plain `jax.jit` refuses the fair twin (a function "
            "field Equinox does not mark static), so against it partitioned once by "
            "`eqx.partition`, `jax.jit` over its arrays.",
        ]
    return lines


def verdict_section(results: Results) -> list[str]:
    """The first thing a reader sees: in words, what AutoModule does faster and
    slower than eqx.Module, by how much, where, each model kind's dispatch, and when
    switching pays."""
    claims = collect_verdict_claims(results)
    kinds = collect_kind_dispatch(results)
    if not claims and not kinds:
        return []
    groups: dict[str, list[str]] = {}
    for claim in claims:
        entry = (
            f"{claim.what}: {format_span(claim.ratios)} {claim.reference} "
            f"({claim.rest})"
        )
        groups.setdefault(group_by_speed(claim.ratios, claim.spreads), []).append(entry)
    lines = [
        "### Verdict",
        "",
        "Time ratios of AutoModule under plain `jax.jit`, paired per round (below 1 is "
        "faster): against the fair twin (eqx.Module with its non-array fields marked "
        "static, the same code under `jax.jit`) and against what Equinox users run "
        "(eqx.Module without markers under `eqx.filter_jit`). A line with another "
        "reference (the same eqx.Module, the stock libraries) names it.",
        "",
    ]
    for group in SPEED_GROUPS:
        if group in groups:
            lines.append(f"* **{group}**")
            lines += [f"  * {entry}" for entry in groups[group]]
    lines += _kind_dispatch_lines(kinds)
    lines += [
        "",
        f"The same: within {SAME_WITHIN:.2f}x of 1 on every model; mixed: faster on "
        "some models, slower on others.",
    ]
    lines += [
        "",
        "When switching pays: the slower operations run when Python builds or takes "
        "apart a model (once per model, and once per trace where library code builds "
        "modules inside a jitted function); the faster ones run on every compiled call. "
        "A program that calls its models more often than it builds them gains; one "
        "that rebuilds models in a Python loop outside `jax.jit` pays the build ratio "
        "each time. A Python float or int that changes between calls is static and "
        "retraces: store it as an array.",
        "",
    ]
    return lines


# --------------------------------------------------------------------------------------
# The summary.
# --------------------------------------------------------------------------------------

# The two baselines of the summary's columns, as its notes name them.
BASELINES = ((FAIR_TWIN, "fair twin"), (EQX_FILTER_FILTER, "filter_jit"))
BASELINE_IMPLS = (("eqx-static", "fair twin"), ("eqx-filter", "filter_jit"))


class SummaryTable:
    """The summary's table as it fills in: its rows, where AutoModule is slower than
    either baseline, and the fair twin configured otherwise (for scale)."""

    def __init__(self) -> None:
        self.rows: list[list[str]] = []
        self.slower: dict[str, list[str]] = {}  # "<op> on <model>" -> ["1.20x vs ..."]
        self.for_scale: list[str] = []

    def note_if_slower(
        self, label: str, where: str, ref: str, value: float | None
    ) -> None:
        """Records `value` (a time ratio against `ref`) if it is slower."""
        if value is not None and value > SLOWER_BEYOND:
            entries = self.slower.setdefault(f"{label} on {where}", [])
            entry = f"{value:.2f}x vs {ref}"
            if entry not in entries:
                entries.append(entry)


# The real models' rows: (op, label).
REAL_ROWS: tuple[tuple[str, str], ...] = (
    ("flatten", "flatten"),
    ("unflatten_read", "unflatten + read every field"),
    ("dispatch", "jit dispatch"),
    ("treedef_eq", "treedef =="),
    ("build", "build (around made layers)"),
)


def _format_fair_twin_cell(
    real: RealModels, model: str, op: str, label: str, summary: SummaryTable
) -> str:
    """A model's ratio to the fair twin, marked, with the fair twin's other configurations
    (for scale) noted."""
    ratio, mark = find_fair_twin_ratio(real, model, op)
    cell = f"{ratio['median']:.2f}x{mark}" if ratio else "-"
    notes = real.get("variant_notes", {})
    for variant in scale_variants(real["models"][model]):
        r = real["models"][model]["ratios"].get(op, {}).get(variant)
        if r:
            cell += SCALE_MARK
            summary.for_scale.append(
                f"{label} on {model}: {r['median']:.2f}x vs `{variant}`"
                + (f" ({notes[variant]})" if variant in notes else "")
            )
    return cell


def _add_real_rows(real: RealModels, summary: SummaryTable) -> None:
    """One row per operation, a ratio per real model in each column."""
    models = list(real["models"])
    for op, label in REAL_ROWS:
        fair = " / ".join(
            _format_fair_twin_cell(real, m, op, label, summary) for m in models
        )
        filt = " / ".join(_format_real_ratio(real, m, op, "eqx-filter") for m in models)
        summary.rows.append([f"{label} ({' / '.join(models)})", fair, filt])
        for m in models:
            fair_ratio, _ = find_fair_twin_ratio(real, m, op)
            filtered = real["models"][m].get("ratios", {}).get(op, {})
            for r, name in (
                (fair_ratio, "fair twin"),
                (filtered.get("eqx-filter"), "filter_jit"),
            ):
                summary.note_if_slower(label, m, name, r["median"] if r else None)


def _add_mlp_rows(tree_ops: dict[str, TreeOpsGroup], summary: SummaryTable) -> None:
    """Without real models: the rows of the MLP the targets are read on."""
    n, _ = choose_depth(mlp_depths(tree_ops))
    res = tree_ops.get(f"mlp-{n}")
    for op, label in (
        ("flatten", "flatten"),
        ("unflatten_read", "unflatten + read all"),
    ):
        cells = []
        for ref, name in BASELINE_IMPLS:
            r = (
                res["ratios"].get(ref, {}).get("autostatic", {}).get(op)
                if res
                else None
            )
            cells.append(fmt_ratio(r))
            summary.note_if_slower(label, f"mlp-{n}", name, r["median"] if r else None)
        summary.rows.append([f"{label} (mlp-{n})", *cells])
    ours = res["dispatch_us"].get(AUTO_JIT) if res else None
    disp = ours["ratios"] if ours and "fails" not in ours else {}
    cells = []
    for ref, name in BASELINES:
        cells.append(fmt_ratio(disp.get(ref)))
        r = disp.get(ref)
        summary.note_if_slower(
            "jit dispatch", f"mlp-{n}", name, r["median"] if r else None
        )
    summary.rows.append([f"jit dispatch (mlp-{n})", *cells])


def _note_slower_tree_ops(
    tree_ops: dict[str, TreeOpsGroup], summary: SummaryTable
) -> None:
    """Every other tree-op comparison that goes against us (the dict-layer models,
    kept as the floor view), so that none is left deep in the tables."""
    for model, res in tree_ops.items():
        for ref, name in BASELINE_IMPLS:
            ours = res["ratios"].get(ref, {}).get("autostatic", {})
            for op, r in ours.items():
                label = OP_LABELS.get(op, op)
                summary.note_if_slower(
                    label, f"{model} (dict layers)", name, r["median"]
                )


def _add_training_row(training: dict[str, Training], summary: SummaryTable) -> None:
    """Time per training step against both baselines, per trained model."""
    models = list(training)
    cells = []
    for ref, name in BASELINES:
        values = [find_step_time_ratio(training, m, ref) for m in models]
        cells.append(" / ".join("-" if v is None else f"{v:.2f}x" for v in values))
        for m, v in zip(models, values):
            summary.note_if_slower("training step", m, name, v)
    summary.rows.append([f"training step time ({' / '.join(models)})", *cells])


def _add_construction_rows(cons: Construction, summary: SummaryTable) -> None:
    """Wrapping, building with the layers' init and tracing, against the fair twin
    (the wrapping holders have nothing to mark: one class is both baselines)."""
    builds, trace = cons.get("builds"), cons.get("trace")
    if builds:
        ratios = builds["ratios"]
        wrap = [
            ratios.get(op, {}).get("autostatic / eqx-filter")
            for op in ("wrap_layers", "wrap_arrays")
        ]
        label = f"wrap in a list field ({builds['layers']} Linears / {builds['arrays']} arrays)"
        cell = " / ".join(fmt_ratio(r) for r in wrap)
        summary.rows.append([label, cell, cell])
        sizes = (f"{builds['layers']} Linears", f"{builds['arrays']} arrays")
        for r, where in zip(wrap, sizes):
            value = r["median"] if r else None
            summary.note_if_slower("wrap in a list field", where, "eqx.Module", value)
        init = ratios.get("build_init", {}).get("autostatic / eqx-static")
        where = f"transformer-{builds['blocks']}"
        summary.rows.append([f"build with layer init ({where})", fmt_ratio(init), "-"])
        value = init["median"] if init else None
        summary.note_if_slower("build with layer init", where, "fair twin", value)
    if trace:
        where = f"transformer-{trace['blocks']}"
        cells = []
        for fn in trace["fns"]:
            r = trace["ratios"].get(fn)
            cells.append(f"{r['median']:.2f}x{PARTITIONED_MARK}" if r else "-")
            value = r["median"] if r else None
            summary.note_if_slower(f"trace {fn}", where, "fair twin", value)
        summary.rows.append(
            [f"trace: {' / '.join(trace['fns'])} ({where})", " / ".join(cells), "-"]
        )


def _ecosystem_lines(cons: Construction, summary: SummaryTable) -> list[str]:
    """Trace + compile with the libraries rebased, against the stock libraries."""
    eco = cons.get("ecosystem")
    if not eco:
        return []
    parts = []
    for workload, res in eco["workloads"].items():
        r = res["ratio"]
        parts.append(f"{workload} {r['median']:.2f}x ({r['min']:.2f}–{r['max']:.2f})")
        summary.note_if_slower(
            "trace + compile", f"{workload} (rebased)", "stock", r["median"]
        )
    return [
        "",
        "Trace + compile with diffrax, lineax and optimistix rebased onto AutoModule, "
        "time ratio to the stock libraries (median, min–max over "
        f"{eco['processes_per_side']} pair(s) of processes): " + ", ".join(parts) + ".",
    ]


def _comparison_lines(summary: SummaryTable) -> list[str]:
    """The table, its marks, and where we are slower."""
    lines: list[str] = []
    if summary.rows:
        lines.append("")
        lines += table(
            [
                "",
                "vs the fair twin: static fields marked, `jax.jit`, same code",
                "vs what Equinox users run: no markers, `eqx.filter_jit`",
            ],
            summary.rows,
        )
        lines += [
            "",
            f"{PARTITIONED_MARK}: plain `jax.jit` refuses the fair twin (a function field "
            "Equinox does not mark static), so against it partitioned once by "
            "`eqx.partition`, `jax.jit` over its arrays (Equinox's route to plain "
            "`jax.jit`); -: not measured.",
        ]
    if summary.for_scale:
        lines += ["", f"{SCALE_MARK}: for scale, the fair twin configured otherwise:"]
        lines += [f"* {x}" for x in summary.for_scale]
    if summary.rows or summary.slower:
        lines += ["", "Where we are slower (> 1.05x, either baseline):"]
        lines += [f"* {k}: {', '.join(v)}" for k, v in summary.slower.items()] or [
            "* nowhere in these rows"
        ]
    return lines


def _tally_retraces(contrasts: Contrasts, ref: str) -> tuple[list[str], list[str]]:
    """The contrast scenarios where AutoModule traces fewer times than `ref` (or `ref`
    fails), and those where it traces more, each with both counts."""
    by: dict[str, list[str]] = {"better": [], "worse": []}
    for scenario, sc in contrasts["scenarios"].items():
        verdict = retrace_verdict(sc, ref)
        if verdict not in by:
            continue
        counts = sc["counts"]
        marked = sc.get("eqx_static_fields")
        marks = ""
        if ref == FAIR_TWIN and marked is not None:
            named = ", ".join(f"`{f}`" for f in marked)
            marks = f"; twin marks {named or 'nothing'}"
            marks += " static" if marked else ""
        by[verdict].append(
            f"`{scenario}` ({retrace_text(counts.get(AUTO_JIT))} vs "
            f"{retrace_text(counts.get(ref))}{marks})"
        )
    return by["better"], by["worse"]


def _retracing_lines(contrasts: Contrasts) -> list[str]:
    """The retracing differences against both baselines, in words."""
    lines = [
        "",
        f"Retracing, traces over {contrasts['calls']} calls (AutoModule vs ...; "
        "the fair twin marks static what each scenario says, named here):",
    ]
    for ref, name in (
        (FAIR_TWIN, "the fair twin"),
        (EQX_FILTER_FILTER, "eqx.filter_jit"),
    ):
        better, worse = _tally_retraces(contrasts, ref)
        same = len(contrasts["scenarios"]) - len(better) - len(worse)
        lines.append(
            f"* vs {name}: fewer (or it fails) in {', '.join(better) or 'none'}; "
            f"MORE in {', '.join(worse) or 'none'}; the same in the other {same}."
        )
    return lines + [
        "",
        "A changing Python float or int is static here, so it retraces: store it as "
        "an array.",
    ]


def _closing_lines(results: Results, speeds: list[tuple[str, float]]) -> list[str]:
    """Checkpoint speed, the wall time, the files written and why there are no plots."""
    lines: list[str] = []
    if speeds:
        lines += [
            "",
            "Checkpoint speed, ours / Equinox's (> 1 is faster): "
            + ", ".join(f"{label} {v:.2f}x" for label, v in speeds)
            + ".",
        ]
    lines += ["", f"Wall time: {results.get('wall_s', float('nan')):.1f} s."]
    files = results.get("files") or []
    if files:
        lines += ["", f"Files written ({len(files)}):"]
        lines += [f"  {shorten_path(f)}" for f in files]
    if results.get("plots_note"):
        lines += ["", f"No plots: {results.get('plots_note')}."]
    return lines


def summary_section(results: Results) -> list[str]:
    """The short table a user reads last: AutoModule against both baselines (the fair
    twin: eqx.Module with static fields under `jax.jit`, the same code; and what Equinox
    users run: eqx.Module without markers under `eqx.filter_jit`), where we are slower,
    the retracing differences, checkpoint speed, the wall time and the files written."""
    real, training = results.get("real_models"), results.get("training")
    tree_ops = results.get("tree_ops") or {}
    summary = SummaryTable()
    if real:
        _add_real_rows(real, summary)
    elif tree_ops:  # no real models in this run: the MLP the targets are read on
        _add_mlp_rows(tree_ops, summary)
    _note_slower_tree_ops(tree_ops, summary)
    if training:
        _add_training_row(training, summary)
    cons = results.get("construction") or {}
    _add_construction_rows(cons, summary)
    ecosystem = _ecosystem_lines(cons, summary)
    speeds = read_checkpoint_speeds(results.get("serialisation"))
    for label, v in speeds:  # a speed ratio: slower is below 1
        if v < 1 / SLOWER_BEYOND:
            summary.slower.setdefault(f"checkpoint {label}", []).append(
                f"{v:.2f}x Equinox's speed"
            )
    lines = [
        "### Summary: AutoModule vs eqx.Module (time ratios of AutoModule, paired per "
        "round; < 1 is faster)",
    ]
    lines += _comparison_lines(summary) + ecosystem
    contrasts = (results.get("retracing") or {}).get("contrasts")
    if contrasts:
        lines += _retracing_lines(contrasts)
    return lines + _closing_lines(results, speeds)
