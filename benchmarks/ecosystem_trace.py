"""Trace + compile time of a diffrax solve and an optimistix root find, in one process.

    python benchmarks/ecosystem_trace.py --reps 5                       # stock
    python -m autostatic.rebased diffrax,lineax,optimistix \\
        benchmarks/ecosystem_trace.py --reps 5 --expect-rebased          # rebased

Prints one JSON object: per workload, the median (and every sample) of `lower_s`
(`jax.jit(fn).lower(*args)`: tracing and lowering, where a library's modules are
built and flattened) and `compile_s` (`.compile()`, XLA's share), and their sum
`total_s`. Every rep jits a new function object, closing over a new vector field, and
clears JAX's caches first, so no trace, lowering or executable is reused (the inner
`eqx.filter_jit` of `diffeqsolve` would otherwise hit its cache on a second call). One
rep before the timed ones warms the caches that outlive `jax.clear_caches` (imports,
Equinox's per-class caches), which both processes pay alike. The reps run in a
thread of their own, so that both processes trace under the same stack
(`measure_in_new_thread`).

`rebased` says whether diffrax's classes are AutoModules here; with
`--expect-rebased` (or `--expect-stock`) a mismatch exits with status 3, so that a
rebase that did not take effect cannot pass for one that did. The section that runs
this script (`benchmarks.construction`) compares a stock and a rebased process.
Nothing from `benchmarks` is imported: the rebase must come before diffrax, lineax and
optimistix are imported, and this file must run alone.
"""

import argparse
import gc
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import optimistix

import autostatic

Workload = Callable[[], tuple[Callable[..., Any], tuple[Any, ...]]]


def diffeqsolve_workload() -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """A fresh function solving a 2-dim linear ODE on [0, 1] (Tsit5, PID
    controller, the final state saved), and its arguments."""

    def solve(y0: jax.Array, rate: jax.Array) -> Any:
        term = diffrax.ODETerm(lambda t, y, args: -args * y)
        return diffrax.diffeqsolve(
            term,
            diffrax.Tsit5(),
            t0=0.0,
            t1=1.0,
            dt0=0.1,
            y0=y0,
            args=rate,
            stepsize_controller=diffrax.PIDController(rtol=1e-5, atol=1e-5),
            saveat=diffrax.SaveAt(t1=True),
        ).ys

    return solve, (jnp.array([1.0, 2.0]), jnp.array(0.5))


def root_find_workload() -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """A fresh function finding the root of `tanh(y) - a` by Newton's method, and
    its arguments."""

    def find(y0: jax.Array, a: jax.Array) -> Any:
        return optimistix.root_find(
            lambda y, args: jnp.tanh(y) - args,
            optimistix.Newton(rtol=1e-8, atol=1e-8),
            y0,
            args=a,
        ).value

    return find, (jnp.array([0.1, 0.2]), jnp.array([0.3, -0.4]))


WORKLOADS: dict[str, Workload] = {
    "diffeqsolve": diffeqsolve_workload,
    "root_find": root_find_workload,
}


def time_once(workload: Workload) -> tuple[float, float]:
    """Seconds to lower and to compile a fresh jitted function, caches cleared
    first and the collector off while timing."""
    jax.clear_caches()
    fn, args = workload()
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        lowered = jax.jit(fn).lower(*args)
        lowered_at = time.perf_counter()
        lowered.compile()
        end = time.perf_counter()
    finally:
        gc.enable()
    return lowered_at - start, end - lowered_at


def measure(reps: int) -> dict[str, dict[str, Any]]:
    """Per workload, the median and samples of `lower_s`, `compile_s`, `total_s`;
    the workloads alternate within each rep, after one warm-up rep."""
    samples: dict[str, dict[str, list[float]]] = {
        name: {"lower_s": [], "compile_s": [], "total_s": []} for name in WORKLOADS
    }
    for rep in range(reps + 1):
        for name, workload in WORKLOADS.items():
            lower, comp = time_once(workload)
            if rep == 0:
                continue
            samples[name]["lower_s"].append(lower)
            samples[name]["compile_s"].append(comp)
            samples[name]["total_s"].append(lower + comp)
    return {
        name: {
            **{key: statistics.median(v) for key, v in by.items()},
            "samples": by,
        }
        for name, by in samples.items()
    }


def measure_in_new_thread(reps: int) -> dict[str, dict[str, Any]]:
    """`measure`, in a thread of its own: its stack starts afresh, so both processes
    trace under the same frames. The rebased one runs this file under
    `autostatic.rebased` and `runpy`, seven frames deeper, and every `eqx.error_if`
    traced checks the path of each frame on the stack (JAX's traceback filter):
    measured in the main thread, that made the root find's lowering 6% slower
    rebased, with nothing of autostatic's on the stack."""
    result: dict[str, dict[str, dict[str, Any]]] = {}
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result["workloads"] = measure(reps)
        except BaseException as err:  # re-raised in the main thread
            failure.append(err)

    thread = threading.Thread(target=run, name="ecosystem_trace")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result["workloads"]


def is_rebased() -> bool:
    """Whether the libraries' classes are AutoModules in this process."""
    return issubclass(diffrax.Tsit5, autostatic.AutoModule) and issubclass(
        optimistix.Newton, autostatic.AutoModule
    )


def main(argv: list[str] | None = None) -> int:
    """Measures every workload and prints the JSON; 3 if the rebase is not as
    expected."""
    p = argparse.ArgumentParser(prog="ecosystem_trace", description=__doc__)
    p.add_argument("--reps", type=int, default=5, help="timed reps per workload")
    expect = p.add_mutually_exclusive_group()
    expect.add_argument("--expect-rebased", action="store_true")
    expect.add_argument("--expect-stock", action="store_true")
    args = p.parse_args(argv)
    rebased = is_rebased()
    if (args.expect_rebased and not rebased) or (args.expect_stock and rebased):
        print(
            f"ecosystem_trace: diffrax.Tsit5 is {'' if rebased else 'not '}an "
            f"AutoModule subclass here, against --expect-"
            f"{'rebased' if args.expect_rebased else 'stock'}",
            file=sys.stderr,
        )
        return 3
    out = {
        "rebased": rebased,
        "is_module": isinstance(diffrax.Tsit5(), eqx.Module),
        "reps": args.reps,
        "workloads": measure_in_new_thread(args.reps),
    }
    json.dump(out, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    status = main()
    if status:  # a clean exit lets `autostatic.rebased` check the rebase after it
        sys.exit(status)
