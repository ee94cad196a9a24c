"""Helpers of the design-exploration notebook (`design_exploration.ipynb`).

The notebook imports this module (it runs with `examples/` as its working folder, where
`make_notebook.py` executes it and where Jupyter starts a kernel for it) and keeps only
short calls in its cells. Three groups:

- `attempt` / `describe`: run a call that may fail and print the exception's type and
  first line, so the alternatives' demonstrations show real errors in one line each.
- views of one benchmark run: tables (markdown strings) and plots (figures). Every
  number about speed comes from the results file, never from a timing taken here.
- `conclusion`: the closing verdict, written from the same numbers and from the
  ecosystem report's pass counts.

Data: the committed `benchmarks/results/cpu/results.json` (written only by
`python -m benchmarks --quick --write-results`). For development only, the environment
variable `AUTOSTATIC_RESULTS` points at another results file; a notebook built that way
must not be committed (`make_notebook.py` refuses to overwrite the committed one then).
`tests/test_notebook.py` runs every view on a small synthetic results dict.
"""

import dataclasses
import json
import math
import os
import re
import sys
import textwrap
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, NullLocator

ROOT = Path(__file__).resolve().parents[1]
# `benchmarks` is a folder of the repository, not an installed package: put the
# repository on the path so the plots share the benchmark report's colours.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from benchmarks.report import IMPL_COLOURS  # noqa: E402

RESULTS_ENV = "AUTOSTATIC_RESULTS"
COMMITTED = "benchmarks/results/cpu/results.json"  # relative to the repository
ECOSYSTEM = "ecosystem/results/results.json"
FAIR, FILTER = "fair twin", "eqx.filter_jit"
REF_IMPL = {FAIR: "eqx-static", FILTER: "eqx-filter"}  # whose colour each baseline has
REF_TEXT = {
    FAIR: "fair twin (eqx.Module, non-array fields static, jax.jit)",
    FILTER: "eqx.filter_jit (eqx.Module without markers)",
}
IMPL_LABELS = {
    "autostatic": "AutoModule",
    "eqx-static": "eqx-static (fair twin)",
    "eqx-filter": "eqx-filter",
    "dataclass": "dataclass",
    "dict": "dict (floor)",
}
# Each implementation's own jit route: one dispatch line per implementation.
DISPATCH_ROUTE = {
    "autostatic": "autostatic / jax.jit",
    "eqx-static": "eqx-static / jax.jit",
    "eqx-filter": "eqx-filter / eqx.filter_jit",
    "dataclass": "dataclass / jax.jit",
    "dict": "dict / jax.jit",
}
RATIO_LABEL = "AutoModule time / baseline time\n(log scale; < 1: AutoModule faster)"
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
REAL, MODELS, TRAINING = "eqx.nn models", "benchmark models", "training step"
ECOSYSTEM_MODES = {
    "baseline": "as installed",
    "b": "rebased onto AutoModule, static markers kept",
    "b2": "rebased, every static marker removed",
}
MISSING = "not in these results"


# --------------------------------------------------------------------------------------
# Demonstrations: a call and its outcome, in one line.
# --------------------------------------------------------------------------------------

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_NON_ARRAY = re.compile(
    r"problematic value is of type <class '(?:[\w.]+\.)?(\w+)'>.* at path (\S+?)\.?$"
)


def describe(err: BaseException, width: int = 160) -> str:
    """`Type: first line` of an exception, without memory addresses (so the output is
    the same every run), shortened to `width` characters. JAX's long "non-array
    argument" message becomes the type and path it names."""
    lines = str(err).strip().splitlines()
    line = _ADDRESS.sub("", lines[0] if lines else "").rstrip("; ")
    found = _NON_ARRAY.search(line)
    if found:
        line = f"non-array leaf of type {found[1]} at path {found[2]}"
    if len(line) > width:
        line = line[: width - 3] + "..."
    return f"{type(err).__name__}: {line}"


def attempt(label: str, call: Callable[[], Any]) -> None:
    """Run `call()` and print `label: ok, <result>` or `label: <describe(error)>`.
    Any exception is caught: each demonstration is about which error a design choice
    produces. Nothing is returned, so a cell ending in a call shows only that line."""
    try:
        result = call()
    except Exception as err:
        print(f"{label}: {describe(err)}")
        return
    print(f"{label}: ok, {result}")


# --------------------------------------------------------------------------------------
# Loading and provenance.
# --------------------------------------------------------------------------------------


def results_path() -> tuple[Path, bool]:
    """The results file and whether it is the committed one."""
    override = os.environ.get(RESULTS_ENV)
    if override:
        return Path(override), False
    return ROOT / COMMITTED, True


def load_results() -> tuple[dict[str, Any], str]:
    """The run's results and a line saying where they come from."""
    path, committed = results_path()
    results = json.loads(path.read_text())
    source = (
        f"results: {COMMITTED} (committed; written by "
        "`python -m benchmarks --quick --write-results`)"
        if committed
        else f"results: {path} (from ${RESULTS_ENV}: development only, not committed)"
    )
    return results, source


def load_ecosystem() -> dict[str, Any]:
    """The ecosystem report's results (`python -m ecosystem`), or {} without one."""
    path = ROOT / ECOSYSTEM
    return json.loads(path.read_text()) if path.is_file() else {}


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
        "sections: " + ", ".join(k for k in results if k != "machine"),
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------
# Every paired ratio of AutoModule against the two baselines, in one list.
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Ratio:
    """AutoModule's time / a baseline's, for one model and operation."""

    section: str  # REAL, MODELS or TRAINING
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
        """`0.25x (0.21-0.30)`: median and interquartile range (an en dash)."""
        iqr = f" ({self.q1:.2f}–{self.q3:.2f})" if self.paired else " (medians)"
        return f"{self.median:.2f}x{iqr}"


def _stat(r: Any) -> tuple[float, float, float] | None:
    """(median, q1, q3) of a statistics record, or None if it has no finite ones."""
    if not isinstance(r, dict):
        return None
    try:
        med, q1, q3 = (float(r[k]) for k in ("median", "q1", "q3"))
    except (KeyError, TypeError, ValueError):
        return None
    return (med, q1, q3) if all(map(math.isfinite, (med, q1, q3))) else None


def _real_ratios(real: dict[str, Any]) -> list[Ratio]:
    """The eqx.nn models' ratios (`real_models` section), per op and baseline."""
    out = []
    labels = real.get("ops", {})
    for model, res in real.get("models", {}).items():
        for op, refs in res.get("ratios", {}).items():
            for ref, impl in REF_IMPL.items():
                stat = _stat(refs.get(impl))
                if stat:
                    out.append(Ratio(REAL, model, op, labels.get(op, op), ref, *stat))
    return out


def _tree_ops_ratios(tree_ops: dict[str, Any]) -> list[Ratio]:
    """The benchmark models' ratios (`tree_ops`): tree operations and dispatch."""
    out = []
    for model, res in tree_ops.items():
        for ref, impl in REF_IMPL.items():
            ratios = res.get("ratios", {}).get(impl, {}).get("autostatic", {})
            for op, r in ratios.items():
                stat = _stat(r)
                if stat:
                    label = OP_LABELS.get(str(op), str(op))
                    out.append(Ratio(MODELS, model, op, label, ref, *stat))
        dispatch = res.get("dispatch_us", {}).get("autostatic / jax.jit", {})
        for ref, variant in (
            (FAIR, "eqx-static / jax.jit"),
            (FILTER, "eqx-filter / eqx.filter_jit"),
        ):
            stat = _stat(dispatch.get("ratios", {}).get(variant))
            if stat:
                out.append(Ratio(MODELS, model, "dispatch", "jit dispatch", ref, *stat))
    return out


def _training_ratio(model: str, variants: dict[str, Any], ref: str) -> Ratio | None:
    """Time per step of AutoModule (`jax.jit`) / the baseline's: the inverse of the
    paired throughput ratio when the run has it, else the ratio of the medians."""
    ours = variants.get("autostatic / jax.jit", {})
    candidates = (
        ("eqx-static / jax.jit",)
        if ref == FAIR
        else ("eqx-filter / eqx.filter_jit", "eqx-static / eqx.filter_jit")
    )
    paired = ours.get("throughput_ratios", {})
    found = next((c for c in candidates if _stat(paired.get(c))), None)
    label = f"training step (vs {found or candidates[0]})"
    if found:
        med, q1, q3 = _stat(paired[found]) or (1.0, 1.0, 1.0)
        # steps/s ratio -> time ratio: 1/x flips the quartiles.
        return Ratio(TRAINING, model, "step", label, ref, 1 / med, 1 / q3, 1 / q1)
    a = ours.get("ms_per_step")
    b = variants.get(candidates[0], {}).get("ms_per_step")
    if not (isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0):
        return None
    return Ratio(TRAINING, model, "step", label, ref, a / b, a / b, a / b, False)


def _training_ratios(training: dict[str, Any]) -> list[Ratio]:
    """The training step's time ratios, per model and baseline."""
    found = (
        _training_ratio(model, res.get("variants", {}), ref)
        for model, res in training.items()
        for ref in (FAIR, FILTER)
    )
    return [r for r in found if r is not None]


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


def headline_section(rows: list[Ratio]) -> str:
    """The eqx.nn models when the run has them, else the benchmark models."""
    return REAL if any(r.section == REAL for r in rows) else MODELS


def headline(rows: list[Ratio], section: str, op: str, ref: str) -> dict[str, Ratio]:
    """Per model, the ratio of `op` against `ref` in `section`. Where plain `jax.jit`
    refuses the fair twin, its dispatch is the twin partitioned once (`PARTITIONED`),
    as the tables mark with †."""
    found = {r.model: r for r in rows if (r.section, r.op, r.ref) == (section, op, ref)}
    if op == "dispatch":
        for r in rows:
            if (r.section, r.op, r.ref) == (section, PARTITIONED, ref):
                found.setdefault(r.model, r)
    return found


# --------------------------------------------------------------------------------------
# Tables (markdown strings).
# --------------------------------------------------------------------------------------


def _table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def _cell(r: Ratio | None) -> str:
    """A table cell: the median ratio, † when it is the partitioned twin's."""
    if r is None:
        return "-"
    return f"{r.median:.2f}x" + ("†" if r.op == PARTITIONED else "")


def _both_baselines_table(rows: list[Ratio], section: str) -> str:
    """Headline ops (rows) by model (columns); cells `vs fair twin / vs filter_jit`."""
    models = list(dict.fromkeys(r.model for r in rows if r.section == section))
    body = []
    for op in HEADLINE_OPS:
        fair, filt = (
            headline(rows, section, op, FAIR),
            headline(rows, section, op, FILTER),
        )
        if fair or filt:
            cells = [f"{_cell(fair.get(m))} / {_cell(filt.get(m))}" for m in models]
            body.append([OP_LABELS[op], *cells])
    if not body:
        return f"{section}: {MISSING}"
    text = (
        f"**{section}** (AutoModule time / baseline time, lower is better, < 1: "
        f"AutoModule faster; cells: vs {FAIR} / vs {FILTER})\n\n"
    )
    text += _table(["op", *models], body)
    if "†" in text:
        text += (
            "\n\n†: plain `jax.jit` refuses the fair twin (a function field Equinox "
            "does not mark static); against it partitioned once by `eqx.partition`, "
            "`jax.jit` over its arrays."
        )
    return text


def fair_twin_table(results: dict[str, Any]) -> str:
    """AutoModule against both baselines: headline ops per model (the eqx.nn models
    when the run has them), and the training step."""
    rows = comparisons(results)
    text = _both_baselines_table(rows, headline_section(rows))
    train = [r for r in rows if r.section == TRAINING]
    if train:
        text += "\n\n**training step** (time per step, lower is better)\n\n"
        text += _table(
            ["model", "baseline", "time ratio (IQR)"],
            [[r.model, r.label.split("vs ", 1)[-1].rstrip(")"), r.text] for r in train],
        )
    return text


def models_table(results: dict[str, Any]) -> str:
    """The benchmark models (MLPs by depth, transformer, mixed) against both
    baselines: the table that replaces a ratio-per-depth line plot."""
    return _both_baselines_table(comparisons(results), MODELS)


def _loss_groups(rows: list[Ratio]) -> dict[tuple[str, str, str], list[Ratio]]:
    """Ratios grouped by (section, operation label, baseline), groups in order."""
    groups: dict[tuple[str, str, str], list[Ratio]] = {}
    for r in rows:
        groups.setdefault((r.section, r.label, r.ref), []).append(r)
    return groups


def losses(results: dict[str, Any]) -> list[Ratio]:
    """Where AutoModule is slower: median ratio > 1, slowest first."""
    return sorted(
        (r for r in comparisons(results) if r.median > 1.0), key=lambda r: -r.median
    )


def _span(values: Iterable[float]) -> str:
    """`0.21x-0.29x` (with an en dash), or one number when they print alike."""
    kept = list(values)
    lo, hi = (f"{v:.2f}x" for v in (min(kept), max(kept)))
    return lo if lo == hi else f"{lo}–{hi}"


def _loss_summary(rows: list[Ratio], lost: list[Ratio]) -> str:
    """Per baseline: in how many comparisons AutoModule is slower, how clearly."""
    parts = []
    for ref in (FAIR, FILTER):
        n = sum(r.ref == ref for r in rows)
        slower = [r for r in lost if r.ref == ref]
        clear = [r for r in slower if r.q1 > 1.0 and r.paired]
        parts.append(
            f"* vs **{ref}**: slower in {len(slower)} of {n} comparisons, "
            f"{len(clear)} of them with the whole interquartile range above 1.0."
        )
    return "In this run:\n\n" + "\n".join(parts)


def losses_text(results: dict[str, Any]) -> str:
    """Where AutoModule is slower, one row per operation and baseline (the models it
    is slower on, the range of their ratios), then what a baseline cannot run."""
    rows = comparisons(results)
    if not rows:
        return f"Paired ratios: {MISSING}."
    lost = losses(results)
    text = _loss_summary(rows, lost)
    body = [
        [
            section,
            label,
            ref,
            ", ".join(r.model for r in group),
            _span(r.median for r in group),
            f"{sum(r.q1 > 1 and r.paired for r in group)} of {len(group)}",
        ]
        for (section, label, ref), group in _loss_groups(lost).items()
    ]
    if body:
        header = ["section", "op", "vs", "slower on", "ratio", "IQR above 1"]
        text += "\n\n" + _table(header, body)
    missing = unmeasurable(results)
    if missing:
        text += "\n\nNot measurable (a baseline cannot run it):\n\n" + "\n".join(
            f"* {m}" for m in missing
        )
    return text


def _count_cell(entry: dict[str, Any]) -> str:
    """A trace count, "fails" or "N stale" (the floor did not see the change)."""
    if "error" in entry:
        return "fails"
    return str(entry.get("count", "-")) + (" stale" if entry.get("stale") else "")


def _fewer_traces(ret: dict[str, Any], name: str, mine: int) -> list[str]:
    """Variants that traced scenario `name` fewer times than AutoModule and saw the
    change: not failed, not stale, and not the dict floor where static values change
    (it closes over them)."""
    equal = ret["scenarios"][name].get("static_values_equal", True)
    return [
        f"`{v}` {row[name]['count']}"
        for v, row in ret["counts"].items()
        if v != "autostatic / jax.jit"
        and name in row
        and "error" not in row[name]
        and not row[name].get("stale")
        and (equal or not v.startswith("dict"))
        and row[name].get("count", mine) < mine
    ]


def retracing_text(results: dict[str, Any]) -> str:
    """Trace counts per scenario, from the run, and where AutoModule traces more than
    the ideal or than another variant that got the right answer."""
    ret = results.get("retracing")
    if not ret or not ret.get("counts"):
        return f"Retracing: {MISSING}."
    scen, counts = ret.get("scenarios", {}), ret["counts"]
    names = list(scen)
    rows = [["ideal"] + [str(scen[n].get("ideal", "?")) for n in names]]
    rows += [
        [f"`{v}`"] + [_count_cell(row.get(n, {})) for n in names]
        for v, row in counts.items()
    ]
    notes = []
    for n in names:
        mine = counts.get("autostatic / jax.jit", {}).get(n, {}).get("count")
        if mine is None:
            continue
        ideal = scen[n].get("ideal")
        if isinstance(ideal, int) and mine > ideal:
            notes.append(f"`{n}`: AutoModule traces {mine}x, ideal {ideal}")
        fewer = _fewer_traces(ret, n, mine)
        if fewer:
            notes.append(f"`{n}`: AutoModule {mine}, fewer: {', '.join(fewer)}")
    text = _table(["variant"] + [f"`{n}`" for n in names], rows)
    text += "\n\n" + "\n".join(
        f"* `{n}`: {scen[n].get('description', '')}; ideal {scen[n].get('ideal', '?')}"
        for n in names
    )
    return text + (
        "\n\nWhere AutoModule traces more than the ideal or than a variant that saw "
        "the change: " + ("; ".join(notes) if notes else "nowhere in this run") + "."
    )


def targets_text(results: dict[str, Any]) -> str:
    """The run's targets, MET / MISSED as `python -m benchmarks` judged them."""
    rows = []
    for t in results.get("targets", []):
        value = t.get("value")
        shown = f"{value:.2f}" if isinstance(value, float) else str(value)
        rows.append(
            [t.get("status", "?"), t.get("target", "?"), t.get("where", ""), shown]
        )
    header = ["status", "target", "where", "value"]
    return _table(header, rows) if rows else f"Targets: {MISSING}."


# --------------------------------------------------------------------------------------
# Plots. Each returns its figure; every Axes has a title saying which way is better,
# an x label and a y label; colours are the benchmark report's, per implementation.
# --------------------------------------------------------------------------------------


def _one_line(ax: Axes, vertical: bool = False) -> None:
    """The 1.0 line (same time), with the side where AutoModule is slower shaded."""
    line, span = (ax.axvline, ax.axvspan) if vertical else (ax.axhline, ax.axhspan)
    line(1.0, color="black", linestyle="--", linewidth=1, label="1.0: same time")
    span(1.0, 1e3, color="tab:red", alpha=0.06, label="AutoModule slower")


def _log_ratio_axis(ax: Axes, axis: str = "y") -> None:
    """Log scale, ticks written as ratios (0.2x, 1x, 3x)."""
    (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    target.set_minor_formatter(  # label 0.2, 0.5, 2, 5, ... between the decades
        FuncFormatter(lambda v, _: f"{v:g}x" if f"{v:.0e}"[0] in "25" else "")
    )


def _fit_ratios(ax: Axes, values: list[float], axis: str = "y") -> None:
    """Limits around the plotted ratios and 1.0 (the shading would stretch them)."""
    lo, hi = min([1.0, *values]) / 1.5, max([1.0, *values]) * 1.5
    (ax.set_ylim if axis == "y" else ax.set_xlim)(lo, hi)


def _wrap(text: str, width: int = 14) -> str:
    """Tick labels on several short lines."""
    return "\n".join(textwrap.wrap(text, width, break_long_words=False)) or text


def _depth_series(
    mlps: list[tuple[int, dict[str, Any]]], impl: str, op: str
) -> tuple[list[int], list[tuple[float, float, float]]]:
    """(depths, stats) of `op` for `impl` on the MLPs that have it; "dispatch" is
    the implementation's own jit route (`DISPATCH_ROUTE`)."""
    points = [
        (
            n,
            _stat(
                r.get("dispatch_us", {}).get(DISPATCH_ROUTE[impl])
                if op == "dispatch"
                else r.get("ops_us", {}).get(impl, {}).get(op)
            ),
        )
        for n, r in mlps
    ]
    kept = [(n, s) for n, s in points if s]
    return [n for n, _ in kept], [s for _, s in kept]


def _time_panel(ax: Axes, mlps: list[tuple[int, dict[str, Any]]], op: str) -> None:
    """One line per implementation: median µs of `op` against depth, IQR shaded."""
    for impl in DISPATCH_ROUTE:
        xs, ys = _depth_series(mlps, impl, op)
        if xs:
            colour = IMPL_COLOURS[impl]
            ax.plot(xs, [s[0] for s in ys], "o-", color=colour, label=IMPL_LABELS[impl])
            ax.fill_between(
                xs, [s[1] for s in ys], [s[2] for s in ys], color=colour, alpha=0.15
            )
    depths = [n for n, _ in mlps]
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(depths, [str(d) for d in depths])
    ax.xaxis.set_minor_locator(NullLocator())
    title = "jit dispatch (each with its own jit)" if op == "dispatch" else op
    ax.set(
        title=f"{title}: lower is better",
        xlabel="MLP depth (layers)",
        ylabel="median µs per call (log)",
    )


def plot_mlp_overhead(results: dict[str, Any]) -> Figure | None:
    """Absolute µs of flatten, unflatten and jit dispatch against MLP depth, one line
    per implementation (interquartile range shaded), one legend for the figure."""
    tree_ops = results.get("tree_ops") or {}
    mlps = sorted(
        (int(name.split("-")[1]), res)
        for name, res in tree_ops.items()
        if name.startswith("mlp-")
    )
    if not mlps:
        print(f"MLP tree ops: {MISSING}")
        return None
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    for ax, op in zip(axes, ("flatten", "unflatten", "dispatch")):
        _time_panel(ax, mlps, op)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def _training_panel(ax: Axes, model: str, variants: dict[str, Any]) -> None:
    """Horizontal bars: ms per step of each variant, colour per implementation,
    hatched where it runs under `eqx.filter_jit`."""
    names = [v for v in variants if v.split(" / ")[0] in IMPL_COLOURS]
    for y, name in enumerate(names):
        impl, jit = name.split(" / ")
        entry = variants[name]
        ms = entry.get("ms_per_step")
        if not isinstance(ms, (int, float)):
            continue
        q1, q3 = entry.get("ms_iqr") or (ms, ms)
        ax.barh(
            y,
            ms,
            xerr=[[ms - q1], [q3 - ms]],
            color=IMPL_COLOURS[impl],
            hatch="//" if jit == "eqx.filter_jit" else "",
            edgecolor="white",
        )
        ax.annotate(f" {ms:.2f}", (max(ms, q3), y), va="center", fontsize=8)
    labels = [f"{IMPL_LABELS[n.split(' / ')[0]]}\n{n.split(' / ')[1]}" for n in names]
    ax.set_yticks(range(len(names)), labels)
    ax.invert_yaxis()
    ax.set(
        title=f"{model}: training step, lower is better",
        xlabel="ms per step (median; whiskers: IQR)",
        ylabel="implementation / jit",
    )


def plot_training(results: dict[str, Any]) -> Figure | None:
    """Time per training step (forward + grad + optax adam) of every implementation,
    one panel per model."""
    training = results.get("training") or {}
    if not training:
        print(f"training step: {MISSING}")
        return None
    fig = plt.figure(figsize=(6.5 * len(training), 3.8))
    for i, (model, res) in enumerate(training.items()):
        ax = fig.add_subplot(1, len(training), i + 1)
        _training_panel(ax, model, res.get("variants", {}))
    fig.tight_layout()
    return fig


MODEL_MARKERS = ("o", "s", "^", "D", "v", "P")


def _real_panel(
    ax: Axes, rows: list[Ratio], ref: str, ops: list[str], models: list[str]
) -> None:
    """Markers against baseline `ref`: x = operation, one marker shape per model."""
    rows = [r for r in rows if r.ref == ref]
    by = {(r.model, r.op): r for r in rows}
    offset = 0.6 / max(len(models), 1)
    for k, model in enumerate(models):
        for i, op in enumerate(ops):
            x = i - 0.3 + (k + 0.5) * offset
            r = by.get((model, op))
            if r is None:
                ax.text(x, 1.0, "fails / n/a", rotation=90, ha="center", fontsize=7)
                continue
            ax.errorbar(
                x,
                r.median,
                yerr=[[r.median - r.q1], [r.q3 - r.median]],
                marker=MODEL_MARKERS[k % len(MODEL_MARKERS)],
                color=IMPL_COLOURS[REF_IMPL[ref]],
                markeredgecolor="black",
                linestyle="none",
            )
    _one_line(ax)
    _log_ratio_axis(ax)
    _fit_ratios(ax, [r.q3 for r in rows] + [r.q1 for r in rows])
    ax.set(
        title=f"eqx.nn models vs {REF_TEXT[ref]}: lower is better",
        xlabel="operation",
        ylabel=RATIO_LABEL,
    )


def plot_real_models(results: dict[str, Any]) -> Figure | None:
    """One panel per baseline: AutoModule's time ratio per operation, one marker per
    eqx.nn model (whiskers: IQR of the paired ratios); 'fails / n/a' where the
    baseline cannot run the operation."""
    real = results.get("real_models")
    if not real or not real.get("models"):
        print(
            f"eqx.nn models (real_models section): {MISSING} "
            f"({results.get('machine', {}).get('date', '?')}). "
            "Run `python -m benchmarks --quick --write-results` to add them."
        )
        return None
    rows = [r for r in comparisons(results) if r.section == REAL]
    ops = list(real.get("ops") or dict.fromkeys(r.op for r in rows))
    models = list(real["models"])
    fig, axes = plt.subplots(2, 1, figsize=(14, 8.5), sharex=True)
    for ax, ref in zip(axes, (FAIR, FILTER)):
        _real_panel(ax, rows, ref, ops, models)
        ax.set_xticks(range(len(ops)), [_wrap(real["ops"].get(o, o)) for o in ops])
        ax.tick_params(axis="x", labelbottom=True, labelsize=8)
    shapes = [
        Line2D(
            [], [], marker=MODEL_MARKERS[k % len(MODEL_MARKERS)], color="grey", ls=""
        )
        for k in range(len(models))
    ]
    handles, labels = axes[0].get_legend_handles_labels()
    axes[0].legend([*shapes, *handles], [*models, *labels], fontsize=8, ncol=3)
    fig.tight_layout()
    return fig


def plot_losses(results: dict[str, Any]) -> Figure | None:
    """One row per operation where AutoModule is slower somewhere: every model's ratio
    as a dot, coloured by baseline; the full list is `losses_text`'s table."""
    lost = losses(results)
    if not lost:
        print("AutoModule is not slower than either baseline anywhere in these results")
        return None
    keys = list(dict.fromkeys((r.section, r.label) for r in lost))
    rows = [r for r in comparisons(results) if (r.section, r.label) in keys]
    fig, ax = plt.subplots(figsize=(11, 0.5 * len(keys) + 1.8))
    for ref, shift in ((FAIR, -0.12), (FILTER, 0.12)):
        mine = [r for r in rows if r.ref == ref]
        ys = [keys.index((r.section, r.label)) + shift for r in mine]
        colour = IMPL_COLOURS[REF_IMPL[ref]]
        ax.scatter([r.median for r in mine], ys, color=colour, label=f"vs {ref}")
    ax.set_yticks(range(len(keys)), [f"{s}: {_wrap(op, 40)}" for s, op in keys])
    ax.invert_yaxis()
    _one_line(ax, vertical=True)
    _log_ratio_axis(ax, "x")
    _fit_ratios(ax, [r.median for r in rows], "x")
    ax.set(
        title="Operations where AutoModule is slower somewhere "
        "(one dot per model; lower is better)",
        xlabel=RATIO_LABEL.replace("\n", " "),
        ylabel="section: operation",
    )
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------
# The conclusion, written from the numbers.
# --------------------------------------------------------------------------------------


def _against(rows: list[Ratio], section: str, op: str) -> str | None:
    """`0.21x-0.29x the fair twin's time and 0.18x-0.27x eqx.filter_jit's`."""
    parts = []
    for ref, whose in ((FAIR, "the fair twin's time"), (FILTER, f"{FILTER}'s")):
        found = headline(rows, section, op, ref)
        if found:
            marked = sum(r.op == PARTITIONED for r in found.values())
            note = f" (on {marked}, the twin partitioned once, †)" if marked else ""
            parts.append(f"{_span(r.median for r in found.values())} {whose}{note}")
    return " and ".join(parts) or None


def _split_ops(rows: list[Ratio], section: str) -> dict[str, list[str]]:
    """Headline ops by verdict: AutoModule faster on every model against both
    baselines, slower on every model against both, or mixed."""
    split: dict[str, list[str]] = {"faster": [], "slower": [], "mixed": []}
    for op in HEADLINE_OPS:
        found = [
            r.median
            for ref in (FAIR, FILTER)
            for r in headline(rows, section, op, ref).values()
        ]
        if found:
            kind = (
                "faster" if max(found) < 1 else "slower" if min(found) > 1 else "mixed"
            )
            split[kind].append(op)
    return split


def _ecosystem_lines(ecosystem: dict[str, Any]) -> list[str]:
    """`lineax 0.1.1: 114 of 115 pass rebased ..., 115 as installed.` per library."""
    lines = []
    for library, result in ecosystem.items():
        outcomes = [
            f"{o['passed']} of {o['selected']} pass "
            f"{ECOSYSTEM_MODES.get(o['mode'], o['mode'])}"
            for o in result.get("outcomes", [])
        ]
        if outcomes:
            version = result.get("version", "?")
            lines.append(f"* {library} {version}: " + "; ".join(outcomes) + ".")
    return lines


# When each headline operation is paid: what makes a ratio matter.
OP_PAID = {
    "flatten": "paid on every jit call and tree operation",
    "dispatch": "paid on every jit call",
    "unflatten_read": "paid when the fields of a transformed model are read",
    "treedef_eq": "paid when a jit cache lookup compares structures",
    "build": "paid once per model, when it is constructed",
}


def _ops_lines(rows: list[Ratio], section: str, ops: list[str]) -> list[str]:
    """One bullet per op: when it is paid, and its ranges against both baselines."""
    return [
        f"* {OP_LABELS[op]} ({OP_PAID[op]}): {_against(rows, section, op)}."
        for op in ops
    ]


def _names(ops: list[str]) -> str:
    """`flatten, unflatten + read all and build`."""
    names = [OP_LABELS[op] for op in ops]
    return " and ".join(filter(None, [", ".join(names[:-1]), *names[-1:]]))


def _verdict(split: dict[str, list[str]], rows: list[Ratio]) -> str:
    """The closing sentence: which operations win on every model, which lose."""
    parts = [
        f"AutoModule is faster than both baselines on every model in "
        f"{_names(split['faster'])}"
        if split["faster"]
        else "AutoModule is faster than both baselines in no operation on every model"
    ]
    train = [r.median for r in rows if r.section == TRAINING and r.ref == FAIR]
    if train:
        parts.append(f"a training step takes {_span(train)} of the fair twin's time")
    slower = _names(split["slower"]) or "no operation on every model"
    return f"**Verdict.** In this run {', and '.join(parts)}; it is slower in {slower}."


def _buys(rows: list[Ratio], section: str, split: dict[str, list[str]]) -> list[str]:
    """The gains: what the design removes, then the ops faster on every model and
    the training step."""
    lines = [
        "**What it buys.** No static markers and no `eqx.filter_jit`: plain "
        "`jax.jit`, `jax.grad` and `jax.vmap` take the model as it is; no array is "
        "left static and no `tree_map` changes the structure, where the rejected "
        "rules above failed.",
        *_ops_lines(rows, section, split["faster"]),
    ]
    train = _against(rows, TRAINING, "step")
    if train:
        lines.append(f"* training step (forward + grad + adam): {train}.")
    if split["mixed"]:
        mixed = _ops_lines(rows, section, split["mixed"])
        lines += ["", "**Faster or slower, by model.**", *mixed]
    return lines


def _costs(rows: list[Ratio], section: str, split: dict[str, list[str]]) -> list[str]:
    """The losses: the ops slower on every model, and the count over every section."""
    lost = [r for r in rows if r.median > 1.0]
    counts = [
        f"{sum(r.ref == ref for r in lost)} of {sum(r.ref == ref for r in rows)}"
        for ref in (FAIR, FILTER)
    ]
    return [
        "**What it costs.**",
        *_ops_lines(rows, section, split["slower"]),
        f"* Slower in {counts[0]} comparisons with the fair twin and {counts[1]} with "
        f"{FILTER} (every section, table above); a Python float that changes between "
        "calls compiles again (section 4).",
    ]


def conclusion(results: dict[str, Any], ecosystem: dict[str, Any]) -> str:
    """What the design buys and what it costs, in sentences built from the run's
    ratios (range over the models) and the ecosystem report's pass counts."""
    rows = comparisons(results)
    section = headline_section(rows)
    models = sorted({r.model for r in rows if r.section == section})
    split = _split_ops(rows, section)
    m = results.get("machine", {})
    text = [
        f"**Conclusion**, from the run of {m.get('date', '?')} (commit "
        f"{m.get('git_commit', '?')}): AutoModule time / baseline time, the range "
        f"over the {len(models)} {section} ({', '.join(models)}).",
        "",
        *_buys(rows, section, split),
        "",
        *_costs(rows, section, split),
    ]
    eco = _ecosystem_lines(ecosystem)
    if eco:
        text += ["", "**Ecosystem** (each library's own tests, sampled):", *eco]
    return "\n".join([*text, "", _verdict(split, rows)])
