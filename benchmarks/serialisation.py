"""Checkpoint throughput and peak memory: `autostatic` save/load against Equinox's.

Compares `autostatic.save` / `load` (safetensors, by key path) with
`eqx.tree_serialise_leaves` / `eqx.tree_deserialise_leaves` (positional `.npy` blobs)
on a model of float32 arrays (about 1 GB; 64 MB with `quick`), for three operations:

- `save`: a concrete model of device arrays to a file. Ours is atomic and durable (it
  fsyncs before renaming); Equinox's is neither. An extra row, `save_no_fsync`, shows
  our write path alone, so the two costs can be told apart.
- `load_host`: into numpy arrays. Ours from a `filter_eval_shape` template with
  `host=True`; Equinox cannot load a `ShapeDtypeStruct` template to the host (#861), so
  it gets a template of numpy leaves (zero-stride views, which take no memory).
- `load_device`: into `jax.Array`s from a `filter_eval_shape` template.

Each measurement runs in its own freshly spawned process, so one cannot inherit
another's memory or caches other than the OS page cache (the file was just written, so
loads read from memory, as a warm restart does). Peak memory is the process's peak
resident set during the repeats minus its resident set after building the model or
template: read from `/proc/self/status` (VmHWM, reset through `/proc/self/clear_refs`)
where Linux allows it, else `resource.getrusage(...).ru_maxrss` before and after.
Throughput is the model size over the median time of the repeats. Ratios are
ours / Equinox from the same run: above 1 is faster (`*_speed`) or hungrier
(`*_peak_rss`).

Run `python -m benchmarks.serialisation [--quick]`.
"""

import argparse
import concurrent.futures
import gc
import json
import multiprocessing
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

IMPLS = ("autostatic", "eqx")
OPS = ("save", "load_host", "load_device")


def _sizes(quick: bool) -> tuple[int, int]:
    """(number of arrays, side of each square float32 array)."""
    return (16, 1024) if quick else (16, 4096)  # 16 x 4 MB or 16 x 64 MB


# --------------------------------------------------------------------------- child side


def _models():
    # Imported in the children only: the parent process stays free of JAX.
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import numpy as np

    import autostatic as asx

    class AutoNet(asx.AutoModule):
        weights: list
        name: str

        def __init__(self, weights: list):
            self.weights = weights
            self.name = "net"

    class EqxNet(eqx.Module):
        weights: list
        name: str = eqx.field(static=True)

        __init__ = AutoNet.__init__

    def build(impl: str, count: int, side: int, abstract: bool) -> Any:
        cls = AutoNet if impl == "autostatic" else EqxNet
        if abstract:  # nothing is allocated
            return eqx.filter_eval_shape(
                lambda: cls([jnp.zeros((side, side), "float32") for _ in range(count)])
            )

        # device_put of a fresh numpy array aliases it on CPU, so building leaves no
        # temporary behind to inflate the baseline.
        return cls(
            [jax.device_put(np.full((side, side), i, np.float32)) for i in range(count)]
        )

    return build


def _rss_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets the peak resident set (VmHWM) to the current one
    except OSError:
        return False
    return _rss_kb("VmHWM") is not None


def _maxrss_kb() -> int:
    usage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return usage // 1024 if sys.platform == "darwin" else usage  # bytes on macOS


def _measure(
    impl: str, op: str, path: str, count: int, side: int, repeats: int
) -> dict:
    """One (impl, op) cell, in a fresh process: seconds per repeat and peak memory."""
    import equinox as eqx
    import jax
    import numpy as np

    from autostatic import load, save

    build = _models()
    if op.startswith("save"):
        subject = build(impl, count, side, abstract=False)
    else:
        subject = build(impl, count, side, abstract=True)
        if impl == "eqx" and op == "load_host":
            subject = jax.tree.map(
                lambda s: np.broadcast_to(np.zeros((), s.dtype), s.shape), subject
            )
    if op == "save_no_fsync":
        os.fsync = lambda fd: None  # this process only

    def once() -> None:
        if op.startswith("save"):
            if impl == "autostatic":
                save(path, subject)
            else:
                eqx.tree_serialise_leaves(path, subject)
            return
        if impl == "autostatic":
            out = load(path, subject, host=op == "load_host")
        else:
            out = eqx.tree_deserialise_leaves(path, subject)
        jax.block_until_ready(out)

    gc.collect()
    precise = _reset_peak()
    baseline = _rss_kb("VmRSS") if precise else _maxrss_kb()
    times = []
    for i in range(repeats):
        if op.startswith("save") and i and os.path.exists(path):
            os.remove(path)  # every repeat writes a fresh file
        start = time.perf_counter()
        once()
        times.append(time.perf_counter() - start)
        gc.collect()
    peak = (_rss_kb("VmHWM") if precise else _maxrss_kb()) or 0
    return {
        "seconds": times,
        "peak_rss_mb": max(peak - (baseline or 0), 0) / 1024,
        "peak_method": "VmHWM" if precise else "ru_maxrss",
    }


# -------------------------------------------------------------------------- parent side


def _in_child(*args: Any) -> dict:
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        return pool.submit(_measure, *args).result()


def _ratio(a: float, b: float, floor: float = 0.0) -> float | None:
    # Below `floor` (MB of peak memory), a ratio of noise-sized numbers means nothing.
    if b <= floor:
        return None
    return a / b


def _table(size_mb: float, rows: list[dict], ratios: dict) -> str:
    lines = [
        f"Model: {size_mb:.0f} MB of float32 arrays.",
        "",
        "| impl | op | MB/s | peak RSS MB |",
        "|---|---|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['impl']} | {row['op']} | {row['mb_per_s']:.0f} | "
            f"{row['peak_rss_mb']:.1f} |"
        )
    lines += ["", "| ratio (autostatic / eqx) | value |", "|---|---:|"]
    for name, value in ratios.items():
        lines.append(f"| {name} | {'n/a' if value is None else f'{value:.2f}'} |")
    lines += [
        "",
        "Ours fsyncs on save (atomic, durable); save_no_fsync is our write path alone. "
        "Peak RSS ratios are n/a where Equinox's peak is under 1 MB.",
    ]
    return "\n".join(lines)


def run(quick: bool) -> dict:
    """Measures every (impl, op) cell; returns rows, ratios and a markdown table."""
    count, side = _sizes(quick)
    size_mb = count * side * side * 4 / 2**20
    repeats = 3
    folder = tempfile.mkdtemp(prefix="autostatic-bench-")
    paths = {
        "autostatic": os.path.join(folder, "model.safetensors"),
        "eqx": os.path.join(folder, "model.eqx"),
    }
    rows = []
    try:
        # The save cells leave their last file behind for the load cells.
        cells = [(impl, op) for op in OPS for impl in IMPLS]
        cells.insert(2, ("autostatic", "save_no_fsync"))
        for impl, op in cells:
            path = paths[impl]
            if op == "save_no_fsync":
                path = os.path.join(folder, "scratch.safetensors")
            result = _in_child(impl, op, path, count, side, repeats)
            rows.append(
                {
                    "impl": impl,
                    "op": op,
                    "mb_per_s": size_mb / statistics.median(result["seconds"]),
                    "peak_rss_mb": result["peak_rss_mb"],
                    "seconds": result["seconds"],
                    "peak_method": result["peak_method"],
                }
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    cell = {(r["impl"], r["op"]): r for r in rows}
    ratios: dict[str, float | None] = {}
    for op in OPS:
        ours, theirs = cell[("autostatic", op)], cell[("eqx", op)]
        ratios[f"{op}_speed"] = _ratio(ours["mb_per_s"], theirs["mb_per_s"])
        ratios[f"{op}_peak_rss"] = _ratio(
            ours["peak_rss_mb"], theirs["peak_rss_mb"], floor=1.0
        )
    ratios["save_no_fsync_speed"] = _ratio(
        cell[("autostatic", "save_no_fsync")]["mb_per_s"],
        cell[("eqx", "save")]["mb_per_s"],
    )
    return {
        "size_mb": size_mb,
        "quick": quick,
        "repeats": repeats,
        "rows": rows,
        "ratios": ratios,
        "table": _table(size_mb, rows, ratios),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="64 MB instead of 1 GB")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    # Through the package, so the children import this module by its real name.
    from benchmarks import serialisation

    result = serialisation.run(quick=args.quick)
    print(json.dumps(result, indent=1) if args.json else result["table"])
    print(f"\n({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
