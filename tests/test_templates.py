"""A tree mapped from a model (an `eqx.filter_eval_shape` tree, a filter spec of
bools, an `in_axes` tree of ints) flattens as the model does, and so do its copies,
deep copies and pickles, as the `eqx.Module` twin's do."""

import copy
import io
import pickle
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest

import autostatic as asx


def relu(x: jax.Array) -> jax.Array:  # a function: copies and pickles as itself
    return jnp.maximum(x, 0)


class Net(asx.AutoModule):
    linear: eqx.nn.Linear
    w: jax.Array
    sizes: list
    activation: Any

    def __init__(self, key: jax.Array):
        self.linear = eqx.nn.Linear(3, 3, key=key)
        self.w = jnp.ones(3)
        self.sizes = [3, 3]
        self.activation = relu


class Twin(eqx.Module):
    linear: eqx.nn.Linear
    w: jax.Array
    sizes: list = eqx.field(static=True)
    activation: Any = eqx.field(static=True)

    def __init__(self, key: jax.Array):
        self.linear = eqx.nn.Linear(3, 3, key=key)
        self.w = jnp.ones(3)
        self.sizes = [3, 3]
        self.activation = relu


KEY = jax.random.key(0)
TEMPLATES: dict[str, Callable[[type], Any]] = {
    "eval_shape": lambda cls: eqx.filter_eval_shape(cls, KEY),
    "filter spec": lambda cls: jax.tree.map(lambda _: True, cls(KEY)),
    "in_axes": lambda cls: jax.tree.map(lambda _: 0, cls(KEY)),
}
COPIES: dict[str, Callable[[Any], Any]] = {
    "copy": copy.copy,
    "deepcopy": copy.deepcopy,
    "pickle": lambda x: pickle.loads(pickle.dumps(x)),
}


@pytest.mark.parametrize("copied", COPIES.values(), ids=COPIES.keys())
@pytest.mark.parametrize("make", TEMPLATES.values(), ids=TEMPLATES.keys())
@pytest.mark.parametrize("cls", [Net, Twin], ids=["AutoModule", "eqx.Module"])
def test_a_copied_template_flattens_as_the_template(cls, make, copied):
    template = make(cls)
    leaves, treedef = jax.tree_util.tree_flatten(template)
    assert len(leaves) == 3  # the layer's weight and bias, and `w`
    again = copied(template)
    assert jax.tree_util.tree_structure(again) == treedef
    assert jax.tree_util.tree_leaves(again) == leaves


def test_a_copied_eval_shape_template_loads_a_checkpoint():
    model = Net(jax.random.key(1))
    file = io.BytesIO()
    asx.save(file, model)
    file.seek(0)
    loaded = asx.load(file, copy.deepcopy(TEMPLATES["eval_shape"](Net)))
    assert eqx.tree_equal(loaded, model)


def test_a_copied_filter_spec_partitions_the_model():
    model = Net(jax.random.key(1))
    spec = pickle.loads(pickle.dumps(TEMPLATES["filter spec"](Net)))
    spec = eqx.tree_at(lambda s: s.w, spec, False)
    trained, frozen = eqx.partition(model, spec)
    assert trained.w is None and frozen.w is model.w
    assert eqx.tree_equal(eqx.combine(trained, frozen), model)


def test_a_copied_in_axes_tree_batches_the_model():
    models = jax.vmap(Net)(jax.random.split(KEY, 4))
    in_axes = copy.copy(TEMPLATES["in_axes"](Net))
    out = jax.vmap(lambda m: m.activation(m.linear(m.w)), in_axes=(in_axes,))(models)
    assert out.shape == (4, 3)
