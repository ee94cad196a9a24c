"""Every example runs in its fast mode and shows what it claims."""

import importlib.util
import sys
from pathlib import Path

from .helpers import needs_devices

EXAMPLES = Path(__file__).parents[1] / "examples"


def run_example(name: str) -> dict:
    spec = importlib.util.spec_from_file_location(
        f"example_{name}", EXAMPLES / f"{name}.py"
    )
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


def test_checkpoint_to_host():
    assert run_example("checkpoint_to_host") == {"host_numpy": True, "roundtrip": True}


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
    import pytest

    pytest.importorskip("orbax.checkpoint")
    assert run_example("orbax_checkpoint") == {
        "restored_equal": True,
        "shardings_match": True,
        "mismatched_keys": 4,
        "migrated_equal": True,
    }
