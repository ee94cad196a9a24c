"""Progress lines on stderr: the time since the run started, step k of n, and an
estimate of the time left."""

import sys
import time


class Progress:
    """Progress lines on stderr, each with the time since the run started."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def log(self, msg: str) -> None:
        print(f"[{self.elapsed():6.1f} s] {msg}", file=sys.stderr, flush=True)


def step_kind(label: str) -> str:
    """The kind of a step, for the ETA: its label up to the first `:` or ` (`."""
    return label.split(":")[0].split(" (")[0].strip()


def eta_text(
    done: list[tuple[str, float]], remaining: list[tuple[str, float | None]]
) -> str:
    """`, ETA ~40 s`: the steps still to run (this one included, each a `(kind, budget)`
    pair), each estimated by the mean time of the steps of its kind run so far, else by
    its timing budget where it has one (a lower bound: compiling comes on top) or the
    mean of every step so far, whichever is larger. Empty before the first step has
    finished (nothing to estimate from)."""
    if not done or not remaining:
        return ""
    overall = sum(s for _, s in done) / len(done)
    by_kind: dict[str, list[float]] = {}
    for kind, seconds in done:
        by_kind.setdefault(kind, []).append(seconds)
    left = sum(
        sum(by_kind[k]) / len(by_kind[k]) if k in by_kind else max(overall, b or 0.0)
        for k, b in remaining
    )
    if left >= 90:
        return f", ETA ~{left / 60:.0f} min"
    return f", ETA ~{max(1.0, left):.0f} s"
