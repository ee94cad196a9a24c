"""The interleaved timing harness and its statistics.

Method (that of the independent anchor harness, except that the collector stays on
unless `--gc-off`, where the numbers are comparable with it):

- every cell (one operation of one implementation) is timed in timeit-style batches: a
  tight `for _ in itertools.repeat(None, n)` loop whose length `n` is calibrated so one
  batch takes about `batch_s`; the sample is the batch's mean time per operation;
- the garbage collector is on while timing, as users run: the young-generation
  collections that a cell's own allocations trigger are part of what a user pays, and
  are charged to that cell; `--gc-off` (`collector_off`) turns it off while timing, for
  figures beside these where the collector's share explains something;
- the heap that exists before timing starts is frozen (`gc.freeze`) and a collection
  runs between rounds, which users do not do: a full collection of a process holding
  jax, equinox and every model takes ~0.1 s, and one landing in a single batch would
  be noise, not a cost of the code timed; frozen, a collection only scans the objects
  made since;
- every round runs all cells once, in a freshly shuffled order, so slow drifts of a
  shared, noisy machine (other jobs, CPU frequency) hit every cell alike;
- ratios are paired per round (cell / reference in the same round, then the median),
  so drift cancels instead of adding to the spread;
- results are medians with the interquartile range, never means.
"""

import gc
import itertools
import random
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import Any, TypeVar

from .schema import describe_error, Ratio, Stat

Samples = dict[str, list[float]]


_frozen_depth = 0
_gc_off = False  # `--gc-off`: the collector is off while timing


@contextmanager
def collector_off(off: bool) -> Iterator[None]:
    """Within: timed code runs with the collector off if `off` (`--gc-off`), else on
    (the default, as users run)."""
    global _gc_off
    was, _gc_off = _gc_off, off
    try:
        yield
    finally:
        _gc_off = was


@contextmanager
def timing_collector() -> Iterator[None]:
    """The collector as timed code runs (`collector_off`); as it was on exit."""
    was_enabled = gc.isenabled()
    if _gc_off:
        gc.disable()
    else:
        gc.enable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
        else:
            gc.disable()


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Collects once, then hides every existing object from the collector until exit.

    Re-entrant: an inner use freezes the objects made since, and only the outermost
    exit unfreezes.
    """
    global _frozen_depth
    gc.collect()
    gc.freeze()
    _frozen_depth += 1
    try:
        yield
    finally:
        _frozen_depth -= 1
        if _frozen_depth == 0:
            gc.unfreeze()


K = TypeVar("K")


def drop_failing(cells: MutableMapping[K, Callable[[], Any]]) -> dict[K, str]:
    """Calls every cell once; removes those that raise and returns why they failed
    (`describe_error`)."""
    fails: dict[K, str] = {}
    for key, fn in list(cells.items()):
        try:
            fn()
        except Exception as err:
            fails[key] = describe_error(err)
            del cells[key]
    return fails


def timed_batch(fn: Callable[[], Any], n: int) -> float:
    """Mean seconds per call over `n` back-to-back calls."""
    loop = itertools.repeat(None, n)
    clock = time.perf_counter
    start = clock()
    for _ in loop:
        fn()
    return (clock() - start) / n


def calibrate(fn: Callable[[], Any], batch_s: float, max_loops: int = 100_000) -> int:
    """The number of calls that makes one batch last about `batch_s`."""
    fn()  # warm up (first-call caches, lazy attributes)
    n = 1
    while True:
        per_call = timed_batch(fn, n)
        if per_call * n >= batch_s / 4 or n >= max_loops:
            break
        n = min(max_loops, n * 10)
    return max(1, min(max_loops, round(batch_s / max(per_call, 1e-9))))


def run_interleaved(
    cells: Mapping[str, Callable[[], Any]],
    rounds: int,
    batch_s: float = 2e-3,
    *,
    loops: Mapping[str, int] | None = None,
    seed: int = 0,
    min_rounds: int = 5,
    max_seconds: float | None = None,
) -> Samples:
    """Times every cell once per round, in a reshuffled order every round.

    `loops` fixes the batch length of some cells (1 for cells that already are a whole
    loop, such as K training steps); the others are calibrated. After `min_rounds`,
    stops early once `max_seconds` have passed (a wall-time budget for quick runs).
    Returns per-cell lists of per-call seconds, one value per round.
    """
    loops = dict(loops or {})
    for key, fn in cells.items():
        if key not in loops:
            loops[key] = calibrate(fn, batch_s)
        else:
            fn()  # warm up
    rng = random.Random(seed)
    order = list(cells)
    samples: Samples = {key: [] for key in cells}
    with frozen_heap():
        start = time.perf_counter()
        for r in range(rounds):
            gc.collect()  # only objects made since the heap was frozen: cheap
            rng.shuffle(order)
            with timing_collector():
                for key in order:
                    samples[key].append(timed_batch(cells[key], loops[key]))
            elapsed = time.perf_counter() - start
            if (
                max_seconds is not None
                and r + 1 >= min_rounds
                and elapsed > max_seconds
            ):
                break
    return samples


def summary(values: Iterable[float]) -> Stat:
    """Median and quartiles (inclusive method; a single value is its own IQR)."""
    data = sorted(values)
    if not data:
        return {"median": float("nan"), "q1": float("nan"), "q3": float("nan"), "n": 0}
    if len(data) == 1:
        q1 = q3 = data[0]
    else:
        q1, _, q3 = statistics.quantiles(data, n=4, method="inclusive")
    return {"median": statistics.median(data), "q1": q1, "q3": q3, "n": len(data)}


def scaled_summary(values: Iterable[float], factor: float) -> Stat:
    """`summary` with the median and quartiles multiplied by `factor` (seconds to
    µs or ms), the count unchanged."""
    s = summary(values)
    return {
        "median": s["median"] * factor,
        "q1": s["q1"] * factor,
        "q3": s["q3"] * factor,
        "n": s["n"],
    }


def paired_ratio(values: list[float], reference: list[float]) -> Ratio:
    """Median (IQR) of the per-round ratios `values[r] / reference[r]`."""
    ratios = [v / ref for v, ref in zip(values, reference) if ref > 0]
    return summary(ratios)


def timed_once(fn: Callable[[], Any]) -> float:
    """Seconds for one call, the collector as `timing_collector` sets it (used for
    first-call timings)."""
    gc.collect()
    with timing_collector():
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start


def busy_wait(seconds: float) -> None:
    """Host-side Python work that holds the interpreter (not a sleep)."""
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1
