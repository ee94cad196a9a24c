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
