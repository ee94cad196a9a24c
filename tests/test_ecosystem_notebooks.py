"""The notebook runner of the ecosystem report: a notebook's classes rebased by a
first cell alone, and its printed output and arrays compared with stock's."""

import gzip
from pathlib import Path

import nbformat
import pytest

from ecosystem.notebooks import differences, execute, render, stand_in_mnist

_CELLS = [
    "import equinox as eqx, jax, jax.numpy as jnp",
    "class Scale(eqx.Module):\n"
    "    w: jax.Array\n"
    "    size: int\n"
    "    def __call__(self, x):\n"
    "        return self.w * x[: self.size]",
    "model = Scale(jnp.arange(2.0), 2)\n"
    "out = jax.jit(lambda m, x: m(x))(model, jnp.ones(3)) if {jit} else model(jnp.ones(3))\n"
    "print('out', out)",
]


def _notebook(tmp_path: Path, jit: bool) -> Path:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell(c.format(jit=jit) if "{jit}" in c else c)
        for c in _CELLS
    ]
    path = tmp_path / f"scale_{jit}.ipynb"
    nbformat.write(notebook, path)
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Stock, rebased and rebased without markers: the jitted call with an int field
    fails stock (a traced slice bound) and runs rebased (the int is static)."""
    path = _notebook(tmp_path_factory.mktemp("nb"), jit=True)
    return {mode: execute(path, mode, timeout=120) for mode in ("baseline", "b", "b2")}


def test_a_first_cell_rebases_the_notebook_s_classes(runs):
    assert not runs["baseline"]["ran"]
    assert "Error" in runs["baseline"]["error"]
    assert runs["b"]["ran"] and runs["b"]["rebased"] == 1
    assert any(line.startswith("out [0. 1.]") for line in runs["b"]["output"])
    assert any(line.startswith("FINGERPRINT model") for line in runs["b"]["output"])


def test_where_stock_fails_b2_is_compared_with_b(runs):
    assert differences(runs) == {"b": None, "b2": []}
    assert "| scale | 1 | fails: " in render(
        {
            "equinox": "0",
            "autostatic": "abc1234",
            "notebooks": {"scale": {"runs": runs, "differences": differences(runs)}},
            "skipped": {},
            "absent": [],
        }
    )


def test_a_different_result_is_reported(tmp_path):
    stock = execute(_notebook(tmp_path, jit=False), "baseline", timeout=120)
    rebased = execute(_notebook(tmp_path, jit=False), "b", timeout=120)
    assert stock["ran"] and rebased["ran"]
    assert differences({"baseline": stock, "b": rebased, "b2": rebased}) == {
        "b": [],
        "b2": [],
    }
    doctored = {**rebased, "output": [*rebased["output"], "FINGERPRINT extra"]}
    found = differences({"baseline": stock, "b": doctored, "b2": rebased})
    assert found["b"] == ["+FINGERPRINT extra"] and found["b2"] == []


def test_mnist_s_test_set_stands_in_for_absent_training_images(tmp_path):
    raw = tmp_path / "MNIST/MNIST/raw"
    raw.mkdir(parents=True)
    images = bytes([0, 0, 8, 3, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 2, 7, 8, 9, 10])
    labels = bytes([0, 0, 8, 1, 0, 0, 0, 1, 5])
    (raw / "t10k-images-idx3-ubyte.gz").write_bytes(gzip.compress(images))
    (raw / "t10k-labels-idx1-ubyte").write_bytes(labels)
    (raw / "train-labels-idx1-ubyte").write_bytes(bytes([0, 0, 8, 1, 0, 0, 0, 1, 3]))
    said = stand_in_mnist(tmp_path)
    assert said is not None and "test images and labels stand in" in said
    # The labels replaced too: each training image keeps its own label.
    assert (raw / "train-images-idx3-ubyte").read_bytes() == images
    assert (raw / "train-labels-idx1-ubyte").read_bytes() == labels
    assert stand_in_mnist(tmp_path) is None  # the real files (or these) are kept
    shown = render(
        {
            "equinox": "0",
            "autostatic": "abc1234",
            "notebooks": {},
            "skipped": {},
            "stand_ins": {"mnist": said},
            "absent": [],
        }
    )
    assert f"- mnist: {said}" in shown


def test_wall_times_and_addresses_are_masked():
    from ecosystem.notebooks import _printed

    notebook = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("")
    cell.outputs = [
        nbformat.v4.new_output(
            "stream", name="stdout", text="took 1.5 s\n<function relu at 0x7f3a2b>\n"
        )
    ]
    notebook.cells = [cell]
    assert _printed(notebook) == ["took <masked>", "<function relu at <masked>>"]
