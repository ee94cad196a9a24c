"""Renders the ecosystem results (`results.json`) as `report.md`."""

from typing import Any

from .run import ALL_MODES, CAUSES, items_reached, LIBRARIES

_REASONS = {name: reason for name, _, reason in CAUSES} | {
    "other": "not matched by a known cause; the message says what failed"
}


# What is known of particular failures, by a piece of their node id.
EXPLAINED: dict[str, str] = {}


# Why a library is not in the results, where a run was tried and could not finish.
NOT_RUN: dict[str, str] = {}
# The targets: the share of baseline-passing items that pass in each mode.
TARGETS = {"b": 1.0, "b2": 0.95}


def _explained(node: str) -> str:
    return next((text for key, text in EXPLAINED.items() if key in node), "")


def _failures_beyond_baseline(outcomes: list[dict[str, Any]]) -> dict[str, dict]:
    baseline = next((o for o in outcomes if o["mode"] == "baseline"), None)
    failed_at_baseline = set(baseline["failures"]) if baseline else set()
    return {
        o["mode"]: {
            node: why
            for node, why in o["failures"].items()
            if node not in failed_at_baseline
        }
        for o in outcomes
        if o["mode"] != "baseline"
    }


def _targets(results: dict[str, Any]) -> list[str]:
    """MET / MISSED per library and mode: the share of baseline-passing items that
    pass, against `TARGETS`."""
    lines = [
        "",
        "Targets (share of the items passing at baseline that pass in the mode):",
        "",
    ]
    for library, result in results.items():
        outcomes = result["outcomes"]
        baseline = next((o for o in outcomes if o["mode"] == "baseline"), None)
        if not baseline or not baseline["passed"]:
            continue
        beyond = _failures_beyond_baseline(outcomes)
        for mode, threshold in TARGETS.items():
            if mode not in beyond:
                continue
            kept = (baseline["passed"] - len(beyond[mode])) / baseline["passed"]
            status = "MET" if kept >= threshold else "MISSED"
            lines.append(
                f"- {library}, {mode}: **{status}**, {100 * kept:.1f}% "
                f"(target >= {100 * threshold:.0f}%; {len(beyond[mode])} new failures)"
            )
    return lines


def _results_table(results: dict[str, Any]) -> list[str]:
    """The heading, then a row per library and mode."""
    lines = [
        "# Ecosystem report: diffrax, lineax, optimistix and quax with their Modules "
        "auto-static",
        "",
        "Made by `python -m ecosystem` (see `ecosystem/run.py` for what each mode does).",
        "Each library's own tests at the tag of the installed version; every K-th item of "
        "each file (K: the densest sample run; the runs merged are listed below). "
        "*new failures*: items that pass at baseline and fail in the mode.",
        "",
        "| library | items (of collected) | mode | passed | failed | skipped | new failures | baseline-passing kept | time |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for library, result in results.items():
        outcomes = result["outcomes"]
        beyond = _failures_beyond_baseline(outcomes)
        baseline = next((o for o in outcomes if o["mode"] == "baseline"), None)
        base_passed = baseline["passed"] if baseline else None
        for o in outcomes:
            new = beyond.get(o["mode"])
            kept = (
                "-"
                if new is None or not base_passed
                else f"{100 * (base_passed - len(new)) / base_passed:.1f}%"
            )
            lines.append(
                f"| {library} {result['version']} | {o['selected']} "
                f"(of {result['collected']}, every {result['every']}) | {o['mode']} | "
                f"{o['passed']} | {o['failed']} | {o['skipped']} | "
                f"{'-' if new is None else len(new)} | {kept} | {o['seconds']:.0f} s |"
            )
    return lines


def _missing_and_notes(results: dict[str, Any]) -> list[str]:
    """The libraries not in the results (and why, where known), then each library's
    note."""
    lines = []
    missing = [lib for lib in LIBRARIES if lib not in results]
    if missing:
        lines += [
            "",
            f"Not in these results: {', '.join(missing)} (run `python -m ecosystem "
            "--only LIB` to add a library).",
        ]
        lines += [f"- {lib}: {NOT_RUN[lib]}" for lib in missing if lib in NOT_RUN]
    notes = [
        (
            lib,
            " ".join(
                filter(None, (_runs(r), _never_run(r), _stock_files(r), r.get("note")))
            ),
        )
        for lib, r in results.items()
    ]
    notes = [(lib, note) for lib, note in notes if note]
    if notes:
        lines += [""] + [f"- {lib}: {note}" for lib, note in notes]
    return lines


def _runs(result: dict[str, Any]) -> str:
    """The runs merged into a library's results: part, items, autostatic commit."""
    runs = result.get("runs") or []
    if not runs:
        return ""
    said = [
        f"{r['part']}{_sample_of(r)} ({r['items']} items) at {r['autostatic']}"
        for r in runs
    ]
    return f"Runs: {'; '.join(said)}."


def _sample_of(run: dict[str, Any]) -> str:
    """How a run chose its items, where it says: `, every K` (`from each file's item
    R`, `, new items only`, `, failed items only`, `, stopped at its deadline`,
    `, modes M`)."""
    if "every" not in run:
        return ""
    said = f", every {run['every']}"
    if run.get("start"):
        said += f" from each file's item {run['start']}"
    said += ", new items only" if run["new_only"] else ""
    said += ", failed items only" if run.get("failed_only") else ""
    said += ", stopped at its deadline" if run.get("stopped") else ""
    modes = run.get("modes", ALL_MODES)
    return said + ("" if modes == ALL_MODES else f", modes {modes}")


def _stock_files(result: dict[str, Any]) -> str:
    files = sorted({f for o in result["outcomes"] for f in o.get("stock_files", [])})
    if not files:
        return ""
    shown = ", ".join(f"`{f}`" for f in files)
    return f"Run stock in every mode, as they never import the library: {shown}."


def _never_run(result: dict[str, Any]) -> str:
    """The collected items no mode has run, and the files none of whose items ran."""
    files = result.get("collected_files")
    ran = items_reached(result)
    if not files or not ran:
        return ""
    never = result["collected"] - len(ran)
    untouched = sorted(set(files) - {n.split("::")[0] for n in ran})
    shown = ", ".join(f"`{f}`" for f in untouched[:8])
    more = f" and {len(untouched) - 8} more" if len(untouched) > 8 else ""
    return f"Never run: {never} of the {result['collected']} collected items" + (
        f"; files with none run: {shown}{more}." if untouched else "."
    )


def _failures_by_cause(results: dict[str, Any]) -> list[str]:
    """Every failure, per library and mode, grouped by its cause."""
    lines = ["", "## Remaining failures, by cause", ""]
    if not any(o["failures"] for r in results.values() for o in r["outcomes"]):
        lines += ["None: every selected item passes in every mode.", ""]
    for library, result in results.items():
        outcomes = result["outcomes"]
        for o in outcomes:
            if not o["failures"]:
                continue
            lines.append(f"### {library}, {o['mode']}")
            lines.append("")
            if o.get("rebase_summary"):
                lines += [o["rebase_summary"], ""]
            by_cause: dict[str, list[tuple[str, str]]] = {}
            for node, (cause, first) in sorted(o["failures"].items()):
                by_cause.setdefault(cause, []).append((node, first))
            for cause, entries in sorted(by_cause.items()):
                lines.append(f"- **{cause}** ({len(entries)}): {_REASONS[cause]}")
                for node, first in entries:
                    lines.append(f"  - `{node}`: {first}")
                    if _explained(node):
                        lines.append(f"    - *{_explained(node)}*")
            lines.append("")
    return lines


def render(results: dict[str, Any]) -> str:
    """The report's markdown: the results table, the targets, what is missing, and the
    failures by cause."""
    lines = _results_table(results)
    lines += _targets(results)
    lines += _missing_and_notes(results)
    lines += _failures_by_cause(results)
    return "\n".join(lines) + "\n"
