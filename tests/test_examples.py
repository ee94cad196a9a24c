"""Every example runs in its fast mode and shows what it claims."""

import ast
import importlib.util
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import needs_devices

EXAMPLES = Path(__file__).parents[1] / "examples"
SCRIPTS = [
    "checkpoint_to_host",
    "mlp_optax",
    "multiprocess_training",
    "orbax_checkpoint",
    "retrace_debugging",
    "sharded_training",
    "switch_over_modules",
    "training",
    "transformer",
]


def run_example(name: str) -> dict:
    spec = importlib.util.spec_from_file_location(
        f"example_{name}", EXAMPLES / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.main(fast=True)


def test_mlp_optax_matches_eqx_loss_curve():
    out = run_example("mlp_optax")
    assert out["max_loss_gap"] < 1e-5 and out["final_loss"] < 0.5


def test_transformer_trains():
    out = run_example("transformer")
    assert out["last_loss"] < out["first_loss"] / 2


def test_training_shows_what_its_page_says():
    # docs/training.md shows this example's code and says what each part shows.
    out = run_example("training")
    optax_loop, stateful = out["optax"], out["stateful"]
    assert optax_loop["last_loss"] < optax_loop["first_loss"] / 4
    # Fresh, trained and loaded models share one compiled step.
    assert out["step_traces"] == 1
    assert stateful["last_loss"] < stateful["first_loss"] / 2
    assert stateful["inference"] and stateful["test_loss"] < stateful["first_loss"]
    # Inference uses the running statistics: one example alone predicts the same.
    assert stateful["alone_gap"] < 1e-5
    assert out["resume"] == {"same_state": True, "same_losses": True}


def run_script(
    name: str, args: list[str], monkeypatch: pytest.MonkeyPatch
) -> int | str | None:
    """Runs `python examples/<name>.py *args` in this process, where jax is already
    imported, so a run that stops while parsing takes milliseconds; returns the exit
    status. A run that goes on into the example does not exit, and fails here."""
    if name == "orbax_checkpoint":
        pytest.importorskip("orbax.checkpoint")
    path = str(EXAMPLES / f"{name}.py")
    monkeypatch.setattr(sys, "argv", [path, *args])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(path, run_name="__main__")
    return exit_.value.code


@pytest.mark.parametrize("flag", ["--help", "-h"])
@pytest.mark.parametrize("name", SCRIPTS)
def test_help_describes_the_example_without_running_it(
    name: str, flag: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    docstring = ast.get_docstring(ast.parse((EXAMPLES / f"{name}.py").read_text()))
    assert docstring
    assert run_script(name, [flag], monkeypatch) == 0
    out = capsys.readouterr().out
    # Help is all there is: any line the example prints would come before it.
    assert out.startswith(f"usage: {name}.py [-h]")
    assert docstring.splitlines()[0] in out


@pytest.mark.parametrize("name", SCRIPTS)
def test_unknown_option_is_an_error(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    assert run_script(name, ["--no-such-option"], monkeypatch) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing ran
    assert "unrecognized arguments: --no-such-option" in captured.err


def test_checkpoint_to_host(capsys: pytest.CaptureFixture):
    assert run_example("checkpoint_to_host") == {"host_numpy": True, "roundtrip": True}
    # The refused load is printed whole: the problem list follows the header line.
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if "(1 problem):" in line)
    assert "dropout.p" in "".join(lines[header + 1 : header + 2]), out


def test_switch_over_modules():
    assert run_example("switch_over_modules")["max_error"] < 1e-5


@needs_devices(8)
def test_sharded_training():
    out = run_example("sharded_training")
    assert out["last_loss"] < out["first_loss"] and "model" in out["spec"]


def test_retrace_debugging():
    out = run_example("retrace_debugging")
    assert out == {"float_retraces": 4, "array_retraces": 0}


@needs_devices(8)
def test_orbax_checkpoint():
    pytest.importorskip("orbax.checkpoint")
    assert run_example("orbax_checkpoint") == {
        "restored_equal": True,
        "shardings_match": True,
        "mismatched_keys": 4,
        "migrated_equal": True,
    }


@pytest.mark.parametrize("name", ["orbax_checkpoint", "multiprocess_training"])
def test_help_needs_no_optional_package(name: str, tmp_path: Path):
    # `--help` must print usage where orbax (the `test` extra only) is missing.
    for package in ("orbax", "optax"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text(
            f"raise ImportError('{package} is not installed')"
        )
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py"), "--help"],
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: {name}.py")
