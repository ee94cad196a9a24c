"""The retracing section of the report: the contrasts where AutoModule and eqx.Module
retrace differently, with the verdict of each, then the scripted scenarios on the MLP.
Its targets are in `targets`."""

from ..schema import Contrasts, ContrastScenario, Retracing, TraceCount
from .format import AUTO_JIT, EQX_FILTER_FILTER, FAIR_TWIN, ref_label, table


def _retrace_rank(entry: TraceCount | None) -> tuple[int, float] | None:
    """Orders outcomes: fewer traces is better; a stale result is worse than any count,
    and a failure worse still."""
    if not entry:
        return None
    if "error" in entry:
        return (2, 0.0)
    if entry.get("stale"):
        return (1, 0.0)
    return (0, float(entry["count"]))


def retrace_text(entry: TraceCount | None) -> str:
    """A trace count as a cell: the count (`stale` if so), `fails` or `-`."""
    if not entry:
        return "-"
    if "error" in entry:
        return "fails"
    return f"{entry['count']}" + (" stale" if entry.get("stale") else "")


def retrace_verdict(scenario: ContrastScenario, ref: str) -> str:
    """`better`, `worse` or `same`: AutoModule (`jax.jit`) against `ref` in one
    contrast scenario (`-` if either is missing)."""
    ours = _retrace_rank(scenario["counts"].get(AUTO_JIT))
    theirs = _retrace_rank(scenario["counts"].get(ref))
    if ours is None or theirs is None:
        return "-"
    return "better" if ours < theirs else "worse" if ours > theirs else "same"


def _verdict_cell(scenario: ContrastScenario, ref: str) -> str:
    """`retrace_verdict` in a cell, with both counts where they differ."""
    verdict = retrace_verdict(scenario, ref)
    pair = (
        f"{retrace_text(scenario['counts'].get(AUTO_JIT))} vs "
        f"{retrace_text(scenario['counts'].get(ref))}"
    )
    if verdict == "better":
        return f"**AutoModule better** ({pair})"
    if verdict == "worse":
        return f"**AutoModule WORSE** ({pair})"
    return verdict


def _contrast_cells(
    sc: ContrastScenario, variants: list[str]
) -> tuple[list[str], dict[str, list[str]]]:
    """A contrast scenario's trace counts per variant, and its problems (failures,
    warnings, stale results), each with the variants that have it."""
    cells = []
    problems: dict[str, list[str]] = {}
    for v in variants:
        entry = sc["counts"].get(v)
        text = retrace_text(entry)
        for warning in (entry or {}).get("warnings", []):
            text += " (warns)"
            problems.setdefault(f"warns: {warning}", []).append(v)
            break
        if entry and "error" in entry:
            problems.setdefault(f"fails: {entry['error'][:160]}", []).append(v)
        if entry and entry.get("stale"):
            problems.setdefault("result STALE (the change was ignored)", []).append(v)
        cells.append(text)
    return cells, problems


def retrace_contrast_section(con: Contrasts) -> list[str]:
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
        cells, problems = _contrast_cells(sc, variants)
        rows.append(
            [f"`{name}`: {sc['description']}"]
            + cells
            + [
                _verdict_cell(sc, FAIR_TWIN),
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
        + [f"`{ref_label(v)}`" for v in variants]
        + [
            f"AutoModule vs {ref_label(FAIR_TWIN)}",
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


def _scripted_row(
    variant: str, row: dict[str, TraceCount], names: list[str]
) -> list[str]:
    """One variant's trace counts, with one note per distinct error."""
    cells = []
    errors: dict[str, list[str]] = {}
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
    return [f"`{variant}`"] + cells + ["; ".join(notes)]


def retracing_section(res: Retracing) -> list[str]:
    """The contrasts, then the scripted scenarios."""
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
    rows += [_scripted_row(v, row, names) for v, row in res["counts"].items()]
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
