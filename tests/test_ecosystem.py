"""diffrax, lineax and optimistix run with their Modules auto-static, unedited, and
give the results they give stock (the fast part of the ecosystem report)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("diffrax")
pytest.importorskip("lineax")
pytest.importorskip("optimistix")

SCRIPT = Path(__file__).parent / "ecosystem_scripts" / "solve_all.py"
LIBRARIES = "diffrax,lineax,optimistix"


def _run(*prefix: str) -> dict:
    run = subprocess.run(
        [sys.executable, *prefix, str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


@pytest.fixture(scope="module")
def stock() -> dict:
    return _run()


@pytest.mark.parametrize("drop", [False, True], ids=["markers kept", "markers dropped"])
def test_rebased_libraries_give_stock_results(stock, drop):
    flags = ["--drop-static-markers"] if drop else []
    rebased = _run("-m", "autostatic.rebased", *flags, LIBRARIES)
    assert stock["rebased"] == [False, False, False]
    assert rebased["rebased"] == [True, True, True]
    assert rebased["is_module"] and rebased["steps"] == stock["steps"]
    for key in ("ode", "linear", "root", "grad"):
        np.testing.assert_allclose(rebased[key], stock[key], rtol=1e-6, err_msg=key)
    # Not only equal results: the very same programs for XLA to compile.
    assert rebased["programs"] == stock["programs"]


def test_report_judges_each_mode_against_its_target() -> None:
    from ecosystem.report import render

    def outcome(mode: str, passed: int, failures: dict) -> dict:
        return {
            "mode": mode,
            "selected": 20,
            "passed": passed,
            "failed": len(failures),
            "skipped": 0,
            "seconds": 1.0,
            "failures": failures,
            "rebase_summary": "",
        }

    broke = {"t.py::a": ("structure", "PyTree structures must match")}
    results = {
        "lineax": {
            "version": "0.1.1",
            "collected": 40,
            "every": 2,
            "outcomes": [
                outcome("baseline", 20, {}),
                outcome("b", 19, broke),
                outcome("b2", 19, broke),
            ],
        }
    }
    text = render(results)
    assert "- lineax, b: **MISSED**, 95.0% (target >= 100%; 1 new failures)" in text
    assert "- lineax, b2: **MET**, 95.0% (target >= 95%; 1 new failures)" in text
    assert "Not in these results: optimistix, diffrax" in text


def test_runs_of_parts_merge_and_the_report_says_what_never_ran() -> None:
    from ecosystem.report import render
    from ecosystem.run import in_part, merge

    items = [f"t/{f}.py::{i}" for f in "abcd" for i in "xy"]
    first, second = in_part(items, "1/2"), in_part(items, "2/2")
    assert first == ["t/a.py::x", "t/a.py::y", "t/c.py::x", "t/c.py::y"]
    assert sorted(first + second) == sorted(items)

    def result(part: str, statuses: dict[str, str]) -> dict:
        failures = {n: ("other", "boom") for n, s in statuses.items() if s == "failed"}
        counts = {
            k: sum(v == k for v in statuses.values())
            for k in ("passed", "failed", "skipped")
        }
        outcome = {
            "mode": "baseline", "selected": len(statuses), **counts, "seconds": 1.0,
            "failures": failures, "rebase_summary": "", "statuses": statuses,
        }  # fmt: skip
        return {
            "version": "1.0", "collected": 8, "every": 1, "outcomes": [outcome],
            "collected_files": {f"t/{f}.py": 2 for f in "abcd"},
            "runs": [{"autostatic": "abc1234", "part": part, "items": len(statuses)}],
        }  # fmt: skip

    merged = merge(
        result("1/2", {"t/a.py::x": "passed", "t/a.py::y": "failed"}),
        result("2/2", {"t/b.py::x": "passed", "t/a.py::y": "passed"}),
    )
    (baseline,) = merged["outcomes"]
    assert (baseline["selected"], baseline["passed"], baseline["failed"]) == (3, 3, 0)
    assert baseline["failures"] == {}  # a later pass replaces the failure
    text = render({"lineax": merged})
    assert "Runs: 1/2 (2 items) at abc1234; 2/2 (2 items) at abc1234." in text
    assert "Never run: 5 of the 8 collected items" in text
    assert "`t/c.py`, `t/d.py`" in text
    # Another version replaces the results instead of merging.
    other = result("all", {"t/a.py::x": "passed"}) | {"version": "2.0"}
    assert merge(merged, other) is other


def test_a_denser_sample_of_new_items_only_adds_to_the_results(tmp_path) -> None:
    import importlib.metadata
    import json

    from ecosystem.report import render
    from ecosystem.run import _items_run, merge, sample

    items = [f"t/a.py::{i}" for i in range(8)]
    assert sample(items, 4) == ["t/a.py::0", "t/a.py::4"]
    assert sample(items, 4, 1) == ["t/a.py::1", "t/a.py::5"]
    version = importlib.metadata.version("lineax")

    def result(every: int, new_only: bool, statuses: dict[str, str]) -> dict:
        outcome = {
            "mode": "b", "selected": len(statuses), "passed": len(statuses),
            "failed": 0, "skipped": 0, "seconds": 1.0, "failures": {},
            "rebase_summary": "", "statuses": statuses,
        }  # fmt: skip
        run = {"autostatic": "abc1234", "part": "all", "every": every,
               "new_only": new_only, "items": len(statuses)}  # fmt: skip
        return {
            "version": version, "collected": 8, "every": every, "outcomes": [outcome],
            "collected_files": {"t/a.py": 8}, "runs": [run],
        }  # fmt: skip

    sparse = result(4, False, {i: "passed" for i in sample(items, 4)})
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"lineax": sparse}))
    done = _items_run(path, "lineax", ["b"])
    assert done == {"t/a.py::0", "t/a.py::4"}
    new = [i for i in sample(items, 2) if i not in done]
    assert new == ["t/a.py::2", "t/a.py::6"]
    merged = merge(sparse, result(2, True, {i: "passed" for i in new}))
    assert merged["every"] == 2
    assert merged["outcomes"][0]["selected"] == 4
    text = render({"lineax": merged})
    assert "all, every 4 (2 items) at abc1234; all, every 2, new items only" in text
    assert "Never run: 4 of the 8 collected items" in text
    # A run of some modes only says which.
    again = result(2, False, {i: "passed" for i in new})
    again["runs"][0]["modes"] = "b,b2"
    text = render({"lineax": merge(merged, again)})
    assert "all, every 2, modes b,b2 (2 items) at abc1234." in text
    # The items a sample left, by starting it further on; the sample's density stays.
    rest = result(2, False, {i: "passed" for i in sample(items, 2, 1)})
    rest["runs"][0]["start"] = 1
    whole = merge(merged, rest)
    assert whole["every"] == 2 and whole["outcomes"][0]["selected"] == 8
    text = render({"lineax": whole})
    assert "all, every 2 from each file's item 1 (4 items) at abc1234" in text
    assert "Never run: 0 of the 8 collected items" in text
    # A denser sample of some files only does not make the suite's sample denser.
    some = result(1, True, {"t/a.py::1": "passed"})
    some["runs"][0]["part"] = "1/2"
    assert merge(merged, some)["every"] == 2
    # Results of another version say nothing about which items ran.
    path.write_text(json.dumps({"lineax": sparse | {"version": "0.0.0"}}))
    assert _items_run(path, "lineax", ["b"]) == set()


def test_a_run_stops_at_its_deadline_and_leaves_the_rest_for_later(
    monkeypatch, tmp_path
) -> None:
    import importlib.metadata
    import time

    from ecosystem import run as R

    processes: list[list[str]] = []

    def one_process(root, library, mode, items, timeout, outcome) -> None:
        processes.append(items)
        for item in items:
            outcome.note(item, "passed")

    monkeypatch.setattr(R, "_run_file", one_process)
    items = [f"t/{f}.py::{i}" for f in "ab" for i in range(5)]
    outcome = R.run_mode(Path("."), "lineax", "b", items, 60, None, 2)
    assert [len(p) for p in processes] == [2, 2, 1, 2, 2, 1]
    assert outcome.selected == 10 and set(outcome.statuses) == set(items)
    processes.clear()
    outcome = R.run_mode(Path("."), "lineax", "b", items, 60, time.monotonic() - 1)
    assert processes == [] and outcome.selected == 0 and outcome.statuses == {}

    # An item is done for a later --new-only run once every mode it asks ran it.
    def result(every: int, statuses: dict[str, dict[str, str]], **run: object) -> dict:
        return {
            "version": importlib.metadata.version("lineax"), "collected": 10,
            "every": every, "collected_files": {},
            "outcomes": [{"mode": m, "statuses": s, "failures": {}, "seconds": 1.0,
                          "rebase_summary": ""} for m, s in statuses.items()],
            "runs": [{"autostatic": "abc1234", "part": "all", "every": every,
                      "new_only": True, "items": 2, **run}],
        }  # fmt: skip

    stopped = result(1, {"baseline": dict.fromkeys(items[:2], "passed"),
                         "b": {items[0]: "passed"}}, stopped=True)  # fmt: skip
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"lineax": stopped}))
    assert R._items_run(path, "lineax", ["baseline"]) == set(items[:2])
    assert R._items_run(path, "lineax", ["baseline", "b"]) == {items[0]}
    assert R._items_run(path, "lineax", ["b2"]) == set()
    # A stopped run is no denser sample of the suite, and the report says it stopped.
    sparse = result(4, {"b": {items[4]: "passed"}})
    assert R.merge(sparse, stopped)["every"] == 4
    from ecosystem.report import _sample_of

    said = _sample_of(stopped["runs"][0])
    assert said.endswith("new items only, stopped at its deadline")
    # After a fix, the failed items alone run again; no denser sample either.
    failed = result(1, {"b": {items[0]: "failed", items[1]: "passed"},
                        "b2": {items[2]: "failed"}}, failed_only=True)  # fmt: skip
    path.write_text(json.dumps({"lineax": failed}))
    assert R.items_failed(path, "lineax", ["b"]) == {items[0]}
    assert R.items_failed(path, "lineax", ["b", "b2"]) == {items[0], items[2]}
    assert R.merge(sparse, failed)["every"] == 4
    assert "failed items only" in _sample_of(failed["runs"][0])


def test_a_test_process_past_its_timeout_makes_its_items_crashes(
    monkeypatch, tmp_path
) -> None:
    import subprocess

    from ecosystem import run as R

    def too_long(command, **kwargs):
        raise subprocess.TimeoutExpired(command, kwargs["timeout"])

    monkeypatch.setattr(R.subprocess, "run", too_long)
    items = ["t/a.py::slow", "t/a.py::other"]
    outcome = R.Outcome("b", len(items))
    R._run_file(tmp_path, "lineax", "b", items, 7, outcome)
    assert outcome.statuses == dict.fromkeys(items, "failed")
    cause, why = outcome.failures[items[0]]
    assert cause == "crash" and "killed after the --timeout of 7 s" in why
