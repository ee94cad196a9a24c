"""Benchmark views of the design-exploration notebook.

`make_notebook.py` pastes this file into one notebook cell; the cells after it call the
functions below on the results of one benchmark run. Every number the notebook shows
about speed comes from that file, never from a timing taken in the notebook.
`tests/test_notebook.py` also imports this module and runs every view on a small
synthetic results dict.

Data: the committed `benchmarks/results/cpu/results.json` (written only by
`python -m benchmarks --quick --write-results`). For development only, the environment
variable `AUTOSTATIC_RESULTS` points at another results file (e.g. an ad-hoc run's
`--out` folder); a notebook built that way must not be committed (`make_notebook.py`
refuses to overwrite the committed one then).
"""

import dataclasses
import json
import math
import os
import textwrap
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from IPython.core.display import Markdown
from IPython.display import display
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, NullLocator

RESULTS_ENV = "AUTOSTATIC_RESULTS"
COMMITTED = "../benchmarks/results/cpu/results.json"  # relative to examples/
FAIR, FILTER = "fair twin", "eqx.filter_jit"
REF_TEXT = {
    FAIR: "fair twin: eqx.Module, `eqx.field(static=True)` on non-array fields, `jax.jit`",
    FILTER: "what Equinox users run: eqx.Module without markers, `eqx.filter_jit`",
}
RATIO_LABEL = "time ratio AutoModule / baseline\n(< 1: AutoModule faster)"
COLORS = {FAIR: "tab:blue", FILTER: "tab:orange"}
OP_LABELS = {
    "flatten": "flatten",
    "unflatten": "unflatten",
    "flatten_with_path": "flatten_with_path",
    "unflatten_read": "unflatten + read all",
    "treedef_eq": "treedef ==",
    "build": "build",
    "dispatch": "jit dispatch",
}
HEADLINE_OPS = ("flatten", "unflatten_read", "dispatch", "treedef_eq", "build")
PARTITIONED = "dispatch_partitioned"  # eqx models: eqx.partition once + jax.jit
MISSING = "not in these results"


# --------------------------------------------------------------------------------------
# Loading and provenance.
# --------------------------------------------------------------------------------------


def results_path() -> tuple[Path, bool]:
    """The results file and whether it is the committed one."""
    override = os.environ.get(RESULTS_ENV)
    if override:
        return Path(override), False
    return Path(COMMITTED), True


def load_results() -> tuple[dict[str, Any], str]:
    path, committed = results_path()
    results = json.loads(path.read_text())
    source = (
        f"results: {path} (committed; written by "
        "`python -m benchmarks --quick --write-results`)"
        if committed
        else f"results: {path} (from ${RESULTS_ENV}: development only, not committed)"
    )
    return results, source


def provenance(results: dict[str, Any]) -> str:
    """Which run the numbers come from: mode, date, commit, machine, versions."""
    m = results.get("machine", {})
    versions = m.get("versions", {})
    lines = [
        f"run: {m.get('mode', '?')} mode, {m.get('date', '?')}, "
        f"git commit {m.get('git_commit', '?')}",
        f"machine: {m.get('platform', '?')}, {m.get('cpu_count', '?')} CPUs "
        f"({m.get('cpus_usable', '?')} usable), backend {m.get('backend', '?')} "
        f"({m.get('device_kind', '?')} x{m.get('device_count', '?')})",
        "versions: "
        + ", ".join(
            f"{k} {versions[k]}" for k in ("jax", "equinox", "optax") if k in versions
        ),
        "sections: " + ", ".join(k for k in results if k not in ("machine",)),
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------
# Every paired ratio of AutoModule against the two baselines, in one list.
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Ratio:
    section: str  # "eqx.nn models", "MLP floor" or "training step"
    model: str
    op: str
    label: str
    ref: str  # FAIR or FILTER
    median: float
    q1: float
    q3: float
    paired: bool = True  # False: a ratio of two medians

    @property
    def text(self) -> str:
        iqr = f" ({self.q1:.2f}–{self.q3:.2f})" if self.paired else " (medians)"
        return f"{self.median:.2f}x{iqr}"


def _stat(r: Any) -> tuple[float, float, float] | None:
    if not isinstance(r, dict):
        return None
    try:
        med, q1, q3 = (float(r[k]) for k in ("median", "q1", "q3"))
    except (KeyError, TypeError, ValueError):
        return None
    return (med, q1, q3) if all(map(math.isfinite, (med, q1, q3))) else None


def _real_ratios(real: dict[str, Any]) -> list[Ratio]:
    out = []
    labels = real.get("ops", {})
    for model, res in real.get("models", {}).items():
        for op, refs in res.get("ratios", {}).items():
            for ref, name in (("eqx-static", FAIR), ("eqx-filter", FILTER)):
                stat = _stat(refs.get(ref))
                if stat:
                    label = labels.get(op, op)
                    out.append(Ratio("eqx.nn models", model, op, label, name, *stat))
    return out


def _tree_ops_ratios(tree_ops: dict[str, Any]) -> list[Ratio]:
    out = []
    for model, res in tree_ops.items():
        ratios = res.get("ratios", {})
        for ref, name in (("eqx-static", FAIR), ("eqx-filter", FILTER)):
            for op, r in ratios.get(ref, {}).get("autostatic", {}).items():
                stat = _stat(r)
                if stat:
                    label = OP_LABELS.get(op) or str(op)
                    out.append(Ratio("MLP floor", model, op, label, name, *stat))
        dispatch = res.get("dispatch_us", {}).get("autostatic / jax.jit", {})
        for variant, name in (
            ("eqx-static / jax.jit", FAIR),
            ("eqx-filter / eqx.filter_jit", FILTER),
        ):
            stat = _stat(dispatch.get("ratios", {}).get(variant))
            if stat:
                out.append(
                    Ratio("MLP floor", model, "dispatch", "jit dispatch", name, *stat)
                )
    return out


def _training_ratios(training: dict[str, Any]) -> list[Ratio]:
    """Time per step of AutoModule (`jax.jit`) / the baseline's: the inverse of the
    throughput ratio when it is paired in the results, else the ratio of the medians."""
    out = []
    for model, res in training.items():
        variants = res.get("variants", {})
        ours = variants.get("autostatic / jax.jit", {})
        paired = ours.get("throughput_ratios", {})
        for name, candidates in (
            (FAIR, ("eqx-static / jax.jit",)),
            (FILTER, ("eqx-filter / eqx.filter_jit", "eqx-static / eqx.filter_jit")),
        ):
            found = next((c for c in candidates if _stat(paired.get(c))), None)
            label = f"training step (vs {found or candidates[0]})"
            stat: tuple[float, float, float]
            if found:
                med, q1, q3 = _stat(paired[found]) or (1.0, 1.0, 1.0)
                # steps/s ratio -> time ratio: 1/x flips the quartiles.
                stat, is_paired = (1 / med, 1 / q3, 1 / q1), True
            else:
                theirs = variants.get(candidates[0], {})
                a, b = ours.get("ms_per_step"), theirs.get("ms_per_step")
                numbers = isinstance(a, (int, float)) and isinstance(b, (int, float))
                if not (numbers and b > 0):
                    continue
                r = a / b
                stat, is_paired = (r, r, r), False
            out.append(
                Ratio("training step", model, "step", label, name, *stat, is_paired)
            )
    return out


def comparisons(results: dict[str, Any]) -> list[Ratio]:
    """Every ratio of AutoModule to the fair twin and to `eqx.filter_jit` in the run."""
    return (
        _real_ratios(results.get("real_models") or {})
        + _tree_ops_ratios(results.get("tree_ops") or {})
        + _training_ratios(results.get("training") or {})
    )


def unmeasurable(results: dict[str, Any]) -> list[str]:
    """Cells of the eqx.nn models that a baseline cannot run (e.g. the fair twin of a
    model holding an `eqx.nn.MLP` under plain `jax.jit`)."""
    real = results.get("real_models") or {}
    out = []
    for model, res in real.get("models", {}).items():
        for op, stats in res.get("ops_us", {}).items():
            for impl, stat in stats.items():
                if isinstance(stat, dict) and "fails" in stat:
                    label = real.get("ops", {}).get(op, op)
                    out.append(f"{model}, {label}, `{impl}`: {stat['fails']}")
    return out


# --------------------------------------------------------------------------------------
# Views. Each plot returns its figure; every Axes gets an x label, a y label and a title.
# --------------------------------------------------------------------------------------


def _md(text: str) -> None:
    display(Markdown(text))


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def _one_line(ax: Any, vertical: bool = False) -> None:
    line = ax.axvline if vertical else ax.axhline
    line(1.0, color="black", linestyle="--", linewidth=1, label="1.0: same time")


def _log_ratio_axis(ax: Any, axis: str = "y") -> None:
    """Log scale, ticks written as ratios (0.2x, 1x, 3x)."""
    fmt = FuncFormatter(lambda v, _: f"{v:g}x")
    scale = ax.set_yscale if axis == "y" else ax.set_xscale
    scale("log")
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_formatter(fmt)
    target.set_minor_formatter(  # label 0.2, 0.5, 2, 5, ... between the decades
        FuncFormatter(lambda v, _: f"{v:g}x" if f"{v:.0e}"[0] in "25" else "")
    )


def _wrap(text: str, width: int = 16) -> str:
    return "\n".join(textwrap.wrap(text, width)) or text


def plot_mlp_overhead(results: dict[str, Any]) -> Figure | None:
    """The floor view: absolute µs of flatten, unflatten and dispatch against depth."""
    tree_ops = results.get("tree_ops") or {}
    sizes = sorted(int(n.split("-")[1]) for n in tree_ops if n.startswith("mlp-"))
    if not sizes:
        print(f"MLP tree ops: {MISSING}")
        return None
    mlps = [tree_ops[f"mlp-{n}"] for n in sizes]
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for ax, op in zip(axes, ["flatten", "unflatten"]):
        for impl in ["autostatic", "eqx-static", "eqx-filter", "dict"]:
            ys = [_stat(r.get("ops_us", {}).get(impl, {}).get(op)) for r in mlps]
            if any(ys):
                ax.loglog(
                    sizes, [y[0] if y else math.nan for y in ys], "o-", label=impl
                )
        ax.set(
            title=f"tree_{op}",
            xlabel="MLP depth (layers)",
            ylabel="median time per call (µs)",
        )
        ax.legend(fontsize=8)
    variants = [
        "autostatic / jax.jit",
        "eqx-static / jax.jit",
        "eqx-static / eqx.filter_jit",
        "eqx-filter / eqx.filter_jit",
        "dict / jax.jit",
    ]
    for variant in variants:
        ys = [_stat(r.get("dispatch_us", {}).get(variant)) for r in mlps]
        if any(ys):
            axes[2].loglog(
                sizes, [y[0] if y else math.nan for y in ys], "o-", label=variant
            )
    axes[2].set(
        title="dispatch of a jitted call",
        xlabel="MLP depth (layers)",
        ylabel="median time per call (µs)",
    )
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    return fig


def fair_twin_table(results: dict[str, Any]) -> str:
    """AutoModule against both baselines: headline ops per model, and the training
    step. Cells: `vs fair twin / vs eqx.filter_jit`."""
    rows = comparisons(results)
    section = (
        "eqx.nn models"
        if any(r.section == "eqx.nn models" for r in rows)
        else "MLP floor"
    )
    pick = [r for r in rows if r.section == section and r.op in HEADLINE_OPS]
    models = list(dict.fromkeys(r.model for r in pick))
    cell = {(r.model, r.op, r.ref): f"{r.median:.2f}x" for r in pick}
    # Where plain jax.jit refuses the fair twin: its dispatch partitioned once.
    for r in rows:
        if r.section == section and r.op == PARTITIONED and r.ref == FAIR:
            cell.setdefault((r.model, "dispatch", FAIR), f"{r.median:.2f}x†")
    body = []
    for op in HEADLINE_OPS:
        if any(r.op == op for r in pick):
            body.append(
                [OP_LABELS[op]]
                + [
                    f"{cell.get((m, op, FAIR), '-')} / {cell.get((m, op, FILTER), '-')}"
                    for m in models
                ]
            )
    text = f"**{section}** (time ratios, < 1: AutoModule faster; cells: vs {FAIR} / vs {FILTER})\n\n"
    text += _table(["op"] + models, body) if body else f"{section}: {MISSING}"
    if any(c.endswith("†") for c in cell.values()):
        text += (
            "\n\n†: plain `jax.jit` refuses the fair twin (a function field Equinox "
            "does not mark static); against it partitioned once by `eqx.partition`, "
            "`jax.jit` over its arrays."
        )
    train = [r for r in rows if r.section == "training step"]
    if train:
        text += "\n\n**training step** (time per step, < 1: AutoModule faster)\n\n"
        text += _table(
            ["model", "baseline", "time ratio"],
            [[r.model, r.label.split("vs ", 1)[-1].rstrip(")"), r.text] for r in train],
        )
    return text


def plot_fair_twin(results: dict[str, Any]) -> Figure | None:
    """Ratios against depth on the MLP floor, and the training step, each against the
    fair twin (solid) and `eqx.filter_jit` (dashed)."""
    rows = comparisons(results)
    floor = [r for r in rows if r.section == "MLP floor" and r.model.startswith("mlp-")]
    train = [r for r in rows if r.section == "training step"]
    if not floor and not train:
        print(f"fair twin comparison: {MISSING}")
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 4.2), width_ratios=[5, 3])
    for op, ref in dict.fromkeys((r.op, r.ref) for r in floor):
        pts = sorted(
            (int(r.model.split("-")[1]), r.median)
            for r in floor
            if r.op == op and r.ref == ref and op in HEADLINE_OPS
        )
        if pts:
            left.plot(
                *zip(*pts),
                "o-" if ref == FAIR else "s--",
                label=f"{OP_LABELS.get(op, op)} vs {ref}",
            )
    _one_line(left)
    _log_ratio_axis(left)
    depths = sorted({int(r.model.split("-")[1]) for r in floor})
    left.set_xscale("log")
    left.set_xticks(depths, [str(d) for d in depths])
    left.xaxis.set_minor_locator(NullLocator())
    left.set(
        title="MLP floor: AutoModule vs both baselines",
        xlabel="MLP depth (layers)",
        ylabel=RATIO_LABEL,
    )
    left.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    models = list(dict.fromkeys(r.model for r in train))
    for i, ref in enumerate((FAIR, FILTER)):
        for j, m in enumerate(models):
            r = next((r for r in train if r.model == m and r.ref == ref), None)
            if r is None:
                continue
            x = j + (i - 0.5) * 0.38
            err = [[r.median - r.q1], [r.q3 - r.median]]
            right.bar(x, r.median, 0.38, yerr=err, color=COLORS[ref])
            note = r.text if r.paired else f"{r.median:.2f}x\n(medians,\nunpaired)"
            right.annotate(note, (x, r.median), ha="center", va="bottom", fontsize=7)
    handles = [Patch(color=COLORS[ref], label=f"vs {ref}") for ref in (FAIR, FILTER)]
    _one_line(right)
    top = max([1.0, *(r.q3 for r in train)])
    right.set_ylim(0, top * 1.35)  # room for the notes above the bars
    right.set_xticks(range(len(models)), models)
    right.set(
        title="training step (forward + grad + adam)",
        xlabel="model",
        ylabel="time per step, AutoModule / baseline\n(< 1: AutoModule faster)",
    )
    right.legend(handles=[*handles, *right.get_legend_handles_labels()[0]], fontsize=8)
    fig.tight_layout()
    return fig


def plot_real_models(results: dict[str, Any]) -> Figure | None:
    """Grouped bars: one group per op, one bar per eqx.nn model; one panel per
    baseline. Error bars: interquartile range of the paired ratios."""
    real = results.get("real_models")
    if not real or not real.get("models"):
        print(
            f"eqx.nn models (real_models section): {MISSING} "
            f"({results.get('machine', {}).get('date', '?')}). "
            "Run `python -m benchmarks --quick --write-results` to add them."
        )
        return None
    rows = [r for r in comparisons(results) if r.section == "eqx.nn models"]
    ops = list(real.get("ops") or dict.fromkeys(r.op for r in rows))
    models = list(real["models"])
    width = 0.8 / max(len(models), 1)
    fig, axes = plt.subplots(2, 1, figsize=(14, 9), sharex=True)
    for ax, ref in zip(axes, (FAIR, FILTER)):
        for k, model in enumerate(models):
            xs, ys, err = [], [], [[], []]
            for i, op in enumerate(ops):
                x = i - 0.4 + (k + 0.5) * width
                r = next(
                    (r for r in rows if (r.model, r.op, r.ref) == (model, op, ref)),
                    None,
                )
                if r is None:
                    ax.text(
                        x,
                        1.0,
                        "fails / n/a",
                        rotation=90,
                        ha="center",
                        va="bottom",
                        fontsize=7,
                    )
                    continue
                xs.append(x)
                ys.append(r.median)
                err[0].append(r.median - r.q1)
                err[1].append(r.q3 - r.median)
            ax.bar(xs, ys, width, yerr=err, label=model, color=f"C{k}")
        _one_line(ax)
        _log_ratio_axis(ax)
        ax.set(
            title=f"eqx.nn models: AutoModule vs {REF_TEXT[ref].replace('`', '')}",
            xlabel="operation",
            ylabel=RATIO_LABEL,
        )
        ax.legend(fontsize=8, ncol=5)
        ax.set_xticks(
            range(len(ops)), [_wrap(real.get("ops", {}).get(o, o)) for o in ops]
        )
        ax.tick_params(axis="x", labelbottom=True, labelsize=8)
    fig.tight_layout()
    return fig


def losses(results: dict[str, Any]) -> list[Ratio]:
    """Where AutoModule is slower: median ratio > 1, slowest first."""
    return sorted(
        (r for r in comparisons(results) if r.median > 1.0),
        key=lambda r: -r.median,
    )


def losses_text(results: dict[str, Any]) -> str:
    rows = comparisons(results)
    lost = losses(results)
    if not rows:
        return f"Paired ratios: {MISSING}."
    parts = []
    for ref in (FAIR, FILTER):
        n = sum(r.ref == ref for r in rows)
        slower = [r for r in lost if r.ref == ref]
        clear = [r for r in slower if r.q1 > 1.0 and r.paired]
        worst = ", ".join(f"{r.model} {r.label} {r.median:.2f}x" for r in slower[:3])
        parts.append(
            f"* vs **{ref}**: slower in {len(slower)} of {n} comparisons, "
            f"{len(clear)} of them with the whole interquartile range above 1.0"
            + (f"; largest: {worst}." if worst else ".")
        )
    text = "In this run:\n\n" + "\n".join(parts)
    if lost:
        text += "\n\n" + _table(
            ["section", "model", "op", "vs", "time ratio (IQR)", "IQR above 1"],
            [
                [
                    r.section,
                    r.model,
                    r.label,
                    r.ref,
                    r.text,
                    "yes" if r.q1 > 1 and r.paired else "no",
                ]
                for r in lost
            ],
        )
    missing = unmeasurable(results)
    if missing:
        text += "\n\nNot measurable (a baseline cannot run it):\n\n" + "\n".join(
            f"* {m}" for m in missing
        )
    return text


def plot_losses(results: dict[str, Any]) -> Figure | None:
    lost = losses(results)
    if not lost:
        print("AutoModule is not slower than either baseline anywhere in these results")
        return None
    fig, ax = plt.subplots(figsize=(11, 0.32 * len(lost) + 1.6))
    ys = range(len(lost))
    ax.barh(
        ys,
        [r.median for r in lost],
        xerr=[[r.median - r.q1 for r in lost], [r.q3 - r.median for r in lost]],
        color=[COLORS[r.ref] for r in lost],
    )
    ax.set_yticks(
        list(ys), [f"{r.model}: {r.label} (vs {r.ref})" for r in lost], fontsize=7
    )
    ax.invert_yaxis()
    _log_ratio_axis(ax, "x")
    _one_line(ax, vertical=True)
    ax.set(
        title="Where AutoModule is slower (median ratio > 1)",
        xlabel=RATIO_LABEL,
        ylabel="model: operation (baseline)",
    )
    handles = [Patch(color=COLORS[ref], label=f"vs {ref}") for ref in (FAIR, FILTER)]
    ax.legend(handles=[*handles, *ax.get_legend_handles_labels()[0]], fontsize=8)
    fig.tight_layout()
    return fig


def _count_cell(entry: dict[str, Any]) -> str:
    if "error" in entry:
        return "fails"
    return str(entry.get("count", "-")) + (" stale" if entry.get("stale") else "")


def retracing_text(results: dict[str, Any]) -> str:
    """Trace counts per scenario, from the run: where AutoModule traces more than the
    ideal or than another variant that got the right answer."""
    ret = results.get("retracing")
    if not ret or not ret.get("counts"):
        return f"Retracing: {MISSING}."
    scen = ret.get("scenarios", {})
    names = list(scen)
    counts = ret["counts"]
    ours_name = "autostatic / jax.jit"
    rows = [["ideal"] + [str(scen[n].get("ideal", "?")) for n in names]]
    rows += [
        [f"`{variant}`"] + [_count_cell(row.get(n, {})) for n in names]
        for variant, row in counts.items()
    ]
    ours = counts.get(ours_name, {})
    notes = []
    for n in names:
        mine = ours.get(n, {}).get("count")
        if mine is None:
            continue
        ideal = scen[n].get("ideal")
        if isinstance(ideal, int) and mine > ideal:
            notes.append(f"`{n}`: AutoModule traces {mine}x, ideal {ideal}")
        # A reference must have run and seen the change: not failed, not stale, and
        # not the dict floor where static values change (it closes over them).
        fewer = [
            f"`{v}` {row[n]['count']}"
            for v, row in counts.items()
            if v != ours_name
            and n in row
            and "error" not in row[n]
            and not row[n].get("stale")
            and (scen[n].get("static_values_equal", True) or not v.startswith("dict"))
            and row[n].get("count", mine) < mine
        ]
        if fewer:
            notes.append(f"`{n}`: AutoModule {mine}, fewer: {', '.join(fewer)}")
    text = _table(["variant"] + [f"`{n}`" for n in names], rows)
    text += "\n\n" + "\n".join(
        f"* `{n}`: {scen[n].get('description', '')}; ideal {scen[n].get('ideal', '?')}"
        for n in names
    )
    text += (
        "\n\nWhere AutoModule traces more than the ideal or than a variant that saw "
        "the change: " + ("; ".join(notes) if notes else "nowhere in this run") + "."
    )
    return text


def targets_text(results: dict[str, Any]) -> str:
    rows = []
    for t in results.get("targets", []):
        value = t.get("value")
        shown = f"{value:.2f}" if isinstance(value, float) else str(value)
        rows.append(
            [t.get("status", "?"), t.get("target", "?"), t.get("where", ""), shown]
        )
    return (
        _table(["status", "target", "where", "value"], rows)
        if rows
        else f"Targets: {MISSING}."
    )
