"""The report's detail tables: one function per section of `results.json`, each
returning markdown lines (the targets' own table included).

The retracing, construction, scaling and containers sections have modules of their
own (`retracing`, `construction`, `scaling`, `containers`); the verdict and the
summary, which read across sections, are in `summary`.
"""

from typing import Any

from .. import models as M
from ..schema import (
    AsyncDispatch,
    AsyncVariant,
    Failed,
    FirstCall,
    Machine,
    NOT_JUDGED,
    RealModel,
    RealModels,
    SectionError,
    Serialisation,
    Stat,
    Target,
    Training,
    TreeOpsGroup,
)
from .format import (
    BAR,
    DICT_JIT,
    EQX_FILTER_FILTER,
    EQX_STATIC_FILTER,
    FAIR_TWIN,
    fmt_ratio,
    fmt_stat_us,
    fmt_time_us,
    mlp_depths,
    OP_LABELS,
    REF_IMPL_NOTES,
    REF_IMPLS,
    ref_label,
    table,
)


def machine_section(machine: Machine) -> list[str]:
    """The heading: mode, date, machine and versions."""
    versions = ", ".join(f"{k} {v}" for k, v in machine["versions"].items())
    return [
        f"## Benchmarks ({machine['mode']} mode), {machine['date']}",
        "",
        f"{machine['platform']}; {machine['cpu_count']} CPUs ({machine['cpus_usable']} usable); "
        f"Python {machine['python']}; backend `{machine['backend']}`, device "
        f"`{machine['device_kind']}` x{machine['device_count']}; {versions}.",
        "",
    ]


def collector_section(settings: dict[str, Any]) -> list[str]:
    """Whether the run timed with the garbage collector on (nothing for results made
    before `--gc-off` existed)."""
    if "gc_off" not in settings:
        return []
    if settings["gc_off"]:
        text = (
            "Timed with the garbage collector off (`--gc-off`): the collections the "
            "timed code's allocations trigger are not counted."
        )
    else:
        text = (
            "Timed with the garbage collector on, as users run: the collections the "
            "timed code's allocations trigger are counted (the heap made before "
            "timing is frozen, and a collection runs between rounds)."
        )
    return [text, ""]


# --------------------------------------------------------------------------------------
# Pytree operations and dispatch.
# --------------------------------------------------------------------------------------

DISPATCH_REFS = (FAIR_TWIN, EQX_STATIC_FILTER, EQX_FILTER_FILTER, DICT_JIT)


def _tree_op_tables(res: TreeOpsGroup) -> list[str]:
    """Every implementation's µs per op, then its paired ratios to each reference."""
    ops = list(OP_LABELS)
    rows = []
    for impl, per_op in res["ops_us"].items():
        info = res["info"][impl]
        rows.append(
            [f"`{impl}`", str(info["leaves"]), str(info["treedef_nodes"])]
            + [fmt_stat_us(per_op.get(op)) for op in ops]
        )
    lines = table(
        ["impl", "leaves", "treedef nodes"] + [OP_LABELS[o] for o in ops], rows
    )
    not_equal = [i for i, info in res["info"].items() if not info["treedefs_equal"]]
    if not_equal:
        lines.append("")
        lines.append(
            f"**treedefs of two equal models compare unequal for: {', '.join(not_equal)}**"
        )
    for ref in REF_IMPLS:
        if not res["ratios"].get(ref):
            continue
        lines += [
            "",
            f"Ratios vs `{ref}`, {REF_IMPL_NOTES[ref]} (paired per round; < 1 = faster):",
            "",
        ]
        rows = [
            [f"`{impl}`"] + [fmt_ratio(r.get(op)) for op in ops]
            for impl, r in res["ratios"][ref].items()
        ]
        lines += table(["impl"] + [OP_LABELS[o] for o in ops], rows)
    return lines


def _dispatch_table(res: TreeOpsGroup) -> list[str]:
    """Every variant's µs per call and its paired ratios to `DISPATCH_REFS`."""
    rows = []
    for name, entry in res["dispatch_us"].items():
        if "fails" in entry:
            rows.append(
                [f"`{name}`", f"**fails**: {entry['fails'][:120]}"]
                + [""] * len(DISPATCH_REFS)
            )
            continue
        rows.append(
            [f"`{name}`", fmt_stat_us(entry)]
            + [fmt_ratio(entry["ratios"].get(ref), iqr=True) for ref in DISPATCH_REFS]
        )
    return table(
        ["variant", "µs/call (IQR)"] + [f"vs {ref_label(r)}" for r in DISPATCH_REFS],
        rows,
    )


def tree_ops_section(res: TreeOpsGroup) -> list[str]:
    """One model's pytree operations and dispatch."""
    lines = [
        f"### {res['model']}: pytree operations, median µs (IQR), {res['rounds']} rounds "
        f"({res.get('rounds_slow_ops', '?')} for building)",
        "",
    ]
    if M.PYNODE in res["ops_us"]:
        lines += [
            f"`{M.PYNODE}` is not a model implementation: the same arrays in the cheapest "
            "possible Python-registered pytree node (unflatten = `object.__new__` + one "
            "slot write), the floor of any eqx.Module-like class.",
            "",
        ]
    for impl, err in res.get("unavailable", {}).items():
        lines.append(f"* `{impl}` unavailable: {err}")
    lines += _tree_op_tables(res)
    lines += [
        "",
        "Dispatch of a compiled `lambda m: <one array> + 1`, µs/call (blocked), and "
        "paired ratios vs each reference (< 1 = faster):",
        "",
    ]
    return lines + _dispatch_table(res) + [""]


def _overview_cell(res: TreeOpsGroup, impl: str, op: str) -> str:
    """One implementation's µs on one op, with its ratios to the three references."""
    stat = res["ops_us"].get(impl, {}).get(op)
    if not stat:
        return "-"
    rs = [
        fmt_ratio(res["ratios"].get(ref, {}).get(impl, {}).get(op)) for ref in REF_IMPLS
    ]
    return f"{fmt_time_us(stat['median'])} ({BAR.join(rs)})"


def _overview_dispatch_cell(res: TreeOpsGroup, name: str) -> str:
    """One variant's dispatch µs, with its ratios to three reference variants."""
    entry = res["dispatch_us"].get(name)
    if not entry or "fails" in entry:
        return "fails" if entry else "-"
    refs = (FAIR_TWIN, EQX_FILTER_FILTER, DICT_JIT)
    rs = [fmt_ratio(entry["ratios"].get(ref)) for ref in refs]
    return f"{fmt_time_us(entry['median'])} ({BAR.join(rs)})"


def overview_section(tree_ops: dict[str, TreeOpsGroup]) -> list[str]:
    """Flatten, unflatten and dispatch of every implementation against MLP depth."""
    mlps = sorted((n, tree_ops[f"mlp-{n}"]) for n in mlp_depths(tree_ops))
    if not mlps:
        return []
    lines = [
        "### Overview: MLP overhead vs N, median µs (paired ratios vs the fair twin \\| "
        "vs what Equinox users run \\| vs `dict`)",
        "",
    ]
    header = ["impl / op"] + [f"N={n}" for n, _ in mlps]
    rows = []
    for impl in M.IMPLS + (M.PYNODE,):
        for op in ("flatten", "unflatten"):
            cells = [_overview_cell(res, impl, op) for _, res in mlps]
            rows.append([f"`{impl}` {op}"] + cells)
    for impl, jit in M.VARIANTS:
        name = M.variant_name(impl, jit)
        cells = [_overview_dispatch_cell(res, name) for _, res in mlps]
        rows.append([f"`{name}` dispatch"] + cells)
    lines += table(header, rows)
    lines += [
        "",
        "Ratios (paired per round, < 1 = faster), in this order: tree ops vs `eqx-static` "
        "(the fair twin's class: static fields marked) \\| vs `eqx-filter` (eqx.Module "
        "without markers) \\| vs `dict`; dispatch rows vs `eqx-static / jax.jit` (the "
        "fair twin) \\| vs `eqx-filter / eqx.filter_jit` (what Equinox users run) \\| "
        "vs `dict / jax.jit`.",
        "",
    ]
    return lines


# --------------------------------------------------------------------------------------
# Async dispatch.
# --------------------------------------------------------------------------------------

ASYNC_REFS = (FAIR_TWIN, EQX_STATIC_FILTER, EQX_FILTER_FILTER)


def _async_row(name: str, v: AsyncVariant | Failed) -> list[str]:
    """One variant's row of the async table."""
    if "fails" in v:
        return [f"`{name}`", f"fails: {v['fails'][:100]}"] + [""] * (
            6 + len(ASYNC_REFS)
        )
    frac, (frac_q1, frac_q3) = v["hidden_fraction"], v["hidden_fraction_iqr"]
    return (
        [
            f"`{name}`",
            f"{v['wall_ms_per_step']:.2f} ({v['wall_iqr_ms'][0]:.2f}–{v['wall_iqr_ms'][1]:.2f})",
        ]
        + [fmt_ratio(v["wall_ratios"].get(ref), iqr=True) for ref in ASYNC_REFS]
        + [
            f"{v['no_host_ms_per_step']:.2f}",
            f"{v['serial_ms_per_step']:.2f}",
            f"{v['ideal_ms_per_step']:.2f}",
            f"{v['hidden_ms_per_step']:.2f}",
            f"{100 * frac:.0f}% ({100 * frac_q1:.0f}–{100 * frac_q3:.0f}%)",
        ]
    )


def async_section(res: AsyncDispatch) -> list[str]:
    """How much host work each variant hides behind device work."""
    lines = [
        f"### Async dispatch: {res['steps']} steps `h = f(model, h, w)` ({res['matmuls']} "
        f"matmuls {res['matrix'][0]}x{res['matrix'][1]} per step) on the {res.get('depth', '?')}-layer MLP, "
        f"host work {res['host_ms_per_step']:.2f} ms between steps, device ≈ {res['device_ms_per_step']:.2f} ms/step",
        "",
    ]
    rows = [_async_row(name, v) for name, v in res["variants"].items()]
    lines += table(
        ["variant", "wall ms/step (IQR)"]
        + [f"wall vs {ref_label(r)}" for r in ASYNC_REFS]
        + [
            "no-host ms/step",
            "serial = no-host + host",
            "ideal = max(no-host, host)",
            "host hidden ms/step (paired)",
            "hidden / min(no-host, host) (IQR)",
        ],
        rows,
    )
    lines += [
        "",
        "Wall-time ratios are paired per round (< 1 = faster). On the CPU backend the "
        "device is the host's own cores: the busy host loop takes a core from XLA, so "
        "less can be hidden than on a GPU/TPU (and on a loaded machine the overlap can "
        "come out negative).",
        "",
    ]
    return lines


# --------------------------------------------------------------------------------------
# Time to first call, training.
# --------------------------------------------------------------------------------------

FIRST_CALL_REFS = (FAIR_TWIN, EQX_STATIC_FILTER, EQX_FILTER_FILTER)


def first_call_section(first_call: dict[str, FirstCall]) -> list[str]:
    """Time to first call per MLP depth and variant, with its paired ratios."""
    fn = next(iter(first_call.values()))["fn"]
    what = (
        "the dispatch benchmark's cheap function"
        if fn == "probe"
        else "the whole MLP forward pass"
    )
    lines = [
        f"### Time to first call (trace + compile + run of a fresh jitted function: {what}), ms",
        "",
    ]
    rows = []
    for n, res in first_call.items():
        for name, v in res["variants"].items():
            if "fails" in v:
                rows.append(
                    [n, f"`{name}`", f"fails: {v['fails'][:80]}"]
                    + [""] * (len(FIRST_CALL_REFS) + 1)
                )
                continue
            rows.append(
                [n, f"`{name}`", f"{v['median']:.1f} ({v['q1']:.1f}–{v['q3']:.1f})"]
                + [fmt_ratio(v["ratios"].get(ref), iqr=True) for ref in FIRST_CALL_REFS]
                + [", ".join(f"{s:.0f}" for s in v["samples_ms"])]
            )
    lines += table(
        ["N", "variant", "median ms (IQR)"]
        + [f"vs {ref_label(r)}" for r in FIRST_CALL_REFS]
        + ["samples"],
        rows,
        "rlr" + "r" * len(FIRST_CALL_REFS) + "l",
    )
    return lines + [
        "",
        "Ratios are paired per repetition (every variant once per repetition, in a "
        "shuffled order); < 1 = faster.",
        "",
    ]


TRAIN_REFS = (FAIR_TWIN, EQX_STATIC_FILTER, EQX_FILTER_FILTER)


def training_section(training: dict[str, Training]) -> list[str]:
    """Steps/s per trained model and variant, with its paired throughput ratios."""
    lines = ["### Training step (forward + grad + optax adam), steps/s", ""]
    rows = []
    for model, res in training.items():
        for name, v in res["variants"].items():
            if "fails" in v:
                rows.append(
                    [model, f"`{name}`", f"fails: {v['fails'][:80]}"]
                    + [""] * (len(TRAIN_REFS) + 3)
                )
                continue
            r = v["throughput_ratios"]
            rows.append(
                [
                    model,
                    f"`{name}`",
                    f"{v['steps_per_s']:.0f}",
                    f"{v['ms_per_step']:.3f} ({v['ms_iqr'][0]:.3f}–{v['ms_iqr'][1]:.3f})",
                ]
                + [fmt_ratio(r.get(ref), iqr=True) for ref in TRAIN_REFS]
                + [fmt_ratio(r.get(DICT_JIT)), f"{v['first_call_s']:.2f}"]
            )
    lines += table(
        ["model", "variant", "steps/s", "ms/step (IQR)"]
        + [f"throughput vs {ref_label(r)}" for r in TRAIN_REFS]
        + [f"throughput vs {DICT_JIT}", "first call s"],
        rows,
        "llrr" + "r" * len(TRAIN_REFS) + "rr",
    )
    return lines + [
        "",
        "Throughput ratios are paired per round; > 1 = more steps/s. The `jax.jit` "
        "variants run the same plain-JAX step (the fair twin is the like-for-like "
        "comparison); the `eqx.filter_jit` ones the Equinox idiom "
        "(`eqx.filter_value_and_grad`, `eqx.apply_updates`), what Equinox users run.",
        "",
    ]


# --------------------------------------------------------------------------------------
# Serialisation, targets, real models, errors.
# --------------------------------------------------------------------------------------


def serialisation_section(ser: Serialisation) -> list[str]:
    """The checkpoint benchmark's own table, or why it did not run."""
    lines = ["### Serialisation (`benchmarks/serialisation.py`)", ""]
    if ser["status"] != "ok" or "results" not in ser:
        lines.append(f"* {ser['status']}: {ser.get('error', '')}")
        return lines + [""]
    lines.append(ser["results"]["table"])
    return lines + [""]


def targets_section(targets: list[Target]) -> list[str]:
    """What the targets are, then every target with its status, measurement and
    note."""
    lines = [
        "### Targets",
        "",
        "These are the project's own stretch targets: thresholds set by the project to "
        "judge its own design, not promises to users and not a comparison every model "
        "must win. A MISSED row says the design did not reach its aim on that row, "
        "with the measured value beside it. What a user should read is the ratio "
        "columns of the tables (below 1 is faster than the baseline the column names) "
        "and the verdict's line for each model kind.",
        "",
    ]
    rows = [
        [t["target"], t["where"], f"**{t['status']}**", t["detail"], t["note"]]
        for t in targets
    ]
    lines += table(["target", "on", "status", "measured", "note"], rows, "lllll")
    if any(t["status"].endswith(NOT_JUDGED) for t in targets):
        lines += [
            "",
            "A smoke run only checks that everything runs: its numbers mean nothing, "
            "so no target is judged.",
        ]
    return lines + [""]


REAL_IMPLS = ("autostatic", "eqx-static", "eqx-filter")


def scale_variants(res: RealModel) -> list[str]:
    """A real model's other eqx-static configurations, timed for scale on some ops
    (`Model.treedef_variants`): the implementations beyond the three and the floor."""
    seen = {impl for stats in res["ops_us"].values() for impl in stats}
    return sorted(seen - {*REAL_IMPLS, "dict"})


def _real_cell(stat: Stat | Failed | None) -> str:
    """A real model's µs, `fails` or `-`."""
    if not stat:
        return "-"
    if "fails" in stat:
        return "fails"
    return fmt_time_us(stat["median"])


def _real_model_notes(name: str, res: RealModel, ops: dict[str, str]) -> list[str]:
    """A model's failures, its floor and scale variants, unequal treedefs."""
    notes = []
    for op, label in ops.items():
        stats = res["ops_us"].get(op, {})
        for impl in REAL_IMPLS:
            stat = stats.get(impl, {})
            if "fails" in stat:
                notes.append(f"* {name}, {label}, `{impl}` fails: {stat['fails']}")
    for ref in ("dict", *scale_variants(res)):
        floor = []
        for op, label in ops.items():
            stat = res["ops_us"].get(op, {}).get(ref, {})
            if "median" in stat:
                ratio = fmt_ratio(res["ratios"][op].get(ref), iqr=True)
                floor.append(
                    f"{label} {fmt_time_us(stat['median'], True)} (autostatic {ratio})"
                )
        if floor:
            kind = "floor" if ref == "dict" else "for scale"
            notes.append(f"* {name}, `{ref}` ({kind}): " + "; ".join(floor))
    unequal = [i for i, v in res["info"].items() if not v.get("treedefs_equal")]
    if unequal:
        notes.append(f"* {name}: **treedefs of two equal models differ**: {unequal}")
    return notes


def real_models_section(real: RealModels) -> list[str]:
    """Every real model's ops in the three implementations, autostatic's ratios."""
    lines = [
        "### Real models: eqx.nn layers inside user modules, median µs "
        "(paired ratios of autostatic, IQR)",
        "",
        f"`autostatic` and `eqx-static` are called with `jax.jit`, `eqx-filter` with "
        f"`eqx.filter_jit`; the `dispatch, all eqx.filter_jit` row calls all three with "
        f"`eqx.filter_jit`. {real.get('build_note', '')}.",
        "",
    ]
    rows, notes = [], []
    for name, res in real["models"].items():
        for op, label in real["ops"].items():
            stats = res["ops_us"].get(op, {})
            ratios = res["ratios"].get(op, {})
            rows.append(
                [f"{name} ({res['rounds']} rounds)" if op == "build" else "", label]
                + [_real_cell(stats.get(impl)) for impl in REAL_IMPLS]
                + [fmt_ratio(ratios.get(ref), iqr=True) for ref in REAL_IMPLS[1:]]
            )
        notes += _real_model_notes(name, res, real["ops"])
    lines += table(
        ["model", "op"]
        + [f"{impl} µs" for impl in REAL_IMPLS]
        + [f"vs {ref}" for ref in REAL_IMPLS[1:]],
        rows,
        "llrrrrr",
    )
    return lines + [""] + notes + ([""] if notes else [])


def errors_section(errors: list[SectionError]) -> list[str]:
    """The sections that crashed, with their errors."""
    return (
        ["### Errors", ""] + [f"* {e['section']}: {e['error']}" for e in errors] + [""]
    )
