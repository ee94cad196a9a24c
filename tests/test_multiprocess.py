"""Several JAX processes on this machine (gloo CPU collectives) form one mesh: an
AutoModule sharded over it trains under plain `jax.jit`, saves with orbax from every
process and restores onto another mesh, and in this one process with another device
count (`examples/multiprocess_training.py`)."""

import importlib.util
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

EXAMPLES = Path(__file__).parents[1] / "examples"


def _example(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_processes_train_one_sharded_model_and_orbax_restores_it(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    launcher = _example("multiprocess_training")
    out = launcher.launch(processes=2, devices=2, folder=str(tmp_path), timeout=300)
    assert (out["processes"], out["devices"]) == (2, 4)
    losses = out["losses"]
    assert losses == sorted(losses, reverse=True) and losses[-1] < 0.8 * losses[0]
    # `autostatic.save` needs every array on this host, and says where it is not.
    assert "is not fully addressable from this process" in out["save_refused"]
    assert out["save_refused"].startswith(".layers[0]")
    # Restored by both processes onto a mesh of all 4 devices on "model".
    assert out["restored_equal"] and out["restored_type"] == "Net"
    assert out["restored_spec"] == "P(None, 'model')"

    # Here: one process, its own devices, another mesh.
    parts = _example("multiprocess_parts")
    count = 4 if len(jax.devices()) >= 4 else 1
    mesh = Mesh(np.array(jax.devices()[:count]).reshape(1, count), ("data", "model"))
    with ocp.StandardCheckpointer() as checkpointer:
        restored = checkpointer.restore(tmp_path / "net", parts.template(mesh))
    expected = np.load(tmp_path / "expected.npz")
    leaves = jax.tree.leaves(restored)
    assert len(leaves) == len(expected.files)
    for leaf, name in zip(leaves, expected.files):
        np.testing.assert_array_equal(leaf, expected[name])
    assert restored.layers[0]["w"].sharding.mesh.devices.size == count
    assert jax.jit(lambda m, x: m(x))(restored, np.ones(8, np.float32)).shape == (4,)
