"""eqx.tree_serialise_leaves / eqx.tree_deserialise_leaves on an AutoModule read and
write the very bytes of its eqx.Module twin (same class body, no static markers),
in both directions, Python ints and floats included."""

import io
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest

import autostatic as asx

from .helpers import assert_same_arrays


def _body(base: type) -> type:
    class Model(base):
        linear: eqx.nn.Linear
        layers: list
        activation: Callable
        depth: int
        scale: float
        dropout: eqx.nn.Dropout
        flags: dict
        width: int = eqx.field(static=True, default=4)

    return Model


Auto, Eqx = _body(asx.AutoModule), _body(eqx.Module)


def make(cls: type, seed: int, depth: int = 5, scale: float = 0.5) -> object:
    key = jax.random.key(seed)
    return cls(
        eqx.nn.Linear(2, 2, key=key),
        [eqx.nn.Linear(2, 2, key=jax.random.fold_in(key, 1)), jax.nn.relu, 3],
        jax.nn.relu,
        depth,
        scale,
        eqx.nn.Dropout(0.1 * (seed + 1)),
        {"train": True, "w": jnp.full(2, float(seed))},
    )


def _bytes(tree: object) -> bytes:
    f = io.BytesIO()
    eqx.tree_serialise_leaves(f, tree)
    return f.getvalue()


def test_files_are_byte_identical_to_the_eqx_module_twin_s():
    assert _bytes(make(Auto, 0)) == _bytes(make(Eqx, 0))
    assert _bytes([make(Auto, 1), 2.0]) == _bytes([make(Eqx, 1), 2.0])


@pytest.mark.parametrize(
    "writer, reader",
    [(Eqx, Auto), (Auto, Eqx), (Auto, Auto)],
    ids=["eqx-to-auto", "auto-to-eqx", "auto-to-auto"],
)
def test_a_file_loads_into_either_template(writer, reader):
    written = make(writer, 0)
    template = make(reader, 7, depth=9, scale=0.25)
    loaded = eqx.tree_deserialise_leaves(io.BytesIO(_bytes(written)), template)
    assert type(loaded) is reader
    assert loaded.depth == 5 and type(loaded.depth) is int
    assert loaded.scale == 0.5 and loaded.layers[2] == 3
    assert loaded.dropout.p == pytest.approx(0.1) and loaded.flags["train"] is True
    assert loaded.activation is jax.nn.relu
    assert_same_arrays(
        eqx.filter(loaded, eqx.is_array), eqx.filter(written, eqx.is_array)
    )
    if reader is Auto:  # decided afresh from the values read: a fresh model's tree
        assert jax.tree_util.tree_structure(loaded) == jax.tree_util.tree_structure(
            make(Auto, 0)
        )


def test_an_eval_shape_template_loads_to_host_and_to_device():
    template = eqx.filter_eval_shape(make, Auto, 3)
    data = _bytes(make(Eqx, 0))
    loaded = eqx.tree_deserialise_leaves(io.BytesIO(data), template)
    assert_same_arrays(loaded, make(Auto, 0))
    assert jax.jit(lambda m: m.linear.weight + 1)(loaded).shape == (2, 2)


def test_a_filter_spec_above_the_modules_writes_and_reads_as_for_the_twin():
    # A prefix of functions (one per item of the tuple) reaches the Python values of
    # the modules below it, as it reaches an eqx.Module's.
    spec = (eqx.default_serialise_filter_spec, eqx.default_serialise_filter_spec)
    f = io.BytesIO()
    eqx.tree_serialise_leaves(f, (make(Auto, 1), 7), filter_spec=spec)
    g = io.BytesIO()
    eqx.tree_serialise_leaves(g, (make(Eqx, 1), 7), filter_spec=spec)
    assert f.getvalue() == g.getvalue()
    load = (eqx.default_deserialise_filter_spec, eqx.default_deserialise_filter_spec)
    g.seek(0)
    model, n = eqx.tree_deserialise_leaves(g, (make(Auto, 0, depth=9), 1), load)
    assert (n, model.depth, model.scale) == (7, 5, 0.5)
    assert_same_arrays(model, make(Auto, 1))
