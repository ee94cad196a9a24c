"""The rebase tool: an Equinox-based codebase runs with its Modules auto-static."""

import dataclasses
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import autostatic as asx
from autostatic import RebaseError

LIBRARY = """
import equinox as eqx
import jax
import jax.numpy as jnp


class _Meta(type(eqx.Module)):  # a library's own metaclass, as diffrax's PIDController
    def __call__(cls, *args, double=False, **kwargs):
        out = super().__call__(*args, **kwargs)
        return Scaled(out, 2.0) if double else out


class Base(eqx.Module):
    n: int = eqx.field(static=True)


class Linear(Base):
    w: jax.Array

    def __call__(self, x):
        return self.w * x * self.n


class Scaled(eqx.Module):
    inner: eqx.Module
    factor: float = eqx.field(static=True)

    def __call__(self, x):
        return self.factor * self.inner(x)


class WithMeta(Base, metaclass=_Meta):
    w: jax.Array

    def __call__(self, x):
        return self.w + x
"""


def _define(module_name: str) -> dict:
    namespace = {"__name__": module_name}
    exec(compile(LIBRARY, f"<{module_name}>", "exec"), namespace)
    return namespace


@pytest.fixture
def rebased() -> Iterator:
    installed = asx.rebase(["fakelib_a"])
    try:
        yield installed
    finally:
        installed.undo()


def test_direct_subclasses_and_their_metaclasses_are_rebased(rebased):
    lib = _define("fakelib_a.layers")
    other = _define("someone_else")
    for name in ("Base", "Linear", "Scaled", "WithMeta"):
        assert issubclass(lib[name], asx.AutoModule), name
        assert not issubclass(other[name], asx.AutoModule), name
    assert sorted(rebased.rebased["fakelib_a"]) == [
        "fakelib_a.layers.Base",
        "fakelib_a.layers.Scaled",
    ]
    layer = lib["Linear"](n=3, w=jnp.ones(2))
    # Plain jax.jit takes the rebased module; the static marker is kept.
    assert jax.tree_util.tree_leaves(layer) == [layer.w]
    assert jax.jit(lambda m, x: m(x))(layer, 1.0).tolist() == [3.0, 3.0]
    doubled = lib["WithMeta"](n=1, w=jnp.zeros(2), double=True)
    assert type(doubled) is lib["Scaled"] and doubled(1.0).tolist() == [2.0, 2.0]
    rebased.check(imported_only=True)  # the module was exec-ed, not imported


def test_static_markers_can_be_dropped():
    installed = asx.rebase(["fakelib_b"], drop_static_markers=True)
    try:
        lib = _define("fakelib_b")
    finally:
        installed.undo()
    assert installed.markers_dropped["fakelib_b"] == 2
    assert not any(f.metadata.get("static") for f in dataclasses.fields(lib["Linear"]))
    layer = lib["Linear"](n=3, w=jnp.ones(2))
    assert jax.tree_util.tree_leaves(layer) == [layer.w]  # decided static anyway


def test_undo_stops_rebasing():
    installed = asx.rebase(["fakelib_c"])
    installed.undo()
    assert not issubclass(_define("fakelib_c")["Base"], asx.AutoModule)
    with pytest.raises(RebaseError, match="'fakelib_c' was never imported"):
        installed.check()


def test_a_rebase_that_cannot_take_effect_is_an_error(rebased):
    with pytest.raises(RebaseError, match="active already"):
        asx.rebase(["fakelib_d"])
    rebased.undo()
    with pytest.raises(RebaseError, match=r"equinox\.nn.*imported already"):
        asx.rebase(["equinox.nn"])
    with pytest.raises(RebaseError, match="name at least one package"):
        asx.rebase([" "])
    empty = asx.rebase(["fakelib_e"])
    try:
        sys.modules["fakelib_e"] = type(sys)("fakelib_e")  # imported, no class
        with pytest.raises(RebaseError, match="no class of 'fakelib_e' was rebased"):
            empty.check()
    finally:
        del sys.modules["fakelib_e"]
        empty.undo()


def _write_project(root: Path) -> None:
    (root / "fakelib").mkdir()
    (root / "fakelib" / "__init__.py").write_text(LIBRARY)
    (root / "fake_tests").mkdir()
    (root / "fake_tests" / "__init__.py").write_text("")
    (root / "fake_tests" / "test_lib.py").write_text(
        textwrap.dedent(
            """
            import equinox as eqx
            import jax
            import jax.numpy as jnp
            import autostatic as asx
            import fakelib

            class Local(eqx.Module):
                w: jax.Array

            def test_rebased():
                assert issubclass(fakelib.Linear, asx.AutoModule)
                assert issubclass(Local, asx.AutoModule)
                layer = fakelib.Linear(n=2, w=jnp.ones(1))
                assert jax.jit(lambda m: m(1.0))(layer).tolist() == [2.0]
            """
        )
    )


def _own_session() -> dict[str, str]:
    """The environment of a pytest run of its own, not a worker of this one.

    xdist's variables are dropped, and only the plugins a run names load: the
    machine's others (pytest-benchmark) may warn, failing a run under `-W error`.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return env | {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


def _pytest(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=root,
        env=_own_session(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _runner(root: Path, packages: str, script: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "autostatic.rebased", packages, str(script)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_pytest_plugin_rebases_a_library_and_its_tests(tmp_path):
    _write_project(tmp_path)
    run = _pytest(
        tmp_path, "-p", "autostatic.rebased", "--autostatic-rebase=fakelib,fake_tests"
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout
    assert "fakelib: 2 direct eqx.Module subclasses rebased" in run.stdout
    # Without the plugin the same test fails: the check above can fail.
    assert _pytest(tmp_path).returncode == 1


def test_pytest_plugin_refuses_a_rebase_that_did_nothing(tmp_path):
    _write_project(tmp_path)
    run = _pytest(
        tmp_path, "-p", "autostatic.rebased", "--autostatic-rebase=fakelib,fakelbi"
    )
    assert run.returncode != 0
    assert "'fakelbi' was never imported" in run.stdout + run.stderr


def test_runner_runs_a_script_rebased(tmp_path):
    _write_project(tmp_path)
    script = tmp_path / "script.py"
    script.write_text(
        "import autostatic as asx, fakelib\n"
        "print(issubclass(fakelib.Base, asx.AutoModule))\n"
    )
    run = _runner(tmp_path, "fakelib", script)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "True"
    assert "fakelib: 2 direct eqx.Module subclasses rebased" in run.stderr


@pytest.mark.parametrize("entry", ["__main__", "script.py"])
def test_a_script_s_own_classes_are_rebased_by_name_or_path(tmp_path, entry):
    # A script run by `runpy` is `__main__`, and no longer in `sys.modules` once it
    # has run: naming its file must still count it as imported.
    script = tmp_path / "script.py"
    script.write_text(
        "import autostatic as asx, equinox as eqx\n"
        "class Model(eqx.Module):\n"
        "    size: int\n"
        "print(issubclass(Model, asx.AutoModule))\n"
    )
    run = _runner(tmp_path, entry, script)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "True"
    assert f"{entry}: 1 direct eqx.Module subclasses rebased" in run.stderr


def test_a_named_script_that_makes_no_class_is_said_to_make_none(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("import equinox as eqx\nprint(eqx.nn.Identity())\n")
    run = _runner(tmp_path, "script.py", script)
    assert run.returncode == 2
    assert "'script.py' was never imported or makes no class" in run.stderr


def test_rebasing_main_takes_the_classes_defined_after_it():
    # A notebook's cells run in `__main__`, imported already: its classes from the
    # rebase on are rebased, the earlier ones stay eqx.Modules.
    import equinox as eqx

    namespace = {"__name__": "__main__", "eqx": eqx}
    exec("class Before(eqx.Module):\n    size: int", namespace)
    installed = asx.rebase(["__main__"])
    try:
        exec("class After(eqx.Module):\n    size: int", namespace)
    finally:
        installed.undo()
    assert not issubclass(namespace["Before"], asx.AutoModule)
    assert issubclass(namespace["After"], asx.AutoModule)
    installed.check()  # it rebased a class of `__main__`


def test_the_plugin_module_does_not_shadow_the_function():
    # A module named like the function would replace it as an attribute of the
    # package once imported (pytest -p in the same process).
    import autostatic.rebased  # noqa: F401

    assert callable(asx.rebase) and asx.rebase.__module__ == "autostatic.rebase._rebase"


def test_a_tests_directory_without_init_is_rebased_by_its_path(tmp_path):
    # pytest imports such test modules by their basenames (`test_lib`), which no
    # package name can take; the directory can.
    _write_project(tmp_path)
    (tmp_path / "fake_tests" / "__init__.py").unlink()
    args = ("-p", "autostatic.rebased", "--autostatic-rebase=fakelib,fake_tests")
    run = _pytest(tmp_path, *args)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout
    assert "fake_tests: 1 direct eqx.Module subclasses rebased" in run.stdout


DEPENDENT = """
import fakelib

class Twice(fakelib.Linear):
    def __call__(self, x):
        return 2 * super().__call__(x)
"""


def test_classes_left_on_an_unnamed_equinox_library_are_named(tmp_path):
    _write_project(tmp_path)
    (tmp_path / "fakedep").mkdir()
    (tmp_path / "fakedep" / "__init__.py").write_text(DEPENDENT)
    script = tmp_path / "script.py"
    script.write_text("import autostatic as asx, fakedep\n")
    run = _runner(tmp_path, "fakedep", script)
    assert "fakedep.Twice (on fakelib.Linear)" in run.stderr, run.stderr
    assert "Add fakelib to the rebase" in run.stderr


def _distribution(root: Path, name: str, *requires: str) -> None:
    """An installed distribution of the import package `name`, as pip leaves it."""
    info = root / f"{name}-0.1.dist-info"
    info.mkdir()
    lines = ["Metadata-Version: 2.1", f"Name: {name}", "Version: 0.1"]
    (info / "METADATA").write_text(
        "\n".join(lines + [f"Requires-Dist: {r}" for r in requires]) + "\n"
    )
    (info / "top_level.txt").write_text(name + "\n")


def test_equinox_based_dependencies_are_followed(tmp_path):
    # fakedep's class derives from one of fakelib, a library it requires that is
    # built on Equinox: rebased with it unless told not to, so no model is mixed.
    # A requirement of an optional extra is not followed.
    _write_project(tmp_path)
    (tmp_path / "fakedep").mkdir()
    (tmp_path / "fakedep" / "__init__.py").write_text(DEPENDENT)
    _distribution(tmp_path, "fakelib", "equinox>=0.13", "numpy")
    _distribution(tmp_path, "fakeextra", "fakelib")
    _distribution(tmp_path, "fakedep", "fakelib", "jax", 'fakeextra; extra == "dev"')
    script = tmp_path / "script.py"
    script.write_text(
        "import autostatic as asx, fakedep\n"
        "print(issubclass(fakedep.Twice, asx.AutoModule))\n"
    )
    run = _runner(tmp_path, "fakedep", script)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "True"
    assert "fakelib (a dependency of fakedep): 2 direct eqx.Module" in run.stderr
    assert "fakeextra" not in run.stderr and "mixed" not in run.stderr
    unfollowed = subprocess.run(
        [sys.executable, "-m", "autostatic.rebased", "--no-follow", "fakedep"]
        + [str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert unfollowed.stdout.strip() == "False", unfollowed.stderr
    assert "fakedep.Twice (on fakelib.Linear)" in unfollowed.stderr


def test_the_installed_libraries_equinox_dependencies():
    from autostatic.rebase._dependencies import equinox_dependencies

    assert equinox_dependencies(("diffrax", "test")) == {
        "lineax": "diffrax",
        "optimistix": "diffrax",
    }
    assert equinox_dependencies(("optimistix",)) == {"lineax": "optimistix"}
    # Named ones are not followed again; Equinox itself never.
    assert equinox_dependencies(("lineax", "optimistix")) == {}
    assert equinox_dependencies(("equinox", "__main__", "tests")) == {}


HIDING = """
import equinox as eqx
import jax
import jax.numpy as jnp


class Holder(eqx.Module):
    w: jax.Array
    fn: object

    def __init__(self):
        self.w = jnp.ones(2)
        scale = jnp.full(2, 3.0)
        self.fn = lambda x: x * scale  # an array in a closure: hidden
"""


def test_a_suite_with_warnings_as_errors_is_told_once_per_class(tmp_path):
    # Stock, Equinox says nothing of an array in a closure; rebased, AutoModule
    # would warn, failing a suite that runs with warnings as errors over code its
    # runner did not port. The summary says it instead, once per class.
    (tmp_path / "hidinglib").mkdir()
    (tmp_path / "hidinglib" / "__init__.py").write_text(HIDING)
    (tmp_path / "test_hiding.py").write_text(
        "import hidinglib\n\n"
        "def test_twice():\n"
        "    hidinglib.Holder()\n"
        "    hidinglib.Holder()\n"
    )
    args = ("-W", "error", "-p", "autostatic.rebased")
    run = _pytest(tmp_path, *args, "--autostatic-rebase=hidinglib")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 rebased class(es) hold values AutoModule warns of" in run.stdout
    assert run.stdout.count("Holder.fn") == 1
    assert "holds an array" in run.stdout


def test_the_runner_s_help_shows_every_form_it_takes():
    run = subprocess.run(
        [sys.executable, "-m", "autostatic.rebased", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0
    for form in ("__main__", "directory", "src/models/net.py", "-m pkg.mod", "pytest"):
        assert form in run.stdout, form


def _stopped(command: list[str], root: Path) -> str:
    """What a run prints when SIGTERM stops it (as a time limit does) mid-way."""
    process = subprocess.Popen(
        command,
        cwd=root,
        env=_own_session(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    seen = []
    for line in process.stdout:  # the run is under way: its test or script started
        seen.append(line)
        if "started" in line:
            break
    process.terminate()
    out, _ = process.communicate(timeout=120)
    return "".join(seen) + out


def test_a_run_stopped_by_a_time_limit_still_prints_its_summary(tmp_path):
    _write_project(tmp_path)
    script = tmp_path / "slow.py"
    script.write_text(
        "import time, fakelib\nprint('started', flush=True)\ntime.sleep(600)\n"
    )
    runner = [sys.executable, "-m", "autostatic.rebased", "fakelib", str(script)]
    out = _stopped(runner, tmp_path)
    assert "the run stopped" in out
    assert "fakelib: 2 direct eqx.Module subclasses rebased" in out


def test_a_suite_stopped_by_a_time_limit_still_prints_its_summary(tmp_path):
    _write_project(tmp_path)
    (tmp_path / "fake_tests" / "test_slow.py").write_text(
        "import time\nimport fakelib\n\ndef test_slow():\n"
        "    print('started', flush=True)\n    time.sleep(600)\n"
    )
    suite = [sys.executable, "-m", "pytest", "-s", "-p", "no:cacheprovider"]
    suite += ["-p", "autostatic.rebased", "--autostatic-rebase=fakelib,fake_tests"]
    out = _stopped([*suite, "fake_tests/test_slow.py"], tmp_path)
    assert "fakelib: 2 direct eqx.Module subclasses rebased" in out
