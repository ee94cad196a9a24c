"""Type checkers see an AutoModule subclass as they see an `eqx.Module`.

pyright and mypy check tests/typing/user_model.py (must be clean) and
tests/typing/user_errors.py (exactly the diagnostics its `# expect:` comments name, by
line), and copies of both with `eqx.Module` as the base, which must give the same
diagnostics. Both checkers run at once, on all four files, to keep this under ~20 s.
"""

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
USER_FILES = ("user_model.py", "user_errors.py")
EXPECT = re.compile(r"#\s*expect:\s*(\S+)\s*\|\s*(\S+)\s*$")


def expected(source: str) -> tuple[set[tuple[int, str]], set[tuple[int, str]]]:
    """The (line, rule) pairs pyright and mypy must report, from `# expect:` marks."""
    by_pyright, by_mypy = set(), set()
    for number, line in enumerate(source.splitlines(), start=1):
        match = EXPECT.search(line)
        if match:
            for found, rule in zip((by_pyright, by_mypy), match.groups()):
                if rule != "-":
                    found.add((number, rule))
    return by_pyright, by_mypy


def eqx_twin(source: str) -> str:
    assert source.count("(asx.AutoModule)") >= 2  # the base really is replaced
    return source.replace("(asx.AutoModule)", "(eqx.Module)")


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """{file name: (pyright diagnostics, mypy diagnostics)} as sets of (line, rule)."""
    pyright = shutil.which("pyright")
    assert pyright, "pyright is in the test extra: pip install -e '.[test]'"
    assert importlib.util.find_spec("mypy"), "mypy is in the test extra"
    folder = tmp_path_factory.mktemp("typing")
    paths = {}
    for name in USER_FILES:
        source = (ROOT / "tests" / "typing" / name).read_text()
        twin = folder / name.replace(".py", "_eqx.py")
        twin.write_text(eqx_twin(source))
        paths[name] = ROOT / "tests" / "typing" / name
        paths[twin.name] = twin
    files = [str(path) for path in paths.values()]
    # From the root, so pyproject's [tool.pyright] (standard mode, Python 3.10) applies.
    run_pyright = subprocess.Popen(
        [pyright, "--outputjson", *files], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    # mypy reads jax as untyped (`follow_imports = skip`): analysing jax takes it
    # ~15 s; what is checked here (fields, __init__, attributes) does not need it.
    config = folder / "mypy.ini"
    config.write_text("[mypy]\n[mypy-jax.*,jaxlib.*]\nfollow_imports = skip\n")
    run_mypy = subprocess.Popen(
        [sys.executable, "-m", "mypy", "--config-file", str(config)]
        + ["--python-version", "3.10", "--follow-imports", "silent"]
        + ["--cache-dir", "/dev/null", "--no-error-summary", "--output", "json"]
        + files,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pyright_out, _ = run_pyright.communicate(timeout=120)
    report = json.loads(pyright_out)
    assert report["summary"]["filesAnalyzed"] == len(files), report
    results = {name: (set(), set()) for name in paths}
    name_of = {str(path.resolve()): name for name, path in paths.items()}
    for diagnostic in report["generalDiagnostics"]:
        if diagnostic["severity"] == "error":
            line = diagnostic["range"]["start"]["line"] + 1
            rule = diagnostic.get("rule", diagnostic["message"])
            results[name_of[str(Path(diagnostic["file"]).resolve())]][0].add(
                (line, rule)
            )
    mypy_out, mypy_err = run_mypy.communicate(timeout=120)
    assert run_mypy.returncode in (0, 1), mypy_err  # 2: mypy itself failed
    for row in filter(None, mypy_out.splitlines()):
        diagnostic = json.loads(row)
        if diagnostic["severity"] == "error":
            name = name_of[str((ROOT / diagnostic["file"]).resolve())]
            results[name][1].add((diagnostic["line"], diagnostic["code"]))
    return results


@pytest.mark.parametrize("name", USER_FILES)
def test_pyright_sees_the_generated_init_and_the_fields(checked, name):
    want, _ = expected((ROOT / "tests" / "typing" / name).read_text())
    assert checked[name][0] == want
    if name == "user_errors.py":
        assert len(want) >= 8  # the marks were parsed


@pytest.mark.parametrize("name", USER_FILES)
def test_mypy_sees_the_generated_init_and_the_fields(checked, name):
    _, want = expected((ROOT / "tests" / "typing" / name).read_text())
    assert checked[name][1] == want
    if name == "user_errors.py":
        assert len(want) >= 8


@pytest.mark.parametrize("name", USER_FILES)
def test_checkers_see_automodule_as_eqx_module(checked, name):
    assert checked[name] == checked[name.replace(".py", "_eqx.py")]
