"""What the verdict says of one operation (`Claim`) and of one model kind's dispatch
(`KindDispatch`), and the rules that sort them: an operation is faster (or slower)
only where every model's paired ratio says so, its interquartile range included."""

from typing import NamedTuple

from ..schema import Stat

SAME_WITHIN = 1.05  # a ratio within this factor of 1 counts as the same speed


class Claim(NamedTuple):
    """What the verdict says of one operation: its time ratios (medians) against
    `reference` (the fair twin unless said), one per model, with their interquartile
    ranges where measured (`spreads`: `(q1, q3)` per model), and the rest in words."""

    what: str
    ratios: list[float]
    rest: str
    reference: str = "the fair twin's time"
    spreads: list[tuple[float, float]] | None = None


SPEED_GROUPS = (
    "Faster",
    "Faster or the same",
    "The same",
    "Mixed",
    "Slower or the same",
    "Slower",
)


def group_by_speed(
    ratios: list[float], spreads: list[tuple[float, float]] | None = None
) -> str:
    """Where time ratios (below 1 is faster) put an operation, judged on every model:
    faster (slower) only if every median is, and every interquartile range lies
    below (above) 1 where it was measured."""
    faster, slower = 1 / SAME_WITHIN, SAME_WITHIN
    if max(ratios) < faster:
        if spreads and max(q3 for _, q3 in spreads) >= 1:
            return "Faster or the same"
        return "Faster"
    if min(ratios) > slower:
        if spreads and min(q1 for q1, _ in spreads) <= 1:
            return "Slower or the same"
        return "Slower"
    if max(ratios) <= slower:
        return "Faster or the same" if min(ratios) < faster else "The same"
    return "Slower or the same" if min(ratios) >= faster else "Mixed"


def format_span(values: list[float]) -> str:
    """`1.20x`, or `0.90-1.20x` from the lowest to the highest value."""
    low, high = min(values), max(values)
    return f"{low:.2f}x" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}-{high:.2f}x"


class KindDispatch(NamedTuple):
    """The verdict's line for one model kind: its `jax.jit` dispatch ratios against
    the fair twin and against `eqx.filter_jit` on the unmarked twin, one per size
    measured (`None`: not measured there), smallest first."""

    what: str
    sizes: list[str]  # as the line writes them, empty for a model of one size
    unit: str  # what the sizes count ("entries", "layers")
    fair: list[Stat | None]
    filtered: list[Stat | None]
    fair_name: str = "the fair twin"  # what `fair` is a ratio to, with any mark


def _versus(name: str, values: list[Stat | None]) -> str:
    """`vs <name> 0.90x / 1.20x (**mixed**)`: a ratio per size (`-` where not
    measured) and where they put the kind (`group_by_speed`)."""
    measured = [v for v in values if v is not None]
    if not measured:
        return f"vs {name} not measured"
    text = " / ".join("-" if v is None else f"{v['median']:.2f}x" for v in values)
    group = group_by_speed(
        [v["median"] for v in measured], [(v["q1"], v["q3"]) for v in measured]
    )
    return f"vs {name} {text} (**{group.lower()}**)"


def format_kind_dispatch(kind: KindDispatch) -> str:
    """One line: the kind, its sizes, and both ratios at each size."""
    where = f", {' / '.join(kind.sizes)} {kind.unit}" if kind.sizes else ""
    return (
        f"{kind.what}{where}: {_versus(kind.fair_name, kind.fair)}; "
        f"{_versus('eqx.filter_jit', kind.filtered)}"
    )
