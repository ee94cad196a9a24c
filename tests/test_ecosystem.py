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
