"""Checkpoint speed and peak memory: `autostatic` save/load against Equinox's and against
a floor of raw numpy file I/O, in interleaved rounds with paired ratios.

The model is 16 float32 arrays (16 x 64 MB = 1 GB; 16 x 4 MB = 64 MB with `quick`), as
device arrays (saves) or as a `filter_eval_shape` template (loads). Twelve cells:

| op | cell | what is timed |
|---|---|---|
| save | `autostatic` | `autostatic.save(path, model)`: temporary file, fsync, rename, fsync of the folder (durable, the default) |
| save | `autostatic durable=False` | the same without either fsync (still atomic) |
| save | `eqx` | `eqx.tree_serialise_leaves(path, model)`: `.npy` blobs, no fsync, no rename |
| save | `numpy + fsync` | floor, durable: `open(path, "wb")`, `np.asarray(leaf).tofile(f)` per array, `f.flush()`, `os.fsync` |
| save | `numpy + writeback + fsync` | the same, each array's disk write started as soon as it is written (`sync_file_range`, as our durable save does per 8 MiB) |
| save | `numpy` | floor: the same without the fsync |
| load_host | `autostatic` | `autostatic.load(path, template, host=True)` |
| load_host | `eqx` | `eqx.tree_deserialise_leaves(path, like)`, `like` of numpy leaves (zero-stride views, no memory): Equinox cannot load a `ShapeDtypeStruct` template to the host |
| load_host | `numpy` | floor: `open(path, "rb", buffering=0)`, then per array `np.empty(shape, dtype)` and `f.readinto(array)`; shapes known, no header |
| load_device | `autostatic` | `autostatic.load(path, template)` |
| load_device | `eqx` | `eqx.tree_deserialise_leaves(path, template)` |
| load_device | `numpy` | floor: the host floor, then `jax.device_put` of each array |

The floor writes and reads the same bytes as one raw file with no header, no names and
no checks: what ten lines of numpy do. It is not a hardware limit; where we beat it, the
table says why.

Method, like the rest of the benchmarks: every round runs every cell once, in a freshly
shuffled order, and ratios are paired per round (ours / reference in the same round,
then the median and interquartile range over rounds), so the drift of a shared, noisy
machine cancels. Every measurement runs in its own fresh process, forked from a server
that has imported numpy, JAX, Equinox and autostatic but started nothing
(`serialisation_cells`; a new interpreter per measurement where there is no `os.fork`): it inherits no memory, no
allocator state and no JAX state from another measurement. In that process the code
path is first warmed up on a tiny model of the same structure (a separate file), then
the model is built and the operation timed once: warm code, cold memory, as when a
program loads or saves its first checkpoint. Each save writes a file that did not exist
and deletes it afterwards, untimed, so no cell leaves dirty pages for the disk to write
during the next one, and every timed call starts after an `os.sync()`, with the disk
idle. Loads read files written (and fsynced) once before the rounds, so
they come from the page cache, as a checkpoint written or read recently does.

Peak memory is the process's peak resident set during the timed call minus its resident
set just before it: `/proc/self/status` (VmHWM, reset through `/proc/self/clear_refs`)
where Linux allows it, else `resource.getrusage(...).ru_maxrss` before and after; the
median over rounds is reported.

Run `python -m benchmarks.serialisation [--quick]`.
"""

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time

from .schema import Checkpoint, CheckpointRatios, judge, MeasuredTarget, Ratio, Stat
from .serialisation_cells import (
    AUTO,
    AUTO_FAST,
    CELLS,
    EQX,
    FLOOR,
    FLOOR_STREAM,
    FLOOR_SYNC,
    LOAD_DEVICE,
    LOAD_HOST,
    SAVE,
    Zygote,
)
from .timing import summary

# Each cell's references for its paired speed ratios: (Equinox's cell, the floor's
# cell), None where the cell is that reference. Durable saves are compared with the
# floor that fsyncs, the others with the one that does not.
REFERENCES: dict[tuple[str, str], tuple[str | None, str | None]] = {
    (SAVE, AUTO): (EQX, FLOOR_SYNC),
    (SAVE, AUTO_FAST): (EQX, FLOOR),
    (SAVE, EQX): (None, FLOOR),
    (SAVE, FLOOR_SYNC): (EQX, None),
    (SAVE, FLOOR_STREAM): (EQX, None),
    (SAVE, FLOOR): (EQX, None),
    **{(op, AUTO): (EQX, FLOOR) for op in (LOAD_HOST, LOAD_DEVICE)},
    **{(op, EQX): (None, FLOOR) for op in (LOAD_HOST, LOAD_DEVICE)},
    **{(op, FLOOR): (EQX, None) for op in (LOAD_HOST, LOAD_DEVICE)},
}
# The stated targets, on ours / Equinox's speed (paired median): (name, cell, minimum).
# They are measured here and judged by the report, like every other target.
TARGETS = (
    ("load to device", (LOAD_DEVICE, AUTO), 1.0),
    ("load to host", (LOAD_HOST, AUTO), 1.0),
    ("save, durable (atomic + fsync)", (SAVE, AUTO), 0.8),
)


def model_size(quick: bool) -> tuple[int, int]:
    """(number of arrays, side of each square float32 array)."""
    return (16, 1024) if quick else (16, 4096)  # 16 x 4 MB or 16 x 64 MB


ROUNDS = 9  # in both sizes


def cell_key(cell: tuple[str, str]) -> str:
    """A cell's key in the results: `"<op>/<implementation>"`."""
    return f"{cell[0]}/{cell[1]}"


def _format_ratio(r: Ratio | None) -> str:
    """A paired ratio with its quartiles, `-` if not measured."""
    if not r or not r.get("n"):
        return "-"
    return f"{r['median']:.2f}x ({r['q1']:.2f}–{r['q3']:.2f})"


def _pair_speeds(
    samples: dict[tuple[str, str], list[float]],
) -> dict[str, dict[str, Ratio]]:
    """Per cell, its speed / each reference's in the same round (the reference's
    seconds / the cell's): median and quartiles over rounds."""
    out: dict[str, dict[str, Ratio]] = {}
    for cell, refs in REFERENCES.items():
        ratios = {}
        for label, ref in zip(("vs eqx", "vs numpy floor"), refs):
            if ref is not None:
                pairs = zip(samples[cell], samples[(cell[0], ref)])
                ratios[label] = summary(theirs / mine for mine, theirs in pairs)
        out[cell_key(cell)] = ratios
    return out


CPU_ALIASING_NOTE = (
    "on the CPU backend, `jax.device_put` of a 64-byte-aligned numpy buffer aliases it "
    "instead of copying; ours loads into aligned buffers, the numpy floor's and "
    "Equinox's arrays are not aligned, so part of this lead is the CPU's and will not "
    "carry to a GPU, where every load copies to the device"
)


def _is_cpu() -> bool:
    """Whether the measuring processes run JAX on the CPU backend (beside a TPU too)."""
    from .processes import child_platform

    return child_platform() == "cpu"


def _speed_vs_eqx(paired: dict[str, dict[str, Ratio]], cell: tuple[str, str]) -> float:
    """A cell's speed over Equinox's, paired median."""
    return paired[cell_key(cell)]["vs eqx"]["median"]


def _explain_save(
    paired: dict[str, dict[str, Ratio]], value: float | None, minimum: float
) -> str:
    """Why the durable save may miss its target: what the floors reach."""
    floor = _speed_vs_eqx(paired, (SAVE, FLOOR_SYNC))
    stream = _speed_vs_eqx(paired, (SAVE, FLOOR_STREAM))
    fast = _speed_vs_eqx(paired, (SAVE, AUTO_FAST))
    return (
        "ours renames atomically and fsyncs the file and its folder; Equinox's "
        "save does neither. The same bytes through numpy + fsync reach "
        f"{floor:.2f}x Equinox's speed, and {stream:.2f}x with each array's "
        "disk write started as soon as it is written, as ours does"
        + (
            ": no durable save measured here reaches the target"
            if max(stream, floor, value or 0.0) < minimum
            else ""
        )
        + f"; save(..., durable=False) reaches {fast:.2f}x"
    )


def _explain_target(
    paired: dict[str, dict[str, Ratio]],
    cell: tuple[str, str],
    value: float | None,
    minimum: float,
) -> str:
    """What a reader needs beside a checkpoint target's value."""
    if cell == (SAVE, AUTO):
        return _explain_save(paired, value, minimum)
    if cell == (LOAD_DEVICE, AUTO) and _is_cpu():
        return CPU_ALIASING_NOTE
    if value is not None and value < minimum:
        eqx_vs_floor = paired[cell_key((cell[0], EQX))]["vs numpy floor"]["median"]
        ours_vs_floor = paired[cell_key(cell)]["vs numpy floor"]["median"]
        return (
            f"ours {ours_vs_floor:.2f}x and Equinox {eqx_vs_floor:.2f}x the numpy "
            "floor's speed"
        )
    return ""


def measure_targets(
    paired: dict[str, dict[str, Ratio]], speeds: dict[str, Stat]
) -> list[MeasuredTarget]:
    """The stated targets with their measured values: ours / Equinox's speed (paired
    median) against a minimum. Judging them is the report's (`report.targets`)."""
    targets: list[MeasuredTarget] = []
    for name, cell, minimum in TARGETS:
        eqx_cell, floor_cell = REFERENCES[cell]
        r = paired[cell_key(cell)]["vs eqx"]
        value = r["median"] if r.get("n") else None
        mb_s = {
            label: speeds[cell_key((cell[0], str(c)))]["median"]
            for label, c in (
                ("autostatic", cell[1]),
                ("eqx", eqx_cell),
                ("numpy", floor_cell),
            )
        }
        detail = (
            f"{_format_ratio(r)}; autostatic {mb_s['autostatic']:.0f} MB/s, eqx "
            f"{mb_s['eqx']:.0f} MB/s, numpy floor{' + fsync' if floor_cell == FLOOR_SYNC else ''} "
            f"{mb_s['numpy']:.0f} MB/s"
        )
        targets.append(
            {
                "target": f"checkpoint {name} >= {minimum:.1f}x Equinox's speed",
                "value": value,
                "op": ">=",
                "threshold": minimum,
                "detail": detail,
                "note": _explain_target(paired, cell, value, minimum),
            }
        )
    return targets


def _format_value(t: MeasuredTarget) -> str:
    """A target's value in the table, with its status in lower case."""
    if t["value"] is None:
        return "n/a"
    return f"{t['value']:.2f}x {judge(t['value'], t['op'], t['threshold']).lower()}"


TABLE_NOTE = (
    "`autostatic`: `save(path, model)` (temporary file, fsync, rename, fsync of the "
    "folder) and `load(path, template, host=...)`; `durable=False`: no fsync. `eqx`: "
    "`eqx.tree_serialise_leaves` (no fsync) and `eqx.tree_deserialise_leaves`. The "
    "numpy floor is the same bytes as one raw file: save "
    "`np.asarray(leaf).tofile(f)` per array (+ `f.flush()` and `os.fsync`: "
    "`numpy + fsync`; with each array's disk write started by `sync_file_range` "
    "as soon as it is written: `numpy + writeback + fsync`); load "
    "`np.empty(shape, dtype)` and `f.readinto(array)` per "
    "array from an unbuffered file (+ `jax.device_put` of each for load_device). "
    "Durable saves are compared with the floor that fsyncs, the others with the "
    "one that does not."
)


def format_table(
    size_mb: float,
    count: int,
    rounds: int,
    speeds: dict[str, Stat],
    peaks: dict[str, float],
    paired: dict[str, dict[str, Ratio]],
    targets: list[MeasuredTarget],
) -> str:
    """The markdown the report shows: every cell, then every target."""
    lines = [
        f"Model: {size_mb:.0f} MB of float32 arrays ({count} x {size_mb / count:.0f} "
        f"MB); {rounds} rounds, every cell once per round in a shuffled order, each "
        "measurement in a fresh process (warm code, cold memory); loads from the page "
        "cache. Ratios are speeds paired per round: median (IQR), > 1 = faster.",
        "",
        "| op | implementation | MB/s, median (IQR) | peak RSS MB | vs eqx | vs numpy "
        "floor |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for cell in CELLS:
        s, r = speeds[cell_key(cell)], paired[cell_key(cell)]
        lines.append(
            f"| {cell[0]} | {cell[1]} | {s['median']:.0f} ({s['q1']:.0f}–{s['q3']:.0f})"
            f" | {peaks[cell_key(cell)]:.1f} | {_format_ratio(r.get('vs eqx'))} | "
            f"{_format_ratio(r.get('vs numpy floor'))} |"
        )
    lines += ["", TABLE_NOTE, "", "| target | value | detail |", "|---|---:|---|"]
    for t in targets:
        note = f" ({t['note']})" if t["note"] else ""
        lines.append(f"| {t['target']} | {_format_value(t)} | {t['detail']}{note} |")
    return "\n".join(lines)


def _measure_rounds(
    count: int, side: int, rounds: int
) -> tuple[
    dict[tuple[str, str], list[float]], dict[tuple[str, str], list[float]], set[str]
]:
    """Seconds and peak memory of every cell over `rounds` shuffled rounds, each
    measurement in a fresh process; and how the peaks were read."""
    folder = tempfile.mkdtemp(prefix="autostatic-bench-")
    zygote = Zygote()
    samples: dict[tuple[str, str], list[float]] = {cell: [] for cell in CELLS}
    peak_samples: dict[tuple[str, str], list[float]] = {cell: [] for cell in CELLS}
    methods = set()
    try:
        zygote.call("_prepare", folder, count, side)
        rng = random.Random(0)
        order = list(CELLS)
        for _ in range(rounds):
            rng.shuffle(order)
            for op, impl in order:
                result = zygote.call("_measure", op, impl, folder, count, side)
                samples[(op, impl)].append(result["seconds"])
                peak_samples[(op, impl)].append(result["peak_rss_mb"])
                methods.add(result["peak_method"])
    finally:
        zygote.close()
        shutil.rmtree(folder, ignore_errors=True)
    return samples, peak_samples, methods


def _compare_with_eqx(
    paired: dict[str, dict[str, Ratio]], peaks: dict[str, float]
) -> CheckpointRatios:
    """Ours / Equinox's speed (paired medians) and peak memory."""

    def peak_ratio(cell: tuple[str, str]) -> float | None:
        theirs = peaks[cell_key((cell[0], EQX))]
        # Below 1 MB, a ratio of noise-sized numbers means nothing.
        return peaks[cell_key(cell)] / theirs if theirs > 1.0 else None

    return {
        "save_speed": _speed_vs_eqx(paired, (SAVE, AUTO)),
        "save_not_durable_speed": _speed_vs_eqx(paired, (SAVE, AUTO_FAST)),
        "load_host_speed": _speed_vs_eqx(paired, (LOAD_HOST, AUTO)),
        "load_device_speed": _speed_vs_eqx(paired, (LOAD_DEVICE, AUTO)),
        "save_peak_rss": peak_ratio((SAVE, AUTO)),
        "load_host_peak_rss": peak_ratio((LOAD_HOST, AUTO)),
        "load_device_peak_rss": peak_ratio((LOAD_DEVICE, AUTO)),
    }


def run(quick: bool) -> Checkpoint:
    """Measures every cell in interleaved rounds; returns per-cell speeds, peaks and
    paired ratios, `ratios` (ours / Equinox's), the `targets` with their measured
    values and a markdown `table`."""
    count, side = model_size(quick)
    size_mb = count * side * side * 4 / 2**20
    samples, peak_samples, methods = _measure_rounds(count, side, ROUNDS)
    speeds = {cell_key(c): summary(size_mb / t for t in samples[c]) for c in CELLS}
    peaks = {cell_key(c): statistics.median(peak_samples[c]) for c in CELLS}
    paired = _pair_speeds(samples)
    targets = measure_targets(paired, speeds)
    return {
        "size_mb": size_mb,
        "quick": quick,
        "rounds": ROUNDS,
        "seconds": {cell_key(c): samples[c] for c in CELLS},
        "mb_per_s": speeds,
        "peak_rss_mb": peaks,
        "peak_method": sorted(methods),
        "paired": paired,
        "ratios": _compare_with_eqx(paired, peaks),
        "targets": targets,
        "table": format_table(size_mb, count, ROUNDS, speeds, peaks, paired, targets),
    }


def main(argv: list[str] | None = None) -> int:
    """`python -m benchmarks.serialisation [--quick] [--json]`: prints the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="64 MB instead of 1 GB")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    result = run(quick=args.quick)
    print(json.dumps(result, indent=1) if args.json else result["table"])
    print(f"\n({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
