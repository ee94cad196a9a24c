"""Tables (markdown), targets (MET / MISSED), `results.json` and PNG plots.

Every table shows medians with the interquartile range, and ratios that are paired per
round (see `timing`). Targets are checked against fixed thresholds that are never
adjusted to the results; a target that cannot be evaluated is `N/A` with the reason.
"""

import json
import math
import os
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

from . import models as M

TARGET_N = 256
EQX_STATIC_JIT = M.variant_name("eqx-static", M.JAX_JIT)
EQX_STATIC_FILTER = M.variant_name("eqx-static", M.FILTER_JIT)
EQX_FILTER_FILTER = M.variant_name("eqx-filter", M.FILTER_JIT)
DICT_JIT = M.variant_name("dict", M.JAX_JIT)
AUTO_JIT = M.variant_name("autostatic", M.JAX_JIT)
# The references of the tree-op ratios (no jit involved) and what each one is.
REF_IMPLS: tuple[str, ...] = ("eqx-static", "eqx-filter", "dict")
REF_IMPL_NOTES: dict[str, str] = {
    "eqx-static": "the fair twin's class (eqx.Module, static fields marked)",
    "eqx-filter": "eqx.Module without markers (what Equinox users write for "
    "`eqx.filter_jit`)",
    "dict": "the floor (arrays in plain dicts)",
}


BAR = " \\| "  # a `|` inside a markdown table cell


def _ref_label(variant: str) -> str:
    """A reference variant's name, the fair twin marked as such."""
    return f"{variant} (fair twin)" if variant == EQX_STATIC_JIT else variant


# --------------------------------------------------------------------------------------
# Formatting.
# --------------------------------------------------------------------------------------


def fmt_time_us(us: float, unit: bool = False) -> str:
    """µs with 3 significant digits; >= 1 ms as ms (always labelled)."""
    if us is None or not math.isfinite(us):
        return "-"
    if us >= 1000:
        return f"{us / 1000:.2f} ms"
    text = f"{us:.0f}" if us >= 100 else f"{us:.1f}" if us >= 10 else f"{us:.2f}"
    return text + (" µs" if unit else "")


def fmt_stat_us(stat: dict[str, float] | None, unit: bool = False) -> str:
    if not stat:
        return "-"
    med, q1, q3 = (fmt_time_us(stat[k], unit) for k in ("median", "q1", "q3"))
    return f"{med} ({q1}–{q3})"


def fmt_ratio(r: dict[str, float] | None, iqr: bool = False) -> str:
    if not r or not math.isfinite(r.get("median", float("nan"))):
        return "-"
    text = f"{r['median']:.2f}x"
    if iqr:
        text += f" ({r['q1']:.2f}–{r['q3']:.2f})"
    return text


def table(
    header: list[str], rows: Iterable[list[str]], align: str | None = None
) -> list[str]:
    align = align or "l" + "r" * (len(header) - 1)
    seps = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(seps) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


# --------------------------------------------------------------------------------------
# Sections.
# --------------------------------------------------------------------------------------

OP_LABELS = {
    "flatten": "flatten",
    "unflatten": "unflatten",
    "flatten_with_path": "flatten_with_path",
    "treedef_eq": "treedef ==",
    "unflatten_read": "unflatten + read all",
    "build": "build model",
}


def tree_ops_section(res: dict[str, Any]) -> list[str]:
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
    ops = list(OP_LABELS)
    rows = []
    for impl, per_op in res["ops_us"].items():
        info = res["info"][impl]
        rows.append(
            [f"`{impl}`", info["leaves"], info["treedef_nodes"]]
            + [fmt_stat_us(per_op.get(op)) for op in ops]
        )
    lines += table(
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
    lines += [
        "",
        "Dispatch of a compiled `lambda m: <one array> + 1`, µs/call (blocked), and "
        "paired ratios vs each reference (< 1 = faster):",
        "",
    ]
    refs = [EQX_STATIC_JIT, EQX_STATIC_FILTER, EQX_FILTER_FILTER, DICT_JIT]
    rows = []
    for name, entry in res["dispatch_us"].items():
        if "fails" in entry:
            rows.append(
                [f"`{name}`", f"**fails**: {entry['fails'][:120]}"] + [""] * len(refs)
            )
            continue
        rows.append(
            [f"`{name}`", fmt_stat_us(entry)]
            + [fmt_ratio(entry["ratios"].get(ref), iqr=True) for ref in refs]
        )
    lines += table(
        ["variant", "µs/call (IQR)"] + [f"vs {_ref_label(r)}" for r in refs], rows
    )
    return lines + [""]


def overview_section(tree_ops: dict[str, Any]) -> list[str]:
    mlps = sorted(
        (int(name.split("-")[1]), res)
        for name, res in tree_ops.items()
        if name.startswith("mlp-")
    )
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
            cells = []
            for _, res in mlps:
                stat = res["ops_us"].get(impl, {}).get(op)
                if not stat:
                    cells.append("-")
                    continue
                rs = [
                    fmt_ratio(res["ratios"].get(ref, {}).get(impl, {}).get(op))
                    for ref in REF_IMPLS
                ]
                cells.append(f"{fmt_time_us(stat['median'])} ({BAR.join(rs)})")
            rows.append([f"`{impl}` {op}"] + cells)
    refs = (EQX_STATIC_JIT, EQX_FILTER_FILTER, DICT_JIT)
    for impl, jit in M.VARIANTS:
        name = M.variant_name(impl, jit)
        cells = []
        for _, res in mlps:
            entry = res["dispatch_us"].get(name)
            if not entry or "fails" in entry:
                cells.append("fails" if entry else "-")
                continue
            rs = [fmt_ratio(entry["ratios"].get(ref)) for ref in refs]
            cells.append(f"{fmt_time_us(entry['median'])} ({BAR.join(rs)})")
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


ASYNC_REFS = (EQX_STATIC_JIT, EQX_STATIC_FILTER, EQX_FILTER_FILTER)


def async_section(res: dict[str, Any]) -> list[str]:
    lines = [
        f"### Async dispatch: {res['steps']} steps `h = f(model, h, w)` ({res['loop_depth']} "
        f"matmuls {res['matrix'][0]}x{res['matrix'][1]} per step) on the {res.get('depth', '?')}-layer MLP, "
        f"host work {res['host_ms_per_step']:.2f} ms between steps, device ≈ {res['device_ms_per_step']:.2f} ms/step",
        "",
    ]
    rows = []
    for name, v in res["variants"].items():
        if "fails" in v:
            rows.append(
                [f"`{name}`", f"fails: {v['fails'][:100]}"]
                + [""] * (6 + len(ASYNC_REFS))
            )
            continue
        ratios = dict(v.get("wall_ratios") or {})
        ratios.setdefault(EQX_STATIC_FILTER, v.get(f"wall vs {EQX_STATIC_FILTER}"))
        rows.append(
            [
                f"`{name}`",
                f"{v['wall_ms_per_step']:.2f} ({v['wall_iqr_ms'][0]:.2f}–{v['wall_iqr_ms'][1]:.2f})",
            ]
            + [fmt_ratio(ratios.get(ref), iqr=True) for ref in ASYNC_REFS]
            + [
                f"{v['no_host_ms_per_step']:.2f}",
                f"{v['serial_ms_per_step']:.2f}",
                f"{v['ideal_ms_per_step']:.2f}",
                f"{v['hidden_ms_per_step']:.2f}",
                f"{100 * v['hidden_fraction']:.0f}% ({100 * v['hidden_fraction_iqr'][0]:.0f}–{100 * v['hidden_fraction_iqr'][1]:.0f}%)",
            ]
        )
    lines += table(
        ["variant", "wall ms/step (IQR)"]
        + [f"wall vs {_ref_label(r)}" for r in ASYNC_REFS]
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


def _retrace_rank(entry: dict[str, Any] | None) -> tuple[int, float] | None:
    """Orders outcomes: fewer traces is better; a stale result is worse than any count,
    and a failure worse still."""
    if not entry:
        return None
    if "error" in entry:
        return (2, 0.0)
    if entry.get("stale"):
        return (1, 0.0)
    return (0, float(entry["count"]))


def _retrace_text(entry: dict[str, Any] | None) -> str:
    if not entry:
        return "-"
    if "error" in entry:
        return "fails"
    return f"{entry['count']}" + (" stale" if entry.get("stale") else "")


def retrace_verdict(scenario: dict[str, Any], ref: str) -> str:
    """`better`, `worse` or `same`: AutoModule (`jax.jit`) against `ref` in one
    contrast scenario (`-` if either is missing)."""
    ours = _retrace_rank(scenario["counts"].get(AUTO_JIT))
    theirs = _retrace_rank(scenario["counts"].get(ref))
    if ours is None or theirs is None:
        return "-"
    return "better" if ours < theirs else "worse" if ours > theirs else "same"


def _verdict_cell(scenario: dict[str, Any], ref: str) -> str:
    verdict = retrace_verdict(scenario, ref)
    pair = (
        f"{_retrace_text(scenario['counts'].get(AUTO_JIT))} vs "
        f"{_retrace_text(scenario['counts'].get(ref))}"
    )
    if verdict == "better":
        return f"**AutoModule better** ({pair})"
    if verdict == "worse":
        return f"**AutoModule WORSE** ({pair})"
    return verdict


def retrace_contrast_section(con: dict[str, Any]) -> list[str]:
    """Where AutoModule and eqx.Module retrace differently, both directions."""
    variants = con["variants"]
    lines = [
        f"#### Where eqx.Module and AutoModule retrace differently: traces over "
        f"{con['calls']} calls, the model rebuilt before each (counted by a Python side "
        "effect at trace time)",
        "",
    ]
    rows, notes = [], []
    for name, sc in con["scenarios"].items():
        cells = []
        problems: dict[str, list[str]] = {}
        for v in variants:
            entry = sc["counts"].get(v)
            text = _retrace_text(entry)
            for warning in (entry or {}).get("warnings", []):
                text += " (warns)"
                problems.setdefault(f"warns: {warning}", []).append(v)
                break
            if entry and "error" in entry:
                problems.setdefault(f"fails: {entry['error'][:160]}", []).append(v)
            if entry and entry.get("stale"):
                problems.setdefault("result STALE (the change was ignored)", []).append(
                    v
                )
            cells.append(text)
        rows.append(
            [f"`{name}`: {sc['description']}"]
            + cells
            + [
                _verdict_cell(sc, EQX_STATIC_JIT),
                _verdict_cell(sc, EQX_FILTER_FILTER),
                sc["why"],
            ]
        )
        notes += [
            f"* `{name}`, {', '.join(f'`{v}`' for v in vs)} {what}"
            for what, vs in problems.items()
        ]
    lines += table(
        ["scenario"]
        + [f"`{_ref_label(v)}`" for v in variants]
        + [
            f"AutoModule vs {_ref_label(EQX_STATIC_JIT)}",
            f"AutoModule vs {EQX_FILTER_FILTER}",
            "why",
        ],
        rows,
        "l" + "r" * len(variants) + "lll",
    )
    lines += [
        "",
        "Fewer traces is better; a stale result or a failure is worse than any count. "
        "`eqx-static` marks the fields the scenario names static (for the `*_unmarked` "
        "rows: none, as an Equinox user would for a value that changes); `eqx-filter` "
        "has no markers. `eqx-filter / jax.jit` only works for models of arrays and "
        "numbers.",
    ]
    return lines + ([""] + notes if notes else []) + [""]


def retracing_section(res: dict[str, Any]) -> list[str]:
    scen = res["scenarios"]
    names = list(scen)
    lines = ["### Retracing", ""]
    if res.get("contrasts"):
        lines += retrace_contrast_section(res["contrasts"])
    lines += [
        f"#### Scripted scenarios on the MLP (depth {res['depth']}; traces per scenario, "
        "fresh jitted function each)",
        "",
    ]
    for n in names:
        eq = (
            "static values equal"
            if scen[n]["static_values_equal"]
            else "static values CHANGE"
        )
        lines.append(
            f"* `{n}`: {scen[n]['description']}; ideal {scen[n]['ideal']} ({eq})"
        )
    lines.append("")
    rows = [["**ideal**"] + [str(scen[n]["ideal"]) for n in names] + [""]]
    for variant, row in res["counts"].items():
        cells = []
        errors: dict[str, list[str]] = {}  # one note per distinct error
        notes = []
        for n in names:
            r = row[n]
            text = str(r["count"])
            if "error" in r:
                text = f"**fail** ({r['count']})"
                errors.setdefault(r["error"][:110], []).append(n)
            if r.get("stale"):
                text += " stale"
                notes.append(f"{n}: result STALE (the changed value was ignored)")
            cells.append(text)
        notes = [f"{', '.join(ns)}: {err}" for err, ns in errors.items()] + notes
        rows.append([f"`{variant}`"] + cells + ["; ".join(notes)])
    lines += table(
        ["variant"] + [f"`{n}`" for n in names] + ["notes"],
        rows,
        "l" + "r" * len(names) + "l",
    )
    lines += [
        "",
        "The `dict` floor closes over its non-array data, so it is the reference only where "
        "the static values are equal; where they change (`new_lambda`, `float_hparam`) it "
        "traces once and ignores the change (stale), which is not a valid reference: "
        "compare with the ideal there.",
        "",
    ]
    return lines


FIRST_CALL_REFS = (EQX_STATIC_JIT, EQX_STATIC_FILTER, EQX_FILTER_FILTER)


def first_call_section(first_call: dict[str, Any]) -> list[str]:
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
            ratios = dict(v.get("ratios") or {})
            ratios.setdefault(EQX_STATIC_JIT, v.get("vs eqx-static / jax.jit"))
            rows.append(
                [
                    n,
                    f"`{name}`",
                    f"{v['median']:.1f} ({v['q1']:.1f}–{v['q3']:.1f})",
                ]
                + [fmt_ratio(ratios.get(ref), iqr=True) for ref in FIRST_CALL_REFS]
                + [", ".join(f"{s:.0f}" for s in v["samples_ms"])]
            )
    lines += table(
        ["N", "variant", "median ms (IQR)"]
        + [f"vs {_ref_label(r)}" for r in FIRST_CALL_REFS]
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


TRAIN_REFS = (EQX_STATIC_JIT, EQX_STATIC_FILTER, EQX_FILTER_FILTER)


def training_section(training: dict[str, Any]) -> list[str]:
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
        + [f"throughput vs {_ref_label(r)}" for r in TRAIN_REFS]
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


def serialisation_section(ser: dict[str, Any]) -> list[str]:
    lines = ["### Serialisation (`benchmarks/serialisation.py`)", ""]
    status = ser.get("status")
    if status != "ok":
        lines.append(f"* {status}: {ser.get('error', '')}")
        return lines + [""]
    results = ser.get("results")
    if isinstance(results, dict) and isinstance(results.get("table"), str):
        lines.append(results["table"])
    elif isinstance(results, dict) and isinstance(results.get("lines"), list):
        lines += [str(x) for x in results["lines"]]
    else:
        text = json.dumps(results, indent=1, default=str)
        lines += ["```", text[:4000], "```"]
    return lines + [""]


# --------------------------------------------------------------------------------------
# Targets.
# --------------------------------------------------------------------------------------


def _target(
    name: str,
    value: float | None,
    op: str,
    threshold: float,
    detail: str,
    where: str,
    note: str = "",
) -> dict[str, Any]:
    if value is None or not math.isfinite(value):
        status = "N/A"
    elif op == "<=":
        status = "MET" if value <= threshold else "MISSED"
    else:
        status = "MET" if value >= threshold else "MISSED"
    return {
        "target": name,
        "where": where,
        "value": value,
        "op": op,
        "threshold": threshold,
        "status": status,
        "detail": detail,
        "note": note,
    }


def _pick_mlp(available: Iterable[int]) -> tuple[int | None, str]:
    sizes = sorted(available)
    if not sizes:
        return None, "not measured"
    if TARGET_N in sizes:
        return TARGET_N, ""
    return (
        sizes[-1],
        f"evaluated on N={sizes[-1]}: the target is stated for N={TARGET_N}, which this run did not measure",
    )


NOT_JUDGED = "not judged (smoke run)"


def _tag(targets: list[dict[str, Any]], section: str) -> None:
    """Marks the targets added since the last call as the given section's."""
    for t in targets:
        t.setdefault("section", section)


def evaluate_targets(
    results: dict[str, Any],
    sections: Collection[str] | None = None,
    judged: bool = True,
) -> list[dict[str, Any]]:
    """The targets, each tagged with its section; only those of `sections` (default
    all). With `judged=False` (a smoke run, whose numbers mean nothing) no target is
    MET or MISSED: those are `NOT_JUDGED` (`N/A` stays, with its reason)."""
    targets: list[dict[str, Any]] = []
    tree_ops = results.get("tree_ops", {})
    n, note = _pick_mlp(int(k.split("-")[1]) for k in tree_ops if k.startswith("mlp-"))
    where = f"mlp-{n}" if n else "-"
    res = tree_ops.get(where, {})
    # The (info) row: AutoModule's unflatten is lazy (fields are filled in on first
    # read), so the unflatten target alone flatters it; beside it, with every read.
    for op, ref, thr, info in (
        ("flatten", "eqx-static", 0.5, False),
        ("flatten", "dict", 3.0, False),
        ("unflatten", "eqx-static", 0.5, False),
        ("unflatten", "dict", 3.0, False),
        ("unflatten_read", "eqx-static", 0.5, True),
    ):
        r = res.get("ratios", {}).get(ref, {}).get("autostatic", {}).get(op)
        floor = res.get("ratios", {}).get(ref, {}).get(M.PYNODE, {}).get(op)
        floor_note = (
            f"for scale: a minimal Python-registered node ({M.PYNODE}) is {fmt_ratio(floor)} {ref}"
            if ref == "dict" and floor
            else ""
        )
        lazy_note = (
            "lazy: fields are filled in on first read; with every field read, "
            "the (info) unflatten + read all row"
            if op == "unflatten" and ref == "eqx-static"
            else ""
        )
        t = _target(
            f"{'(info) ' if info else ''}{OP_LABELS.get(op, op)} <= {thr}x {ref}",
            r and r["median"],
            "<=",
            thr,
            f"{fmt_ratio(r, iqr=True)}; autostatic {fmt_stat_us(res.get('ops_us', {}).get('autostatic', {}).get(op), True)}, "
            f"{ref} {fmt_stat_us(res.get('ops_us', {}).get(ref, {}).get(op), True)}",
            where,
            "; ".join(x for x in (note, floor_note, lazy_note) if x),
        )
        targets.append(_info(t) if info else t)
    disp = res.get("dispatch_us", {}).get(AUTO_JIT, {})
    # The stated targets are vs eqx.filter_jit and the dict floor; the (info) row beside
    # them is the like-for-like comparison with the fair twin (not slower than it).
    for ref, thr, info in (
        (EQX_FILTER_FILTER, 0.35, False),
        (EQX_STATIC_JIT, 1.0, True),
        (DICT_JIT, 1.5, False),
    ):
        r = disp.get("ratios", {}).get(ref)
        t = _target(
            f"{'(info) ' if info else ''}dispatch {AUTO_JIT} <= {thr}x {_ref_label(ref)}",
            r and r["median"],
            "<=",
            thr,
            f"{fmt_ratio(r, iqr=True)}; autostatic {fmt_stat_us(disp, True) if 'median' in disp else '-'}, "
            f"ref {fmt_stat_us(res.get('dispatch_us', {}).get(ref), True)}",
            where,
            "; ".join(
                x
                for x in (
                    note,
                    "information only, not one of the stated targets" if info else "",
                )
                if x
            ),
        )
        targets.append(_info(t) if info else t)
    _tag(targets, "tree_ops")
    # Retracing: equal to the dict floor wherever the static values are equal.
    rt = results.get("retracing")
    if rt:
        auto = rt["counts"].get(AUTO_JIT, {})
        ref = rt["counts"].get(DICT_JIT, {})
        equal = [s for s, d in rt["scenarios"].items() if d["static_values_equal"]]
        diffs = [
            f"{s}: {auto.get(s, {}).get('count')}{' (error)' if 'error' in auto.get(s, {}) else ''} vs dict {ref.get(s, {}).get('count')}"
            for s in equal
            if auto.get(s, {}).get("count") != ref.get(s, {}).get("count")
            or "error" in auto.get(s, {})
        ]
        others = [
            f"{s}: {auto.get(s, {}).get('count')} (ideal {d['ideal']}, dict {ref.get(s, {}).get('count')}{' stale' if ref.get(s, {}).get('stale') else ''})"
            for s, d in rt["scenarios"].items()
            if not d["static_values_equal"]
        ]
        targets.append(
            _target(
                "trace counts == dict floor where static values are equal",
                float(len(diffs)),
                "<=",
                0.0,
                ("all equal" if not diffs else "differ: " + "; ".join(diffs))
                + f" ({', '.join(equal)})",
                f"mlp-{rt['depth']}",
                "where static values change the dict floor is not a valid reference (it goes stale); "
                "autostatic there: " + "; ".join(others),
            )
        )
    else:
        targets.append(
            _target("trace counts == dict floor", None, "<=", 0.0, "not measured", "-")
        )
    _tag(targets, "retracing")
    fc = results.get("first_call", {})
    n_fc, note_fc = _pick_mlp(int(k) for k in fc)
    v = fc.get(str(n_fc), {}).get("variants", {}).get(AUTO_JIT, {}) if n_fc else {}
    r = v.get("vs eqx-static / jax.jit")
    targets.append(
        _target(
            f"time to first call {AUTO_JIT} <= 1.05x {EQX_STATIC_JIT}",
            r and r["median"],
            "<=",
            1.05,
            f"{fmt_ratio(r, iqr=True)}; autostatic {v.get('median', float('nan')):.1f} ms over {v.get('n', 0)} reps "
            "(fresh jitted `lambda m: m.layers[0].bias + 1`)",
            f"mlp-{n_fc}",
            note_fc + ("; " if note_fc else "") + _forward_note(results, n_fc),
        )
    )
    _tag(targets, "first_call")
    tr = results.get("training", {})
    n_tr, note_tr = _pick_mlp(int(k.split("-")[1]) for k in tr if k.startswith("mlp-"))
    if note_tr and n_tr is not None:
        note_tr = (
            f"evaluated on mlp-{n_tr}: training the {TARGET_N}-layer MLP is only in --full "
            "(its train step takes ~10 s per variant to compile on 2 CPU cores)"
        )
    entry = (
        tr.get(f"mlp-{n_tr}", {}).get("variants", {}).get(AUTO_JIT, {}) if n_tr else {}
    )
    r = entry.get("throughput_ratios", {}).get(EQX_STATIC_FILTER)
    targets.append(
        _target(
            f"training throughput {AUTO_JIT} >= {EQX_STATIC_FILTER}",
            r and r["median"],
            ">=",
            1.0,
            f"{fmt_ratio(r, iqr=True)}; {entry.get('steps_per_s', float('nan')):.0f} steps/s",
            f"mlp-{n_tr}",
            note_tr,
        )
    )
    # Beside it, the like-for-like comparison: the same step code under plain jax.jit on
    # the fair twin (the target above also counts eqx.filter_jit's own overhead and the
    # Equinox idiom). For information: not one of the stated targets.
    targets.append(
        _info(
            _target(
                f"(info) training throughput {AUTO_JIT} >= {EQX_STATIC_JIT} (fair twin)",
                *_throughput(entry, EQX_STATIC_JIT),
                f"mlp-{n_tr}",
                "the same comparison against the fair twin (same step code, plain "
                "jax.jit); information only, not one of the stated targets",
            )
        )
    )
    # Not a target in the brief (which names the MLP); shown for information.
    entry = tr.get("transformer", {}).get("variants", {}).get(AUTO_JIT, {})
    if entry:
        for ref in (EQX_STATIC_FILTER, EQX_STATIC_JIT):
            targets.append(
                _info(
                    _target(
                        f"(info) training throughput {AUTO_JIT} >= {_ref_label(ref)}",
                        *_throughput(entry, ref),
                        "transformer",
                        "information only: not one of the stated targets",
                    )
                )
            )
    _tag(targets, "training")
    targets += serialisation_targets(results.get("serialisation"))
    _tag(targets, "serialisation")
    targets += real_models_targets(results.get("real_models"))
    _tag(targets, "real_models")
    if sections is not None:
        targets = [t for t in targets if t["section"] in sections]
    if not judged:
        for t in targets:
            prefix = "info: " if t["status"].startswith("info: ") else ""
            if t["status"].removeprefix(prefix) in ("MET", "MISSED"):
                t["status"] = prefix + NOT_JUDGED
    return targets


def _info(t: dict[str, Any]) -> dict[str, Any]:
    """Marks a target row as information only (`info: MET` etc.)."""
    t["status"] = "info: " + t["status"]
    return t


def _throughput(
    entry: dict[str, Any], ref: str
) -> tuple[float | None, str, float, str]:
    """(value, op, threshold, detail) of "throughput >= `ref`" for a training entry."""
    r = entry.get("throughput_ratios", {}).get(ref)
    return (
        r and r["median"],
        ">=",
        1.0,
        f"{fmt_ratio(r, iqr=True)}; {entry.get('steps_per_s', float('nan')):.0f} steps/s",
    )


def serialisation_targets(ser: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The checkpoint targets that `benchmarks/serialisation.py`'s `run` reports in
    `results["targets"]` (`{"target", "value", "op", "threshold", "detail", "note"}`),
    judged here like every other; none from an older version that has no such list."""
    if not ser:
        return []
    where = "checkpoint"
    if ser.get("status") != "ok":
        return [
            _target(
                "checkpoint speed targets",
                None,
                ">=",
                1.0,
                f"{ser.get('status')}: {ser.get('error', '')}",
                where,
            )
        ]
    results = ser.get("results")
    found = results.get("targets") if isinstance(results, dict) else None
    if not isinstance(found, list):
        return []
    targets = []
    for t in found:
        if not isinstance(t, dict):
            continue
        op, thr, value = t.get("op"), t.get("threshold"), t.get("value")
        threshold = float(thr) if isinstance(thr, (int, float)) else float("nan")
        ok = op in ("<=", ">=") and math.isfinite(threshold)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        targets.append(
            _target(
                str(t.get("target", "?")),
                float(value)
                if ok and number and isinstance(value, (int, float))
                else None,
                str(op) if ok else ">=",
                threshold,
                str(t.get("detail", "")),
                str(t.get("where", where)),
                str(t.get("note", ""))
                + (
                    ""
                    if ok and (number or value is None)
                    else f" (malformed target: op {op!r}, threshold {thr!r}, "
                    f"value {value!r})"
                ),
            )
        )
    return targets


def _forward_note(results: dict[str, Any], n: int | None) -> str:
    """The forward-pass first call (--full only), as information next to the target."""
    v = (
        results.get("first_call_forward", {})
        .get(str(n), {})
        .get("variants", {})
        .get(AUTO_JIT, {})
    )
    r = v.get("vs eqx-static / jax.jit")
    if not r:
        return "the whole forward pass is timed in --full only"
    return f"whole forward pass: {fmt_ratio(r, iqr=True)} ({v['median']:.0f} ms)"


def targets_section(targets: list[dict[str, Any]]) -> list[str]:
    lines = ["### Targets", ""]
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


# --------------------------------------------------------------------------------------
# Real models (`benchmarks/real_models.py`): eqx.nn layers inside user modules.
# --------------------------------------------------------------------------------------

_REAL_IMPLS = ("autostatic", "eqx-static", "eqx-filter")


def _real_variants(res: dict[str, Any]) -> list[str]:
    """A real model's other eqx-static configurations, timed for scale on some ops
    (`Spec.treedef_variants`): the implementations beyond the three and the floor."""
    seen = {impl for stats in res["ops_us"].values() for impl in stats}
    return sorted(seen - {*_REAL_IMPLS, "dict"})


def _real_cell(stat: dict[str, Any] | None) -> str:
    if not stat:
        return "-"
    if "fails" in stat:
        return "fails"
    return fmt_time_us(stat["median"])


def real_models_section(real: dict[str, Any]) -> list[str]:
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
                + [_real_cell(stats.get(impl)) for impl in _REAL_IMPLS]
                + [fmt_ratio(ratios.get(ref), iqr=True) for ref in _REAL_IMPLS[1:]]
            )
            for impl in _REAL_IMPLS:
                if "fails" in stats.get(impl, {}):
                    notes.append(
                        f"* {name}, {label}, `{impl}` fails: {stats[impl]['fails']}"
                    )
        for ref in ("dict", *_real_variants(res)):
            floor = [
                f"{label} {fmt_time_us(res['ops_us'][op][ref]['median'], True)} "
                f"(autostatic {fmt_ratio(res['ratios'][op].get(ref), iqr=True)})"
                for op, label in real["ops"].items()
                if "median" in res["ops_us"].get(op, {}).get(ref, {})
            ]
            if floor:
                kind = "floor" if ref == "dict" else "for scale"
                notes.append(f"* {name}, `{ref}` ({kind}): " + "; ".join(floor))
        unequal = [i for i, v in res["info"].items() if not v.get("treedefs_equal")]
        if unequal:
            notes.append(
                f"* {name}: **treedefs of two equal models differ**: {unequal}"
            )
    lines += table(
        ["model", "op"]
        + [f"{impl} µs" for impl in _REAL_IMPLS]
        + [f"vs {ref}" for ref in _REAL_IMPLS[1:]],
        rows,
        "llrrrrr",
    )
    return lines + [""] + notes + ([""] if notes else [])


# (op, models, reference, threshold, name if not "<op> <= <threshold>x <reference>"):
# each a ratio of autostatic to the reference measured in the same run.
REAL_TARGETS: tuple[tuple[str, tuple[str, ...], str, float, str], ...] = (
    ("flatten", ("linear-256", "transformer"), "eqx-static", 0.5, ""),
    ("flatten", ("linear-256",), "dict", 1.5, ""),
    (
        "dispatch",
        ("linear-256", "transformer"),
        "eqx-static",
        0.6,
        "jax.jit dispatch <= 0.6x eqx-static / jax.jit",
    ),
    (
        "dispatch",
        ("linear-256", "transformer"),
        "eqx-filter",
        0.35,
        "jax.jit dispatch <= 0.35x eqx-filter / eqx.filter_jit",
    ),
    ("unflatten_read", ("linear-256",), "eqx-static", 0.5, ""),
    ("build", ("mixed-stack",), "eqx-static", 1.0, ""),
    ("flatten", ("mixed-stack",), "eqx-static", 0.5, ""),
    ("unflatten_read", ("mixed-stack",), "eqx-static", 1.0, ""),
    ("treedef_eq", ("mixed-stack",), "eqx-static", 1.0, ""),
)
# Information only, beside the dispatch target that is N/A where plain `jax.jit` refuses
# the fair twin: the same ratio against the twin partitioned once by `eqx.partition`.
REAL_INFO_TARGETS: tuple[tuple[str, tuple[str, ...], str, float, str], ...] = (
    (
        "dispatch_partitioned",
        ("transformer", "mixed-stack"),
        "eqx-static",
        0.6,
        "jax.jit dispatch <= 0.6x eqx-static / eqx.partition once + jax.jit",
    ),
)


def real_models_targets(real: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not real:
        return [_target("real models", None, "<=", 1.0, "not measured", "real_models")]
    models, labels = real["models"], real["ops"]
    targets = []

    def detail(name: str, op: str, ref: str) -> tuple[float | None, str]:
        res = models.get(name)
        if res is None:
            return None, "not measured"
        stats = res["ops_us"].get(op, {})
        r = res["ratios"].get(op, {}).get(ref)
        if "fails" in stats.get(ref, {}):
            return None, f"{ref} fails: {stats[ref]['fails']}"
        us = ", ".join(
            f"{i} {fmt_stat_us(stats.get(i), True)}"
            for i in ("autostatic", ref)
            if stats.get(i)
        )
        return r and r["median"], f"{fmt_ratio(r, iqr=True)}; {us}"

    for info, rows in ((False, REAL_TARGETS), (True, REAL_INFO_TARGETS)):
        for op, names, ref, thr, title in rows:
            for name in names:
                if op not in labels:  # a results.json from before the op existed
                    continue
                value, text = detail(name, op, ref)
                target = _target(
                    title or f"{labels[op]} <= {thr}x {ref}",
                    value,
                    "<=",
                    thr,
                    text,
                    f"real: {name}",
                )
                targets.append(_info(target) if info else target)
    # eqx.tree_at: not slower than the same (routed) call on the eqx-static model,
    # the worst of the four models.
    for op in ("tree_at_array", "tree_at_layer"):
        per_model = {name: detail(name, op, "eqx-static") for name in models}
        measured = [(v, n) for n, (v, _) in per_model.items() if v is not None]
        worst = max(measured, default=(None, "-"))
        targets.append(
            _target(
                f"{labels[op]} <= 1.0x eqx-static (worst model)",
                worst[0],
                "<=",
                1.0,
                "; ".join(
                    f"{n} {fmt_ratio(models[n]['ratios'][op].get('eqx-static'))}"
                    for n in per_model
                ),
                f"real: {worst[1]}",
            )
        )
    return targets


# --------------------------------------------------------------------------------------
# Whole report, JSON, plots.
# --------------------------------------------------------------------------------------


def machine_section(machine: dict[str, Any]) -> list[str]:
    versions = ", ".join(f"{k} {v}" for k, v in machine["versions"].items())
    return [
        f"## Benchmarks ({machine['mode']} mode), {machine['date']}",
        "",
        f"{machine['platform']}; {machine['cpu_count']} CPUs ({machine['cpus_usable']} usable); "
        f"Python {machine['python']}; backend `{machine['backend']}`, device "
        f"`{machine['device_kind']}` x{machine['device_count']}; {versions}.",
        "",
    ]


def _real_ratio(real: dict[str, Any], model: str, op: str, ref: str) -> str:
    ratio = real["models"].get(model, {}).get("ratios", {}).get(op, {}).get(ref)
    return f"{ratio['median']:.2f}x" if ratio else "-"


PARTITIONED_MARK = "†"  # the fair twin partitioned once (plain jax.jit refuses it)
SCALE_MARK = "‡"  # beside it, the fair twin configured otherwise, for scale


def _fair_twin_ratio(
    real: dict[str, Any], model: str, op: str
) -> tuple[dict[str, Any] | None, str]:
    """Autostatic's ratio to the fair twin on `op`, and its mark: where plain `jax.jit`
    refuses the twin, the dispatch ratio is against the twin partitioned once
    (`dispatch_partitioned`), marked `PARTITIONED_MARK`."""
    ratios = real["models"].get(model, {}).get("ratios", {})
    ratio = ratios.get(op, {}).get("eqx-static")
    if ratio is None and op == "dispatch":
        ratio = ratios.get("dispatch_partitioned", {}).get("eqx-static")
        return ratio, PARTITIONED_MARK if ratio else ""
    return ratio, ""


def _step_time_ratio(training: dict[str, Any], model: str, ref: str) -> float | None:
    """Time per training step of autostatic / `ref`, paired per round: the inverse of
    the median paired throughput ratio (exactly the median of the inverses for an odd
    number of rounds; for an even number, within the two middle ratios)."""
    entry = training.get(model, {}).get("variants", {}).get(AUTO_JIT, {})
    r = entry.get("throughput_ratios", {}).get(ref)
    if not r or not r.get("median"):
        return None
    return 1.0 / r["median"]


def _checkpoint_speeds(ser: dict[str, Any] | None) -> list[tuple[str, float]]:
    """(label, ours / Equinox's speed) pairs of the serialisation section, if any."""
    results = (ser or {}).get("results")
    if not isinstance(results, dict):
        return []
    ratios = results.get("ratios")
    if isinstance(ratios, dict):
        speeds = [
            (k.removesuffix("_speed").replace("_", " "), float(v))
            for k, v in ratios.items()
            if k.endswith("_speed") and isinstance(v, (int, float))
        ]
        if speeds:
            return speeds
    found = results.get("targets")
    return [
        (str(t.get("target", "?")), float(t["value"]))
        for t in (found if isinstance(found, list) else [])
        if isinstance(t, dict) and isinstance(t.get("value"), (int, float))
    ]


def _display_path(path: Any) -> str:
    """A path relative to the working directory when it lies below it, else absolute."""
    text = os.path.abspath(str(path))
    rel = os.path.relpath(text)
    return text if rel.startswith("..") else rel


# The operations the verdict speaks of, in the words a user reads.
VERDICT_OPS: tuple[tuple[str, str], ...] = (
    ("dispatch", "a `jax.jit` call's dispatch"),
    ("flatten", "flattening a model"),
    ("treedef_eq", "comparing treedefs (`jax.jit`'s cache check)"),
    ("unflatten_read", "unflattening a model and reading every field"),
    ("build", "building a model around made layers"),
)
SAME_WITHIN = 1.05  # a ratio within this factor of 1 counts as the same speed


SPEED_GROUPS = (
    "Faster",
    "Faster or the same",
    "The same",
    "Mixed",
    "Slower or the same",
    "Slower",
)


def _speed_group(ratios: list[float]) -> str:
    """Where time ratios (below 1 is faster) put an operation, judged on every model."""
    faster, slower = 1 / SAME_WITHIN, SAME_WITHIN
    if max(ratios) < faster:
        return "Faster"
    if min(ratios) > slower:
        return "Slower"
    if max(ratios) <= slower:
        return "Faster or the same" if min(ratios) < faster else "The same"
    return "Slower or the same" if min(ratios) >= faster else "Mixed"


def _span(values: list[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:.2f}x" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}-{high:.2f}x"


def _verdict_claims(results: dict[str, Any]) -> list[tuple[str, list[float], str]]:
    """(what, time ratios vs the fair twin, the same vs `eqx.filter_jit` in words),
    for every operation measured on the real models and the training step."""
    claims = []
    real, training = results.get("real_models"), results.get("training")
    if real:
        models = list(real["models"])
        for op, what in VERDICT_OPS:
            fair = [
                r["median"] for m in models if (r := _fair_twin_ratio(real, m, op)[0])
            ]
            filtered = [
                r["median"]
                for m in models
                if (r := real["models"][m]["ratios"].get(op, {}).get("eqx-filter"))
            ]
            if fair:
                where = f"{', '.join(models)}"
                versus = f"{_span(filtered)} under `eqx.filter_jit`" if filtered else ""
                claims.append((what, fair, f"{versus}; on {where}"))
    if training:
        models = list(training)
        fair = [
            v for m in models if (v := _step_time_ratio(training, m, EQX_STATIC_JIT))
        ]
        filtered = [
            v for m in models if (v := _step_time_ratio(training, m, EQX_FILTER_FILTER))
        ]
        if fair:
            versus = f"{_span(filtered)} under `eqx.filter_jit`" if filtered else ""
            claims.insert(
                0, ("a training step", fair, f"{versus}; on {', '.join(models)}")
            )
    return claims


def verdict_section(results: dict[str, Any]) -> list[str]:
    """The first thing a reader sees: in plain words, what AutoModule does faster and
    slower than eqx.Module, by how much, where, and when switching pays."""
    claims = _verdict_claims(results)
    if not claims:
        return []
    groups: dict[str, list[str]] = {}
    for what, fair, rest in claims:
        entry = f"{what}: {_span(fair)} the fair twin's time ({rest})"
        groups.setdefault(_speed_group(fair), []).append(entry)
    lines = [
        "### Verdict",
        "",
        "Time ratios of AutoModule under plain `jax.jit`, paired per round (below 1 is "
        "faster): against the fair twin (eqx.Module with its non-array fields marked "
        "static, the same code under `jax.jit`) and against what Equinox users run "
        "(eqx.Module without markers under `eqx.filter_jit`).",
        "",
    ]
    for group in SPEED_GROUPS:
        if group in groups:
            lines.append(f"* **{group}**")
            lines += [f"  * {entry}" for entry in groups[group]]
    lines += [
        "",
        f"The same: within {SAME_WITHIN:.2f}x of 1 on every model; mixed: faster on "
        "some models, slower on others.",
    ]
    lines += [
        "",
        "When switching pays: the slower operations run when Python builds or takes "
        "apart a model (once per model, and once per trace where library code builds "
        "modules inside a jitted function); the faster ones run on every compiled call. "
        "A program that calls its models more often than it builds them gains; one "
        "that rebuilds models in a Python loop outside `jax.jit` pays the build ratio "
        "each time. A Python float or int that changes between calls is static and "
        "retraces: store it as an array.",
        "",
    ]
    return lines


def summary_section(results: dict[str, Any]) -> list[str]:
    """The short table a user reads first: AutoModule against both baselines (the fair
    twin: eqx.Module with static fields under `jax.jit`, the same code; and what Equinox
    users run: eqx.Module without markers under `eqx.filter_jit`), where we are slower,
    the retracing differences, checkpoint speed, the wall time and the files written."""
    real, training = results.get("real_models"), results.get("training")
    tree_ops = results.get("tree_ops") or {}
    contrasts = (results.get("retracing") or {}).get("contrasts")
    lines = [
        "### Summary: AutoModule vs eqx.Module (time ratios of AutoModule, paired per "
        "round; < 1 is faster)",
    ]
    rows: list[list[str]] = []
    slower: dict[str, list[str]] = {}  # "<op> on <model>" -> ["1.20x vs fair twin"]
    for_scale: list[str] = []  # the fair twin configured otherwise (real models)

    def note_slower(label: str, where: str, ref: str, value: float | None) -> None:
        if value is not None and value > 1.05:
            entries = slower.setdefault(f"{label} on {where}", [])
            entry = f"{value:.2f}x vs {ref}"
            if entry not in entries:
                entries.append(entry)

    if real:
        models = list(real["models"])
        for op, label in (
            ("flatten", "flatten"),
            ("unflatten_read", "unflatten + read every field"),
            ("dispatch", "jit dispatch"),
            ("treedef_eq", "treedef =="),
            ("build", "build (around made layers)"),
        ):
            cells = []
            for m in models:
                ratio, mark = _fair_twin_ratio(real, m, op)
                cells.append(f"{ratio['median']:.2f}x{mark}" if ratio else "-")
                for variant in _real_variants(real["models"][m]):
                    r = real["models"][m]["ratios"].get(op, {}).get(variant)
                    if r:
                        cells[-1] += SCALE_MARK
                        for_scale.append(
                            f"{label} on {m}: {r['median']:.2f}x vs `{variant}`"
                            + (
                                f" ({real['variant_notes'][variant]})"
                                if variant in real.get("variant_notes", {})
                                else ""
                            )
                        )
            fair = " / ".join(cells)
            filt = " / ".join(_real_ratio(real, m, op, "eqx-filter") for m in models)
            rows.append([f"{label} ({' / '.join(models)})", fair, filt])
            for m in models:
                fair, _ = _fair_twin_ratio(real, m, op)
                filtered = real["models"][m].get("ratios", {}).get(op, {})
                for r, name in (
                    (fair, "fair twin"),
                    (filtered.get("eqx-filter"), "filter_jit"),
                ):
                    note_slower(label, m, name, r and r["median"])
    elif tree_ops:  # no real models in this run: the MLP the targets are read on
        n, _ = _pick_mlp(int(k.split("-")[1]) for k in tree_ops if k.startswith("mlp-"))
        res = tree_ops.get(f"mlp-{n}", {})
        for op, label in (
            ("flatten", "flatten"),
            ("unflatten_read", "unflatten + read all"),
        ):
            cells = []
            for ref, name in (
                ("eqx-static", "fair twin"),
                ("eqx-filter", "filter_jit"),
            ):
                r = res.get("ratios", {}).get(ref, {}).get("autostatic", {}).get(op)
                cells.append(fmt_ratio(r))
                note_slower(label, f"mlp-{n}", name, r and r["median"])
            rows.append([f"{label} (mlp-{n})", *cells])
        disp = res.get("dispatch_us", {}).get(AUTO_JIT, {}).get("ratios", {})
        cells = []
        for ref, name in (
            (EQX_STATIC_JIT, "fair twin"),
            (EQX_FILTER_FILTER, "filter_jit"),
        ):
            cells.append(fmt_ratio(disp.get(ref)))
            note_slower(
                "jit dispatch", f"mlp-{n}", name, disp.get(ref, {}).get("median")
            )
        rows.append([f"jit dispatch (mlp-{n})", *cells])
    # Every other tree-op comparison that goes against us (the dict-layer models,
    # kept as the floor view), so that none is left deep in the tables.
    for model, res in tree_ops.items():
        for ref, name in (("eqx-static", "fair twin"), ("eqx-filter", "filter_jit")):
            ours = res.get("ratios", {}).get(ref, {}).get("autostatic", {})
            for op, r in ours.items():
                label = OP_LABELS.get(op, op)
                note_slower(label, f"{model} (dict layers)", name, r["median"])
    if training:
        models = list(training)
        cells = []
        for ref, name in (
            (EQX_STATIC_JIT, "fair twin"),
            (EQX_FILTER_FILTER, "filter_jit"),
        ):
            values = [_step_time_ratio(training, m, ref) for m in models]
            cells.append(" / ".join("-" if v is None else f"{v:.2f}x" for v in values))
            for m, v in zip(models, values):
                note_slower("training step", m, name, v)
        rows.append([f"training step time ({' / '.join(models)})", *cells])
    speeds = _checkpoint_speeds(results.get("serialisation"))
    for label, v in speeds:  # a speed ratio: slower is below 1
        if v < 1 / 1.05:
            slower.setdefault(f"checkpoint {label}", []).append(
                f"{v:.2f}x Equinox's speed"
            )
    if rows:
        lines.append("")
        lines += table(
            [
                "",
                "vs the fair twin: static fields marked, `jax.jit`, same code",
                "vs what Equinox users run: no markers, `eqx.filter_jit`",
            ],
            rows,
        )
    if rows:
        lines += [
            "",
            f"{PARTITIONED_MARK}: plain `jax.jit` refuses the fair twin (a function field "
            "Equinox does not mark static), so against it partitioned once by "
            "`eqx.partition`, `jax.jit` over its arrays (Equinox's route to plain "
            "`jax.jit`); -: not measured.",
        ]
    if for_scale:
        lines += ["", f"{SCALE_MARK}: for scale, the fair twin configured otherwise:"]
        lines += [f"* {x}" for x in for_scale]
    if rows or slower:
        lines += ["", "Where we are slower (> 1.05x, either baseline):"]
        lines += [f"* {k}: {', '.join(v)}" for k, v in slower.items()] or [
            "* nowhere in these rows"
        ]
    if contrasts:
        lines += [
            "",
            f"Retracing, traces over {contrasts['calls']} calls (AutoModule vs ...; "
            "the fair twin marks static what each scenario says, named here):",
        ]
        for ref, name in (
            (EQX_STATIC_JIT, "the fair twin"),
            (EQX_FILTER_FILTER, "eqx.filter_jit"),
        ):
            by: dict[str, list[str]] = {"better": [], "worse": []}
            for scenario, sc in contrasts["scenarios"].items():
                verdict = retrace_verdict(sc, ref)
                if verdict in by:
                    counts = sc["counts"]
                    marked = sc.get("eqx_static_fields")
                    marks = ""
                    if ref == EQX_STATIC_JIT and marked is not None:
                        named = ", ".join(f"`{f}`" for f in marked)
                        marks = f"; twin marks {named or 'nothing'}"
                        marks += " static" if marked else ""
                    by[verdict].append(
                        f"`{scenario}` ({_retrace_text(counts.get(AUTO_JIT))} vs "
                        f"{_retrace_text(counts.get(ref))}{marks})"
                    )
            lines.append(
                f"* vs {name}: fewer (or it fails) in {', '.join(by['better']) or 'none'}; "
                f"MORE in {', '.join(by['worse']) or 'none'}; the same in the other "
                f"{len(contrasts['scenarios']) - len(by['better']) - len(by['worse'])}."
            )
        lines += [
            "",
            "A changing Python float or int is static here, so it retraces: store it as "
            "an array.",
        ]
    if speeds:
        lines += [
            "",
            "Checkpoint speed, ours / Equinox's (> 1 is faster): "
            + ", ".join(f"{label} {v:.2f}x" for label, v in speeds)
            + ".",
        ]
    lines += ["", f"Wall time: {results.get('wall_s', float('nan')):.1f} s."]
    files = results.get("files") or []
    if files:
        lines += ["", f"Files written ({len(files)}):"]
        lines += [f"  {_display_path(f)}" for f in files]
    if results.get("plots_note"):
        lines += ["", f"No plots: {results['plots_note']}."]
    return lines


def render(results: dict[str, Any]) -> str:
    lines = machine_section(results["machine"])
    lines += verdict_section(results)
    if results.get("targets"):
        lines += targets_section(results["targets"])
    if results.get("tree_ops"):
        lines += overview_section(results["tree_ops"])
        for res in results["tree_ops"].values():
            lines += tree_ops_section(res)
    if results.get("async_dispatch"):
        lines += async_section(results["async_dispatch"])
    if results.get("retracing"):
        lines += retracing_section(results["retracing"])
    if results.get("first_call"):
        lines += first_call_section(results["first_call"])
    if results.get("first_call_forward"):
        lines += first_call_section(results["first_call_forward"])
    if results.get("training"):
        lines += training_section(results["training"])
    if results.get("serialisation"):
        lines += serialisation_section(results["serialisation"])
    if results.get("real_models"):
        lines += real_models_section(results["real_models"])
    if results.get("errors"):
        lines += (
            ["### Errors", ""]
            + [f"* {e['section']}: {e['error']}" for e in results["errors"]]
            + [""]
        )
    lines += summary_section(results)
    return "\n".join(lines) + "\n"


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return repr(x)


def write_json(results: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(_jsonable(results), indent=1) + "\n")


def plot(results: dict[str, Any], out: Path) -> list[str]:
    """Writes the PNGs of the sections that ran; returns their file names (none if
    matplotlib is missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    figures = (_overhead_plot(results, out, plt), _training_plot(results, out, plt))
    return [name for name in figures if name]


# One colour per implementation in every plot; the jit used is the line or hatch style.
IMPL_COLOURS: dict[str, str] = {
    "autostatic": "tab:blue",
    "eqx-static": "tab:orange",
    "eqx-filter": "tab:green",
    "dataclass": "tab:purple",
    "dict": "black",
    M.PYNODE: "grey",
}
JIT_LINES: dict[str, str] = {M.JAX_JIT: "-", M.FILTER_JIT: "--"}
JIT_HATCHES: dict[str, str] = {M.JAX_JIT: "", M.FILTER_JIT: "//"}


def _errorbar(ax: Any, pts: list[tuple[int, dict[str, float]]], **style: Any) -> None:
    """Medians of `pts` ((x, {median, q1, q3})) with interquartile bars."""
    ax.errorbar(
        [x for x, _ in pts],
        [e["median"] for _, e in pts],
        yerr=[
            [e["median"] - e["q1"] for _, e in pts],
            [e["q3"] - e["median"] for _, e in pts],
        ],
        capsize=2,
        marker="o",
        **style,
    )


def _overhead_plot(results: dict[str, Any], out: Path, plt: Any) -> str | None:
    """Top row: medians per operation against MLP depth; bottom row: the paired
    ratios to the fair twin that the tables use. Lower is better throughout."""
    tree_ops = results.get("tree_ops", {})
    mlps = sorted(
        (int(k.split("-")[1]), v) for k, v in tree_ops.items() if k.startswith("mlp-")
    )
    if not mlps:  # not run (`--only`)
        return None
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5), sharex=True)
    for column, op in enumerate(("flatten", "unflatten")):
        for impl in M.IMPLS + (M.PYNODE,):
            style = {"color": IMPL_COLOURS[impl], "label": impl}
            if impl == M.PYNODE:
                style |= {"linestyle": ":", "label": f"{impl} (floor)"}
            times = [(n, r["ops_us"][impl][op]) for n, r in mlps if impl in r["ops_us"]]
            if times:
                _errorbar(axes[0, column], times, **style)
            ratios = [
                (n, r["ratios"]["eqx-static"][impl][op])
                for n, r in mlps
                if op in r.get("ratios", {}).get("eqx-static", {}).get(impl, {})
            ]
            if ratios:
                _errorbar(axes[1, column], ratios, **style)
        axes[0, column].set_title(f"tree_{op}: µs, lower is better")
        axes[1, column].set_title(f"tree_{op}: time / fair twin's, lower is better")
    for impl, jit in M.VARIANTS:
        name = M.variant_name(impl, jit)
        style = {
            "color": IMPL_COLOURS[impl],
            "linestyle": JIT_LINES[jit],
            "label": name,
        }
        entries = [(n, r["dispatch_us"].get(name, {})) for n, r in mlps]
        times = [(n, e) for n, e in entries if "median" in e]
        if times:
            _errorbar(axes[0, 2], times, **style)
        ratios = [
            (n, e["ratios"][EQX_STATIC_JIT])
            for n, e in entries
            if EQX_STATIC_JIT in e.get("ratios", {})
        ]
        if impl == "eqx-static" and jit == M.JAX_JIT:
            ratios = [(n, {"median": 1.0, "q1": 1.0, "q3": 1.0}) for n, _ in times]
        if ratios:
            _errorbar(axes[1, 2], ratios, **style)
    axes[0, 2].set_title("jit dispatch (compiled, blocked): µs, lower is better")
    axes[1, 2].set_title("jit dispatch: time / fair twin's, lower is better")
    for ax in axes[0]:
        ax.set_ylabel("µs (median, IQR bars)")
        ax.set_yscale("log")
    for ax in axes[1]:
        ax.axhline(1.0, color="tab:orange", linewidth=0.8)
        ax.set_ylabel("ratio, paired per round (median, IQR bars)")
        ax.set_yscale("log")
        ax.set_xlabel("MLP layers N")
    for ax in axes.flat:
        ax.set_xscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(
        f"Pytree overhead vs depth ({results['machine']['backend']}, "
        f"{results['machine']['mode']} mode); fair twin: eqx-static under jax.jit"
    )
    fig.tight_layout()
    fig.savefig(out / "overhead_vs_n.png", dpi=110)
    plt.close(fig)
    return "overhead_vs_n.png"


def _training_plot(results: dict[str, Any], out: Path, plt: Any) -> str | None:
    """Left: throughput paired per round against the fair twin, the ratio the tables
    use; right: the raw medians, which come from different rounds and so can order
    two close variants differently. Higher is better in both."""
    training = results.get("training", {})
    if not training:  # not run (`--only`)
        return None
    fig, (paired, raw) = plt.subplots(1, 2, figsize=(14, 4.8))
    models = list(training)
    variants = _train_variants()
    width = 0.8 / max(1, len(variants))
    for i, (impl, jit) in enumerate(variants):
        name = M.variant_name(impl, jit)
        style = {
            "color": IMPL_COLOURS[impl],
            "hatch": JIT_HATCHES[jit],
            "edgecolor": "white" if not JIT_HATCHES[jit] else "black",
            "label": name,
            "capsize": 2,
            "ecolor": "dimgrey",
        }
        for ax, values in (
            (paired, [_paired_throughput(training, m, name) for m in models]),
            (raw, [_raw_throughput(training, m, name) for m in models]),
        ):
            bars = [(j + i * width, v) for j, v in enumerate(values) if v]
            if bars:
                ax.bar(
                    [x for x, _ in bars],
                    [v[0] for _, v in bars],
                    width,
                    yerr=[[v[1] for _, v in bars], [v[2] for _, v in bars]],
                    **style,
                )
    ticks = [j + width * (len(variants) - 1) / 2 for j in range(len(models))]
    paired.axhline(1.0, color="tab:orange", linewidth=0.8)
    paired.set_ylabel("steps/s / fair twin's, paired per round")
    paired.set_title(
        "Throughput vs the fair twin (the tables' ratio), higher is better"
    )
    raw.set_ylabel("training steps / s (median of rounds)")
    raw.set_title("Raw throughput, higher is better (medians of separate rounds)")
    for ax in (paired, raw):
        ax.set_xticks(ticks, models)
        ax.legend(fontsize=7)
        ax.grid(True, axis="y", which="both", alpha=0.3)
    fig.suptitle(
        f"Training-step throughput ({results['machine']['backend']}, "
        f"{results['machine']['mode']} mode); IQR bars"
    )
    fig.tight_layout()
    fig.savefig(out / "training_throughput.png", dpi=110)
    plt.close(fig)
    return "training_throughput.png"


Bar = tuple[float, float, float]  # height, and how far the IQR bar reaches below, above


def _paired_throughput(training: dict[str, Any], model: str, name: str) -> Bar | None:
    """`name`'s throughput over the fair twin's, paired per round."""
    entry = training[model]["variants"].get(name, {})
    r = entry.get("throughput_ratios", {}).get(EQX_STATIC_JIT)
    if not r:
        return None
    return r["median"], r["median"] - r["q1"], r["q3"] - r["median"]


def _raw_throughput(training: dict[str, Any], model: str, name: str) -> Bar | None:
    v = training[model]["variants"].get(name, {})
    if "steps_per_s" not in v:
        return None
    lo, hi = v["ms_iqr"]  # milliseconds per step: the fast end is the high throughput
    return v["steps_per_s"], v["steps_per_s"] - 1e3 / hi, 1e3 / lo - v["steps_per_s"]


def _train_variants() -> tuple[tuple[str, str], ...]:
    from .scenarios import TRAIN_VARIANTS

    return TRAIN_VARIANTS


def results_dir(backend: str) -> Path:
    """The committed results (`python -m benchmarks --write-results`)."""
    return Path(os.path.dirname(os.path.abspath(__file__))) / "results" / backend


def default_out_dir(backend: str) -> Path:
    """Where an ad-hoc run writes: `benchmarks/out/<backend>/`, ignored by git."""
    return Path(os.path.dirname(os.path.abspath(__file__))) / "out" / backend
