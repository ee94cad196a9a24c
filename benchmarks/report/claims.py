"""What the verdict says of one operation (`Claim`), and the rules that sort it: an
operation is faster (or slower) only where every model's paired ratio says so, its
interquartile range included."""

from typing import NamedTuple

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
