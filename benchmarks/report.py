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
    for ref in ("eqx-static", "dict"):
        if not res["ratios"].get(ref):
            continue
        lines += ["", f"Ratios vs `{ref}` (paired per round; < 1 = faster):", ""]
        rows = [
            [f"`{impl}`"] + [fmt_ratio(r.get(op)) for op in ops]
            for impl, r in res["ratios"][ref].items()
        ]
        lines += table(["impl"] + [OP_LABELS[o] for o in ops], rows)
    lines += [
        "",
        "Dispatch of a compiled `lambda m: <one array> + 1`, µs/call (blocked):",
        "",
    ]
    refs = [DICT_JIT, EQX_STATIC_JIT, EQX_STATIC_FILTER, EQX_FILTER_FILTER]
    rows = []
    for name, entry in res["dispatch_us"].items():
        if "fails" in entry:
            rows.append(
                [f"`{name}`", f"**fails**: {entry['fails'][:120]}"] + [""] * len(refs)
            )
            continue
        rows.append(
            [f"`{name}`", fmt_stat_us(entry)]
            + [fmt_ratio(entry["ratios"].get(ref)) for ref in refs]
        )
    lines += table(["variant", "µs/call (IQR)"] + [f"vs {r}" for r in refs], rows)
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
        "### Overview: MLP overhead vs N, median µs (ratio vs `eqx-static` | vs `dict`)",
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
                rs = res["ratios"]["eqx-static"].get(impl, {}).get(op)
                rd = res["ratios"]["dict"].get(impl, {}).get(op)
                cells.append(
                    f"{fmt_time_us(stat['median'])} ({fmt_ratio(rs)} \\| {fmt_ratio(rd)})"
                )
            rows.append([f"`{impl}` {op}"] + cells)
    for impl, jit in M.VARIANTS:
        name = M.variant_name(impl, jit)
        cells = []
        for _, res in mlps:
            entry = res["dispatch_us"].get(name)
            if not entry or "fails" in entry:
                cells.append("fails" if entry else "-")
                continue
            cells.append(
                f"{fmt_time_us(entry['median'])} ({fmt_ratio(entry['ratios'].get(EQX_STATIC_FILTER if jit == M.FILTER_JIT else EQX_STATIC_JIT))}"
                f" \\| {fmt_ratio(entry['ratios'].get(DICT_JIT))})"
            )
        rows.append([f"`{name}` dispatch"] + cells)
    lines += table(header, rows)
    lines += [
        "",
        "Dispatch ratios: `jax.jit` rows vs `eqx-static / jax.jit`, `eqx.filter_jit` rows vs "
        "`eqx-static / eqx.filter_jit`; second ratio vs `dict / jax.jit`.",
        "",
    ]
    return lines


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
                [f"`{name}`", f"fails: {v['fails'][:100]}", "", "", "", "", "", ""]
            )
            continue
        rows.append(
            [
                f"`{name}`",
                f"{v['wall_ms_per_step']:.2f} ({v['wall_iqr_ms'][0]:.2f}–{v['wall_iqr_ms'][1]:.2f})",
                fmt_ratio(v.get(f"wall vs {EQX_STATIC_FILTER}")),
                f"{v['no_host_ms_per_step']:.2f}",
                f"{v['serial_ms_per_step']:.2f}",
                f"{v['ideal_ms_per_step']:.2f}",
                f"{v['hidden_ms_per_step']:.2f}",
                f"{100 * v['hidden_fraction']:.0f}% ({100 * v['hidden_fraction_iqr'][0]:.0f}–{100 * v['hidden_fraction_iqr'][1]:.0f}%)",
            ]
        )
    lines += table(
        [
            "variant",
            "wall ms/step (IQR)",
            f"wall vs {EQX_STATIC_FILTER}",
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
        "On the CPU backend the device is the host's own cores: the busy host loop takes a "
        "core from XLA, so less can be hidden than on a GPU/TPU (and on a loaded machine the "
        "overlap can come out negative).",
        "",
    ]
    return lines


def retracing_section(res: dict[str, Any]) -> list[str]:
    scen = res["scenarios"]
    names = list(scen)
    lines = [
        f"### Retracing (MLP depth {res['depth']}; traces per scenario, fresh jitted function each)",
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
                rows.append([n, f"`{name}`", f"fails: {v['fails'][:80]}", "", ""])
                continue
            rows.append(
                [
                    n,
                    f"`{name}`",
                    f"{v['median']:.1f} ({v['q1']:.1f}–{v['q3']:.1f})",
                    fmt_ratio(v.get("vs eqx-static / jax.jit"), iqr=True),
                    ", ".join(f"{s:.0f}" for s in v["samples_ms"]),
                ]
            )
    lines += table(
        [
            "N",
            "variant",
            "median ms (IQR)",
            "vs eqx-static / jax.jit (paired)",
            "samples",
        ],
        rows,
        "rlrrl",
    )
    return lines + [""]


def training_section(training: dict[str, Any]) -> list[str]:
    lines = ["### Training step (forward + grad + optax adam), steps/s", ""]
    rows = []
    for model, res in training.items():
        for name, v in res["variants"].items():
            if "fails" in v:
                rows.append(
                    [model, f"`{name}`", f"fails: {v['fails'][:80]}", "", "", "", ""]
                )
                continue
            r = v["throughput_ratios"]
            rows.append(
                [
                    model,
                    f"`{name}`",
                    f"{v['steps_per_s']:.0f}",
                    f"{v['ms_per_step']:.3f} ({v['ms_iqr'][0]:.3f}–{v['ms_iqr'][1]:.3f})",
                    fmt_ratio(r.get(EQX_STATIC_FILTER), iqr=True),
                    fmt_ratio(r.get(DICT_JIT)),
                    f"{v['first_call_s']:.2f}",
                ]
            )
    lines += table(
        [
            "model",
            "variant",
            "steps/s",
            "ms/step (IQR)",
            f"throughput vs {EQX_STATIC_FILTER}",
            f"throughput vs {DICT_JIT}",
            "first call s",
        ],
        rows,
        "llrrrrr",
    )
    return lines + [
        "",
        "Throughput ratios are paired per round; > 1 = more steps/s.",
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
    for op in ("flatten", "unflatten"):
        for ref, thr in (("eqx-static", 0.5), ("dict", 3.0)):
            r = res.get("ratios", {}).get(ref, {}).get("autostatic", {}).get(op)
            floor = res.get("ratios", {}).get(ref, {}).get(M.PYNODE, {}).get(op)
            floor_note = (
                f"for scale: a minimal Python-registered node ({M.PYNODE}) is {fmt_ratio(floor)} {ref}"
                if ref == "dict" and floor
                else ""
            )
            targets.append(
                _target(
                    f"{op} <= {thr}x {ref}",
                    r and r["median"],
                    "<=",
                    thr,
                    f"{fmt_ratio(r, iqr=True)}; autostatic {fmt_stat_us(res.get('ops_us', {}).get('autostatic', {}).get(op), True)}, "
                    f"{ref} {fmt_stat_us(res.get('ops_us', {}).get(ref, {}).get(op), True)}",
                    where,
                    "; ".join(x for x in (note, floor_note) if x),
                )
            )
    disp = res.get("dispatch_us", {}).get(AUTO_JIT, {})
    for ref, thr in ((EQX_FILTER_FILTER, 0.35), (DICT_JIT, 1.5)):
        r = disp.get("ratios", {}).get(ref)
        targets.append(
            _target(
                f"dispatch {AUTO_JIT} <= {thr}x {ref}",
                r and r["median"],
                "<=",
                thr,
                f"{fmt_ratio(r, iqr=True)}; autostatic {fmt_stat_us(disp, True) if 'median' in disp else '-'}, "
                f"ref {fmt_stat_us(res.get('dispatch_us', {}).get(ref), True)}",
                where,
                note,
            )
        )
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
    # Not a target in the brief (which names the MLP); shown for information.
    entry = tr.get("transformer", {}).get("variants", {}).get(AUTO_JIT, {})
    r = entry.get("throughput_ratios", {}).get(EQX_STATIC_FILTER)
    if r:
        t = _target(
            f"(info) training throughput {AUTO_JIT} >= {EQX_STATIC_FILTER}",
            r["median"],
            ">=",
            1.0,
            f"{fmt_ratio(r, iqr=True)}; {entry.get('steps_per_s', float('nan')):.0f} steps/s",
            "transformer",
            "information only: not one of the stated targets",
        )
        t["status"] = "info: " + t["status"]
        targets.append(t)
    _tag(targets, "training")
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
        floor = [
            f"{label} {fmt_time_us(res['ops_us'][op]['dict']['median'], True)} "
            f"(autostatic {fmt_ratio(res['ratios'][op].get('dict'), iqr=True)})"
            for op, label in real["ops"].items()
            if "dict" in res["ops_us"].get(op, {})
        ]
        if floor:
            notes.append(f"* {name}, `dict` floor: " + "; ".join(floor))
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

    for op, names, ref, thr, title in REAL_TARGETS:
        for name in names:
            value, text = detail(name, op, ref)
            targets.append(
                _target(
                    title or f"{labels[op]} <= {thr}x {ref}",
                    value,
                    "<=",
                    thr,
                    text,
                    f"real: {name}",
                )
            )
    # eqx.tree_at: not slower than the same (routed) call on the eqx-static model,
    # the worst of the four models.
    for op in ("tree_at_array", "tree_at_layer"):
        per_model = {name: detail(name, op, "eqx-static") for name in models}
        measured = [(v, n) for n, (v, _) in per_model.items() if v is not None]
        worst = max(measured, default=(None, "-"))
        targets.append(
            _target(
                f"{labels[op]} <= 1.1x eqx-static (worst model)",
                worst[0],
                "<=",
                1.1,
                "; ".join(
                    f"{n} {fmt_ratio(models[n]['ratios'][op].get('eqx-static'))}"
                    for n in per_model
                ),
                f"real: {worst[1]}",
                "stated as <= 1.0x; 1.1x allows for noise",
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


def _training_ratio(training: dict[str, Any], model: str, ref: str) -> str:
    """Steps per second of autostatic / `ref` (medians of the same run)."""
    variants = training.get(model, {}).get("variants", {})
    ours, theirs = variants.get("autostatic / jax.jit"), variants.get(ref)
    if not ours or not theirs or not theirs.get("steps_per_s"):
        return "-"
    return f"{ours['steps_per_s'] / theirs['steps_per_s']:.2f}x"


def summary_section(results: dict[str, Any]) -> list[str]:
    """The short table a user reads first: AutoModule against both baselines (the fair
    twin: eqx.Module with static fields under `jax.jit`; and what Equinox users run:
    `eqx.filter_jit`), on the models people write, and where we are slower."""
    real, training = results.get("real_models"), results.get("training")
    if not real and not training:
        return []
    lines = [
        "### Summary: AutoModule vs eqx.Module (time ratios, < 1 is faster; "
        "training: steps/s, > 1 is faster)",
        "",
        "| | fair twin: static fields, `jax.jit` | `eqx.filter_jit` |",
        "|---|---:|---:|",
    ]
    slower = []
    if real:
        models = [
            m
            for m in ("linear-256", "transformer", "mixed-stack")
            if m in real["models"]
        ]
        for op, label in (
            ("flatten", "flatten"),
            ("unflatten_read", "unflatten + read every field"),
            ("dispatch", "jit dispatch"),
            ("treedef_eq", "treedef =="),
            ("build", "build (around made layers)"),
        ):
            fair = " / ".join(_real_ratio(real, m, op, "eqx-static") for m in models)
            filt = " / ".join(_real_ratio(real, m, op, "eqx-filter") for m in models)
            lines.append(f"| {label} ({' / '.join(models)}) | {fair} | {filt} |")
            for m in models:
                ratio = (
                    real["models"][m].get("ratios", {}).get(op, {}).get("eqx-static")
                )
                if ratio and ratio["median"] > 1.05:
                    slower.append(f"{label} on {m} {ratio['median']:.2f}x")
    if training:
        for model in ("mlp-32", "transformer"):
            if model in training:
                fair = _training_ratio(training, model, "eqx-static / jax.jit")
                filt = _training_ratio(training, model, "eqx-static / eqx.filter_jit")
                lines.append(
                    f"| training step throughput ({model}) | {fair} | {filt} |"
                )
    lines += [
        "",
        "-: not measurable (the fair twin cannot be passed to plain `jax.jit`: a "
        "function field Equinox does not mark static). "
        "Where we are slower than the fair twin: "
        + ("; ".join(slower) if slower else "nowhere in these rows")
        + ". A changing Python float is static here and retraces (store it as an "
        "array); see the retracing table.",
        "",
    ]
    return lines


def render(results: dict[str, Any]) -> str:
    lines = machine_section(results["machine"])
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
    lines.append(f"Wall time: {results.get('wall_s', float('nan')):.1f} s")
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


def _overhead_plot(results: dict[str, Any], out: Path, plt: Any) -> str | None:
    tree_ops = results.get("tree_ops", {})
    mlps = sorted(
        (int(k.split("-")[1]), v) for k, v in tree_ops.items() if k.startswith("mlp-")
    )
    if not mlps:  # not run (`--only`)
        return None
    backend = results["machine"]["backend"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, op in zip(axes[:2], ("flatten", "unflatten")):
        for impl in M.IMPLS + (M.PYNODE,):
            pts = [(n, r["ops_us"][impl][op]) for n, r in mlps if impl in r["ops_us"]]
            if pts:
                floor = impl == M.PYNODE
                ax.errorbar(
                    [p[0] for p in pts],
                    [p[1]["median"] for p in pts],
                    yerr=[
                        [p[1]["median"] - p[1]["q1"] for p in pts],
                        [p[1]["q3"] - p[1]["median"] for p in pts],
                    ],
                    marker="." if floor else "o",
                    label=f"{impl} (floor)" if floor else impl,
                    capsize=2,
                    linestyle=":" if floor else "-",
                    color="grey" if floor else None,
                )
        ax.set_title(f"tree_{op}")
    ax = axes[2]
    for impl, jit in M.VARIANTS:
        name = M.variant_name(impl, jit)
        pts = [(n, r["dispatch_us"].get(name, {})) for n, r in mlps]
        pts = [(n, e) for n, e in pts if "median" in e]
        if pts:
            ax.plot(
                [p[0] for p in pts],
                [p[1]["median"] for p in pts],
                marker="o",
                linestyle="--" if jit == M.FILTER_JIT else "-",
                label=name,
            )
    ax.set_title("dispatch (compiled, blocked)")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("MLP layers N")
        ax.set_ylabel("µs (median, IQR bars)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(
        f"Pytree overhead vs depth ({backend}, {results['machine']['mode']} mode)"
    )
    fig.tight_layout()
    fig.savefig(out / "overhead_vs_n.png", dpi=110)
    plt.close(fig)
    return "overhead_vs_n.png"


def _training_plot(results: dict[str, Any], out: Path, plt: Any) -> str | None:
    training = results.get("training", {})
    if not training:  # not run (`--only`)
        return None
    backend = results["machine"]["backend"]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    models = list(training)
    names = [M.variant_name(*v) for v in _train_variants()]
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        xs, ys, errs = [], [], []
        for j, model in enumerate(models):
            v = training[model]["variants"].get(name, {})
            if "steps_per_s" in v:
                xs.append(j + i * width)
                ys.append(v["steps_per_s"])
                lo, hi = v["ms_iqr"]
                errs.append((v["steps_per_s"] - 1e3 / hi, 1e3 / lo - v["steps_per_s"]))
        if xs:
            ax.bar(
                xs,
                ys,
                width,
                label=name,
                yerr=[[e[0] for e in errs], [e[1] for e in errs]],
                capsize=2,
            )
    ax.set_xticks(
        [j + width * (len(names) - 1) / 2 for j in range(len(models))], models
    )
    ax.set_ylabel("training steps / s (median, IQR bars)")
    ax.set_title(
        f"Training-step throughput ({backend}, {results['machine']['mode']} mode)"
    )
    ax.legend(fontsize=7)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "training_throughput.png", dpi=110)
    plt.close(fig)
    return "training_throughput.png"


def _train_variants() -> tuple[tuple[str, str], ...]:
    from .scenarios import TRAIN_VARIANTS

    return TRAIN_VARIANTS


def results_dir(backend: str) -> Path:
    """The committed results (`python -m benchmarks --write-results`)."""
    return Path(os.path.dirname(os.path.abspath(__file__))) / "results" / backend


def default_out_dir(backend: str) -> Path:
    """Where an ad-hoc run writes: `benchmarks/out/<backend>/`, ignored by git."""
    return Path(os.path.dirname(os.path.abspath(__file__))) / "out" / backend
