"""Formatting: times, ratios and markdown tables, and the names every table gives the
baselines.

Every table shows medians with the interquartile range, and ratios that are paired per
round (see `timing`).
"""

import math
from collections.abc import Iterable

from .. import models as M
from ..schema import Stat

# The variants the report compares AutoModule under plain `jax.jit` with.
FAIR_TWIN = M.variant_name("eqx-static", M.JAX_JIT)  # same code, static fields marked
EQX_STATIC_FILTER = M.variant_name("eqx-static", M.FILTER_JIT)
EQX_FILTER_FILTER = M.variant_name("eqx-filter", M.FILTER_JIT)  # what users run
DICT_JIT = M.variant_name("dict", M.JAX_JIT)
AUTO_JIT = M.variant_name("autostatic", M.JAX_JIT)
# The three references AutoModule is compared with, against each of which a tree-op
# ratio is given (no jit involved), in that order, and what each one is.
REF_IMPLS: tuple[str, ...] = ("eqx-static", "eqx-filter", "dict")
REF_IMPL_NOTES: dict[str, str] = {
    "eqx-static": "the fair twin's class (eqx.Module, static fields marked)",
    "eqx-filter": "eqx.Module without markers (what Equinox users write for "
    "`eqx.filter_jit`)",
    "dict": "the floor (arrays in plain dicts)",
}
OP_LABELS: dict[str, str] = {
    "flatten": "flatten",
    "unflatten": "unflatten",
    "flatten_with_path": "flatten_with_path",
    "treedef_eq": "treedef ==",
    "unflatten_read": "unflatten + read all",
    "build": "build model",
}

BAR = " \\| "  # a `|` inside a markdown table cell


def ref_label(variant: str) -> str:
    """A reference variant's name, the fair twin marked as such."""
    return f"{variant} (fair twin)" if variant == FAIR_TWIN else variant


def mlp_depths(names: Iterable[str]) -> list[int]:
    """The depths of the MLPs among models' results names (`mlp-32`: 32)."""
    return [int(k.split("-")[1]) for k in names if k.startswith("mlp-")]


def fmt_time_us(us: float | None, unit: bool = False) -> str:
    """µs with 3 significant digits; >= 1 ms as ms (always labelled)."""
    if us is None or not math.isfinite(us):
        return "-"
    if us >= 1000:
        return f"{us / 1000:.2f} ms"
    text = f"{us:.0f}" if us >= 100 else f"{us:.1f}" if us >= 10 else f"{us:.2f}"
    return text + (" µs" if unit else "")


def fmt_stat_us(stat: Stat | None, unit: bool = False) -> str:
    """The median with its quartiles in brackets, in µs; `-` if not measured."""
    if not stat:
        return "-"
    med = fmt_time_us(stat["median"], unit)
    q1, q3 = fmt_time_us(stat["q1"], unit), fmt_time_us(stat["q3"], unit)
    return f"{med} ({q1}–{q3})"


def fmt_ratio(r: Stat | None, iqr: bool = False) -> str:
    """`1.23x`, with the quartiles in brackets if `iqr`; `-` if not measured."""
    if not r or not math.isfinite(r.get("median", float("nan"))):
        return "-"
    text = f"{r['median']:.2f}x"
    if iqr:
        text += f" ({r['q1']:.2f}–{r['q3']:.2f})"
    return text


def table(
    header: list[str], rows: Iterable[list[str]], align: str | None = None
) -> list[str]:
    """A markdown table; `align` has an `l` or `r` per column (default: the first
    left, the others right)."""
    align = align or "l" + "r" * (len(header) - 1)
    seps = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(seps) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines
