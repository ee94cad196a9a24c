"""The PNG plots: pytree overhead against MLP depth, and training throughput.

One colour per implementation in every plot; the jit used is the line or hatch style.
"""

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import models as M
from ..schema import Results, Stat, Training, TreeOpsGroup
from ..training import TRAIN_VARIANTS
from .format import FAIR_TWIN, mlp_depths

IMPL_COLOURS: dict[str, str] = {
    "autostatic": "tab:blue",
    "eqx-static": "tab:orange",
    "eqx-filter": "tab:green",
    "dataclass": "tab:purple",
    "dict": "black",
    M.PYNODE: "grey",
}
JIT_LINES: dict[str, str] = {M.JAX_JIT: "-", M.FILTER_JIT: "--"}
JIT_HATCHES: dict[str, str] = {M.JAX_JIT: "", M.FILTER_JIT: "//"}
PARITY: Stat = {"median": 1.0, "q1": 1.0, "q3": 1.0, "n": 0}  # the fair twin vs itself


def plot(results: Results, out: Path) -> list[str]:
    """Writes the PNGs of the sections that ran; returns their file names (none if
    matplotlib is missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    figures = (
        _draw_overhead_plot(results, out, plt),
        _draw_training_plot(results, out, plt),
    )
    return [name for name in figures if name]


def _draw_errorbar(ax: Any, pts: Sequence[tuple[int, Stat]], **style: Any) -> None:
    """Medians of `pts` ((x, {median, q1, q3})) with interquartile bars."""
    ax.errorbar(
        [x for x, _ in pts],
        [e["median"] for _, e in pts],
        yerr=[
            [e["median"] - e["q1"] for _, e in pts],
            [e["q3"] - e["median"] for _, e in pts],
        ],
        capsize=2,
        marker="o",
        **style,
    )


def _plot_tree_op(
    axes: Any, column: int, op: str, mlps: list[tuple[int, TreeOpsGroup]]
) -> None:
    """One tree op's column: µs on top, the paired ratio to the fair twin's class
    below."""
    for impl in M.IMPLS + (M.PYNODE,):
        style = {"color": IMPL_COLOURS[impl], "label": impl}
        if impl == M.PYNODE:
            style |= {"linestyle": ":", "label": f"{impl} (floor)"}
        times = [(n, r["ops_us"][impl][op]) for n, r in mlps if impl in r["ops_us"]]
        if times:
            _draw_errorbar(axes[0, column], times, **style)
        ratios = [
            (n, r["ratios"]["eqx-static"][impl][op])
            for n, r in mlps
            if op in r.get("ratios", {}).get("eqx-static", {}).get(impl, {})
        ]
        if ratios:
            _draw_errorbar(axes[1, column], ratios, **style)
    axes[0, column].set_title(f"tree_{op}: µs, lower is better")
    axes[1, column].set_title(f"tree_{op}: time / fair twin's, lower is better")


def _plot_dispatch(axes: Any, mlps: list[tuple[int, TreeOpsGroup]]) -> None:
    """The dispatch column: µs per call on top, the paired ratio to the fair twin
    below (the fair twin itself at 1)."""
    for impl, jit in M.VARIANTS:
        name = M.variant_name(impl, jit)
        style = {
            "color": IMPL_COLOURS[impl],
            "linestyle": JIT_LINES[jit],
            "label": name,
        }
        entries = [(n, r["dispatch_us"].get(name)) for n, r in mlps]
        times = [(n, e) for n, e in entries if e and "fails" not in e]
        if times:
            _draw_errorbar(axes[0, 2], times, **style)
        ratios: list[tuple[int, Stat]] = [
            (n, e["ratios"][FAIR_TWIN]) for n, e in times if FAIR_TWIN in e["ratios"]
        ]
        if name == FAIR_TWIN:
            ratios = [(n, PARITY) for n, _ in times]
        if ratios:
            _draw_errorbar(axes[1, 2], ratios, **style)
    axes[0, 2].set_title("jit dispatch (compiled, blocked): µs, lower is better")
    axes[1, 2].set_title("jit dispatch: time / fair twin's, lower is better")


def _draw_overhead_plot(results: Results, out: Path, plt: Any) -> str | None:
    """Top row: medians per operation against MLP depth; bottom row: the paired
    ratios to the fair twin that the tables use. Lower is better throughout."""
    tree_ops = results.get("tree_ops", {})
    mlps = sorted((n, tree_ops[f"mlp-{n}"]) for n in mlp_depths(tree_ops))
    if not mlps:  # not run (`--only`)
        return None
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5), sharex=True)
    for column, op in enumerate(("flatten", "unflatten")):
        _plot_tree_op(axes, column, op, mlps)
    _plot_dispatch(axes, mlps)
    for ax in axes[0]:
        ax.set_ylabel("µs (median, IQR bars)")
        ax.set_yscale("log")
    for ax in axes[1]:
        ax.axhline(1.0, color="tab:orange", linewidth=0.8)
        ax.set_ylabel("ratio, paired per round (median, IQR bars)")
        ax.set_yscale("log")
        ax.set_xlabel("MLP layers N")
    for ax in axes.flat:
        ax.set_xscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(
        f"Pytree overhead vs depth ({results['machine']['backend']}, "
        f"{results['machine']['mode']} mode); fair twin: eqx-static under jax.jit"
    )
    fig.tight_layout()
    fig.savefig(out / "overhead_vs_n.png", dpi=110)
    plt.close(fig)
    return "overhead_vs_n.png"


Bar = tuple[float, float, float]  # height, and how far the IQR bar reaches below, above


def _read_paired_throughput(
    training: dict[str, Training], model: str, name: str
) -> Bar | None:
    """`name`'s throughput over the fair twin's, paired per round."""
    entry = training[model]["variants"].get(name)
    if not entry or "fails" in entry:
        return None
    r = entry["throughput_ratios"].get(FAIR_TWIN)
    if not r:
        return None
    return r["median"], r["median"] - r["q1"], r["q3"] - r["median"]


def _read_raw_throughput(
    training: dict[str, Training], model: str, name: str
) -> Bar | None:
    """`name`'s median steps/s, with bars from its time per step's quartiles."""
    v = training[model]["variants"].get(name)
    if not v or "fails" in v:
        return None
    lo, hi = v["ms_iqr"]  # milliseconds per step: the fast end is the high throughput
    return v["steps_per_s"], v["steps_per_s"] - 1e3 / hi, 1e3 / lo - v["steps_per_s"]


def _plot_throughput_bars(
    paired: Any, raw: Any, training: dict[str, Training]
) -> float:
    """One bar per variant and model on both axes; returns the bars' width."""
    models = list(training)
    width = 0.8 / max(1, len(TRAIN_VARIANTS))
    for i, (impl, jit) in enumerate(TRAIN_VARIANTS):
        name = M.variant_name(impl, jit)
        style = {
            "color": IMPL_COLOURS[impl],
            "hatch": JIT_HATCHES[jit],
            "edgecolor": "white" if not JIT_HATCHES[jit] else "black",
            "label": name,
            "capsize": 2,
            "ecolor": "dimgrey",
        }
        for ax, values in (
            (paired, [_read_paired_throughput(training, m, name) for m in models]),
            (raw, [_read_raw_throughput(training, m, name) for m in models]),
        ):
            bars = [(j + i * width, v) for j, v in enumerate(values) if v]
            if bars:
                ax.bar(
                    [x for x, _ in bars],
                    [v[0] for _, v in bars],
                    width,
                    yerr=[[v[1] for _, v in bars], [v[2] for _, v in bars]],
                    **style,
                )
    return width


def _draw_training_plot(results: Results, out: Path, plt: Any) -> str | None:
    """Left: throughput paired per round against the fair twin, the ratio the tables
    use; right: the raw medians, which come from different rounds and so can order
    two close variants differently. Higher is better in both."""
    training = results.get("training", {})
    if not training:  # not run (`--only`)
        return None
    fig, (paired, raw) = plt.subplots(1, 2, figsize=(14, 4.8))
    width = _plot_throughput_bars(paired, raw, training)
    ticks = [j + width * (len(TRAIN_VARIANTS) - 1) / 2 for j in range(len(training))]
    paired.axhline(1.0, color="tab:orange", linewidth=0.8)
    paired.set_ylabel("steps/s / fair twin's, paired per round")
    paired.set_title(
        "Throughput vs the fair twin (the tables' ratio), higher is better"
    )
    raw.set_ylabel("training steps / s (median of rounds)")
    raw.set_title("Raw throughput, higher is better (medians of separate rounds)")
    for ax in (paired, raw):
        ax.set_xticks(ticks, list(training))
        ax.legend(fontsize=7)
        ax.grid(True, axis="y", which="both", alpha=0.3)
    fig.suptitle(
        f"Training-step throughput ({results['machine']['backend']}, "
        f"{results['machine']['mode']} mode); IQR bars"
    )
    fig.tight_layout()
    fig.savefig(out / "training_throughput.png", dpi=110)
    plt.close(fig)
    return "training_throughput.png"
