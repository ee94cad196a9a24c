"""The construction section of the report: building, tracing, and trace + compile of
the libraries rebased; its tables and its targets."""

from ..schema import (
    Construction,
    ConstructionBuilds,
    EcosystemTrace,
    Failed,
    Spread,
    Stat,
    Target,
    TraceTimes,
)
from .format import fmt_ratio, fmt_stat_us, table
from .targets import if_measured, INFO_ONLY, judged_target, median_of

# --------------------------------------------------------------------------------------
# Tables.
# --------------------------------------------------------------------------------------


def _stat_cell(stat: Stat | Failed | None, unit: str = "µs") -> str:
    """µs (or ms) with the quartiles, `fails: ...` or `-`."""
    if not stat:
        return "-"
    if "fails" in stat:
        return f"fails: {stat['fails'][:100]}"
    if unit == "ms":
        return f"{stat['median']:.1f} ({stat['q1']:.1f}–{stat['q3']:.1f})"
    return fmt_stat_us(stat)


def _builds_table(builds: ConstructionBuilds) -> list[str]:
    """Every build cell's µs and its paired ratios."""
    rows = []
    for op, label in builds["ops"].items():
        ratios = builds["ratios"].get(op, {})
        for i, (impl, stat) in enumerate(builds["ops_us"].get(op, {}).items()):
            mine = "; ".join(
                f"vs {key.split(' / ')[1]} {fmt_ratio(r, iqr=True)}"
                for key, r in ratios.items()
                if key.split(" / ")[0] == impl
            )
            rows.append(
                [label if i == 0 else "", f"`{impl}`", _stat_cell(stat), mine or "-"]
            )
    lines = [
        f"Building, median µs (IQR), {builds['rounds']} rounds, every cell "
        "interleaved; ratios paired per round (< 1 = faster):",
        "",
    ]
    lines += table(["op", "impl", "µs (IQR)", "ratios (IQR)"], rows, "llrl")
    lines += [""] + [f"* `{k}`: {v}" for k, v in builds["impls"].items()]
    return lines + [f"* {builds['note']}.", ""]


def _trace_table(trace: TraceTimes) -> list[str]:
    """Trace ms per function and variant, autostatic's paired ratio."""
    rows = []
    for fn, label in trace["fns"].items():
        for i, (variant, stat) in enumerate(trace["ms"].get(fn, {}).items()):
            ratio = (
                trace["ratios"].get(fn) if variant.startswith("autostatic") else None
            )
            rows.append(
                [
                    label if i == 0 else "",
                    f"`{variant}`",
                    _stat_cell(stat, "ms"),
                    fmt_ratio(ratio, iqr=True) if ratio else "",
                ]
            )
    lines = [
        f"Trace time of the {trace['blocks']}-block eqx.nn transformer, median ms "
        f"(IQR) over {trace['reps']} reps:",
        "",
    ]
    lines += table(
        ["function", "variant", "ms (IQR)", "vs the fair twin, partitioned"],
        rows,
        "llrr",
    )
    return lines + ["", f"* {trace['note']}.", ""]


def _ecosystem_table(eco: EcosystemTrace) -> list[str]:
    """Trace + compile per workload, stock vs rebased processes."""

    def span(s: Spread, fmt: str, unit: str = "") -> str:
        return f"{s['median']:{fmt}}{unit} ({s['min']:{fmt}}–{s['max']:{fmt}})"

    rows = [
        [
            f"`{w}`",
            span(res["stock_ms"], ".0f"),
            span(res["rebased_ms"], ".0f"),
            span(res["ratio"], ".2f", "x"),
            f"{res['lower_ratio']['median']:.2f}x",
            f"{res['compile_ratio']['median']:.2f}x",
        ]
        for w, res in eco["workloads"].items()
    ]
    n = eco["processes_per_side"]
    lines = [
        f"Trace + compile with diffrax, lineax and optimistix stock and rebased onto "
        f"AutoModule, {n} process(es) each, {eco['reps']} compiles per process, ms "
        "(median, min–max over processes):",
        "",
    ]
    lines += table(
        [
            "workload",
            "stock ms",
            "rebased ms",
            "rebased / stock (per pair)",
            "lowering",
            "compiling",
        ],
        rows,
    )
    return lines + [
        "",
        f"* {eco['note']}; the processes ran on the "
        f"{eco.get('platform', 'same')} backend.",
        f"* rebased with `{eco['command']}`; rebase checked: "
        f"{'yes' if eco['rebase_checked'] else 'NO'} ({eco['rebase_summary']}).",
        "",
    ]


def construction_section(cons: Construction) -> list[str]:
    """Building, tracing, and trace + compile of the libraries rebased: each part
    that ran."""
    lines = [
        "### Construction: building, tracing and compiling, AutoModule vs eqx.Module",
        "",
        "The build targets around made layers (<= 1.25x the fair twin) are read from "
        "the real models' `build` row.",
        "",
    ]
    if "builds" in cons:
        lines += _builds_table(cons["builds"])
    if "trace" in cons:
        lines += _trace_table(cons["trace"])
    if "ecosystem" in cons:
        lines += _ecosystem_table(cons["ecosystem"])
    return lines


# --------------------------------------------------------------------------------------
# Targets.
# --------------------------------------------------------------------------------------

# The sizes the construction targets are stated for (a smoke run measures less).
CONSTRUCTION_ARRAYS = 20_000
CONSTRUCTION_BLOCKS = 12
# (op, ratio "<impl> / <reference>", threshold, information only, name). The (info)
# rows: eqx.Module of the same fields against the same floor, beside ours.
BUILD_TARGETS: tuple[tuple[str, str, float, bool, str], ...] = (
    (
        "wrap_layers",
        "autostatic / tree_leaves",
        2.0,
        False,
        "AutoModule wrapping 256 made Linear(8, 8) in a list field",
    ),
    (
        "wrap_layers",
        "eqx-filter / tree_leaves",
        2.0,
        True,
        "(info) eqx.Module wrapping 256 made Linear(8, 8) in a list field",
    ),
    (
        "wrap_arrays",
        "autostatic / tree_leaves",
        2.0,
        False,
        f"AutoModule holding {CONSTRUCTION_ARRAYS} scalar arrays, built",
    ),
    (
        "wrap_arrays",
        "eqx-filter / tree_leaves",
        2.0,
        True,
        f"(info) eqx.Module holding {CONSTRUCTION_ARRAYS} scalar arrays, built",
    ),
    (
        "build_init",
        "autostatic / eqx-static",
        1.05,
        False,
        f"build with layer init ({CONSTRUCTION_BLOCKS}-block transformer)",
    ),
)
TRACE_TARGETS: tuple[tuple[str, str], ...] = (
    ("forward", "trace time, transformer forward"),
    ("train_step", "trace time, training step (loss + jax.grad + adam)"),
)
TRACE_REFERENCE = "eqx-static / eqx.partition + jax.jit (fair twin)"
ECOSYSTEM_THRESHOLD = 1.05


def _size_note(measured: int, stated: int, what: str) -> str:
    """Where the run measured a smaller model than the target names (a smoke run)."""
    if measured == stated:
        return ""
    return f"evaluated on {measured} {what}: the target is stated for {stated}"


def _build_target(
    builds: ConstructionBuilds | None, row: tuple[str, str, float, bool, str]
) -> Target:
    """One row of `BUILD_TARGETS`, judged."""
    op, key, thr, info, name = row
    impl, ref = key.split(" / ")
    name = f"{name} <= {thr}x {ref}"
    if builds is None:
        return judged_target(name, None, "<=", thr, "not measured", "construction")
    r = builds["ratios"].get(op, {}).get(key)
    stats = builds["ops_us"].get(op, {})
    detail = (
        f"{fmt_ratio(r, iqr=True)}; {impl} "
        f"{fmt_stat_us(if_measured(stats.get(impl)), True)}, {ref} "
        f"{fmt_stat_us(if_measured(stats.get(ref)), True)}"
    )
    notes = [INFO_ONLY if info else ""]
    if op == "wrap_arrays":
        notes.append(_size_note(builds["arrays"], CONSTRUCTION_ARRAYS, "arrays"))
    if op == "build_init":
        notes += [
            _size_note(builds["blocks"], CONSTRUCTION_BLOCKS, "blocks"),
            "the layers' own constructors (random init) inside the timing",
        ]
    return judged_target(
        name,
        median_of(r),
        "<=",
        thr,
        detail,
        f"construction: {op}",
        "; ".join(x for x in notes if x),
        info,
    )


def _trace_target(trace: TraceTimes | None, fn: str, name: str) -> Target:
    """A trace-time target: autostatic under plain `jax.jit` against the fair twin
    under Equinox's partitioned route."""
    name = f"{name} <= 1.0x {TRACE_REFERENCE}"
    if trace is None:
        return judged_target(name, None, "<=", 1.0, "not measured", "construction")
    r = trace["ratios"].get(fn)
    ms = trace["ms"].get(fn, {})
    detail = ", ".join(
        f"{v.split(' / ')[0]} {m['median']:.1f} ms"
        for v, stat in ms.items()
        if (m := if_measured(stat))
    )
    notes = [
        _size_note(trace["blocks"], CONSTRUCTION_BLOCKS, "blocks"),
        "plain `jax.jit` refuses the fair twin (`eqx.nn.MLP` holds a function "
        "field): it is traced by Equinox's route, `eqx.partition` once and "
        "`jax.jit` over its arrays, the static half closed over",
    ]
    return judged_target(
        name,
        median_of(r),
        "<=",
        1.0,
        f"{fmt_ratio(r, iqr=True)}; {detail} over {trace['reps']} reps",
        f"construction: trace {fn}",
        "; ".join(x for x in notes if x),
    )


def _ecosystem_targets(eco: EcosystemTrace | None) -> list[Target]:
    """Trace + compile with the libraries rebased against stock, per workload."""
    name = "trace + compile, {} with diffrax/lineax/optimistix rebased <= {}x stock"
    if eco is None:
        return [
            judged_target(
                name.format(w, ECOSYSTEM_THRESHOLD),
                None,
                "<=",
                ECOSYSTEM_THRESHOLD,
                "not measured",
                "construction",
            )
            for w in ("diffeqsolve", "root_find")
        ]
    targets = []
    for workload, res in eco["workloads"].items():
        r = res["ratio"]
        targets.append(
            judged_target(
                name.format(workload, ECOSYSTEM_THRESHOLD),
                r["median"],
                "<=",
                ECOSYSTEM_THRESHOLD,
                f"{r['median']:.2f}x (pairs {r['min']:.2f}–{r['max']:.2f}, n={r['n']}); "
                f"stock {res['stock_ms']['median']:.0f} ms, rebased "
                f"{res['rebased_ms']['median']:.0f} ms; lowering "
                f"{res['lower_ratio']['median']:.2f}x, compiling "
                f"{res['compile_ratio']['median']:.2f}x",
                f"construction: {workload}",
                f"not paired within a process: {eco['processes_per_side']} stock and "
                f"{eco['processes_per_side']} rebased processes alternated, a ratio per "
                f"adjacent pair, {eco['reps']} compiles each; rebase checked "
                f"({'yes' if eco['rebase_checked'] else 'NO'})",
            )
        )
    return targets


def construction_targets(cons: Construction | None) -> list[Target]:
    """The build, trace and ecosystem targets; each N/A where its step failed. The
    `build` targets on the real models are `real_models`' (`REAL_TARGETS`)."""
    cons = cons or {}
    builds = cons.get("builds")
    trace = cons.get("trace")
    return (
        [_build_target(builds, row) for row in BUILD_TARGETS]
        + [_trace_target(trace, fn, name) for fn, name in TRACE_TARGETS]
        + _ecosystem_targets(cons.get("ecosystem"))
    )
