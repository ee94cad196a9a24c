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
from jaxtyping import ArrayLike, Int

import autostatic as asx


def relu(x: jax.Array) -> jax.Array:  # a function: copies and pickles as itself
    return jnp.maximum(x, 0)


class Net(asx.AutoModule):
    linear: eqx.nn.Linear
    w: jax.Array
    sizes: list
    activation: Any
    params: dict  # a container child: its leaves are looked at when first asked

    def __init__(self, key: jax.Array):
        self.linear = eqx.nn.Linear(3, 3, key=key)
        self.w = jnp.ones(3)
        self.sizes = [3, 3]
        self.activation = relu
        self.params = {"a": jnp.ones(2), "b": [jnp.zeros(1), None]}


class Twin(eqx.Module):
    linear: eqx.nn.Linear
    w: jax.Array
    sizes: list = eqx.field(static=True)
    activation: Any = eqx.field(static=True)
    params: dict

    def __init__(self, key: jax.Array):
        self.linear = eqx.nn.Linear(3, 3, key=key)
        self.w = jnp.ones(3)
        self.sizes = [3, 3]
        self.activation = relu
        self.params = {"a": jnp.ones(2), "b": [jnp.zeros(1), None]}


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
    assert len(leaves) == 5  # the layer's weight and bias, `w`, and two in `params`
    again = copied(template)
    assert jax.tree_util.tree_structure(again) == treedef
    assert jax.tree_util.tree_leaves(again) == leaves


class Params(asx.AutoModule):
    params: dict
    activation: Any


class ParamsTwin(eqx.Module):
    params: dict
    activation: Any = eqx.field(static=True)


PARAMS = {"a": jnp.ones(2), "b": [jnp.zeros(1), None]}
CONTAINER_TEMPLATES: dict[str, Callable[[type], Any]] = {
    "eval_shape": lambda cls: eqx.filter_eval_shape(cls, PARAMS, relu),
    "filter spec": lambda cls: jax.tree.map(lambda _: True, cls(PARAMS, relu)),
    "in_axes": lambda cls: jax.tree.map(lambda _: 0, cls(PARAMS, relu)),
}


AS_IS_OR_COPIES = {"as it is": lambda x: x, **COPIES}


@pytest.mark.parametrize("copied", AS_IS_OR_COPIES.values(), ids=AS_IS_OR_COPIES.keys())
@pytest.mark.parametrize(
    "make", CONTAINER_TEMPLATES.values(), ids=CONTAINER_TEMPLATES.keys()
)
@pytest.mark.parametrize("cls", [Params, ParamsTwin], ids=["AutoModule", "eqx.Module"])
def test_a_template_copied_before_any_flatten_flattens_as_the_model(cls, make, copied):
    # Where every child that is no array is a container, the template is told apart
    # by its containers' leaves: as it is, and copied before any flatten.
    treedef = jax.tree_util.tree_structure(cls(PARAMS, relu))
    again = copied(make(cls))
    assert jax.tree_util.tree_structure(again) == treedef
    assert len(jax.tree_util.tree_leaves(again)) == 2


class Layers(asx.AutoModule):
    first: eqx.nn.Linear
    rest: list
    stack: eqx.nn.Sequential  # its layers are templates, not the Sequential

    def __init__(self, key: jax.Array):
        self.first = eqx.nn.Linear(2, 3, key=key)
        self.rest = [eqx.nn.Linear(3, 3, key=key), eqx.nn.Linear(3, 1, key=key)]
        self.stack = eqx.nn.Sequential(
            [eqx.nn.Linear(1, 2, key=key), eqx.nn.Linear(2, 1, key=key)]
        )


class LayersTwin(eqx.Module):
    first: eqx.nn.Linear
    rest: list
    stack: eqx.nn.Sequential

    __init__ = Layers.__init__


@pytest.mark.parametrize("copied", COPIES.values(), ids=COPIES.keys())
@pytest.mark.parametrize("make", TEMPLATES.values(), ids=TEMPLATES.keys())
@pytest.mark.parametrize("cls", [Layers, LayersTwin], ids=["AutoModule", "eqx.Module"])
def test_a_copied_tree_of_layers_mapped_from_a_model_keeps_their_leaves(
    cls, make, copied
):
    # Only its layers are templates: the module holding them decides from its values.
    template = make(cls)
    leaves, treedef = jax.tree_util.tree_flatten(template)
    assert len(leaves) == 10
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


class Listed(asx.AutoModule):
    xs: list


def test_a_template_of_a_list_field_first_met_holding_ints_keeps_its_leaves():
    # The class's generated flatten takes a list of ints in `xs` as a static
    # sequence: a filter spec's bools or an `in_axes` tree's ints in its place are
    # still the template's leaves.
    jax.tree_util.tree_structure(Listed([1, 2]))
    model = Listed([jnp.ones(2), jnp.ones(3)])
    treedef = jax.tree_util.tree_structure(model)
    for leaf in (True, 0):
        template = jax.tree.map(lambda _, leaf=leaf: leaf, model)
        assert jax.tree_util.tree_structure(template) == treedef
    trained, frozen = eqx.partition(model, jax.tree.map(lambda _: True, model))
    assert eqx.tree_equal(eqx.combine(trained, frozen), model)


@pytest.mark.parametrize(
    "rebuild",
    [lambda m: jax.tree.map(lambda x: x * 2, m), jax.jit(lambda m: m)],
    ids=["tree_map", "jax.jit"],
)
def test_a_rebuilt_model_changed_in_place_splits_as_a_built_one(rebuild):
    # A model JAX rebuilt (a jit output) whose dict is then given a static leaf in
    # place splits as the same model built directly: it is no template.
    def make() -> Params:
        return Params({"a": jnp.ones(2)}, relu)

    built, rebuilt = make(), rebuild(make())
    built.params["name"] = "relu"
    rebuilt.params["name"] = "relu"
    assert jax.tree_util.tree_structure(rebuilt) == jax.tree_util.tree_structure(built)
    assert jax.jit(lambda m: m.params["a"] + 1)(rebuilt).shape == (2,)


class Mixed(asx.AutoModule):
    records: list  # (array, function, int) records: split by column
    items: list  # arrays and a function: split item by item
    functions: list  # static whole
    names: dict  # static whole, with structure
    nested: dict  # arrays and a function below a dict

    def __init__(self):
        self.records = [(jnp.ones(2), relu, 3), (jnp.zeros(2), relu, 4)]
        self.items = [jnp.ones(1), relu]
        self.functions = [relu, max]
        self.names = {"activation": relu, "reduce": max}
        self.nested = {"a": [jnp.ones(3), relu], "b": str.upper}


class MixedTwin(eqx.Module):
    records: list
    items: list
    functions: list
    names: dict
    nested: dict

    __init__ = Mixed.__init__


@pytest.mark.parametrize("copied", COPIES.values(), ids=COPIES.keys())
@pytest.mark.parametrize(
    "make",
    [eqx.filter_eval_shape, lambda cls: jax.tree.map(lambda _: 0, cls())],
    ids=["eval_shape", "in_axes"],
)
@pytest.mark.parametrize("cls", [Mixed, MixedTwin], ids=["AutoModule", "eqx.Module"])
def test_a_template_of_static_functions_in_containers_copies(cls, make, copied):
    # The aux of a mixed field holds its static leaves' types, a function's among
    # them, which pickle cannot write by reference.
    template = make(cls)
    leaves, treedef = jax.tree_util.tree_flatten(template)
    again = copied(template)
    assert jax.tree_util.tree_structure(again) == treedef
    assert jax.tree_util.tree_leaves(again) == leaves


class Counted(asx.AutoModule):
    w: jax.Array
    history: list
    tags: list
    num_steps: Int[ArrayLike, ""] = 0  # loop state: a leaf, as in an `eqx.Module`


class CountedTwin(eqx.Module):
    w: jax.Array
    history: list
    tags: list
    num_steps: Int[ArrayLike, ""] = 0


def _grad_step(model: Any) -> Any:
    grads = eqx.filter_grad(lambda m: jnp.sum(m.w**2))(model)
    return eqx.apply_updates(model, grads)


@pytest.mark.parametrize(
    "mapped",
    [_grad_step, lambda m: jax.tree.map(lambda x: x, m)],
    ids=["apply_updates", "identity map"],
)
def test_a_model_holding_a_number_as_loop_state_stays_a_model_when_mapped(mapped):
    """A Python number in a field annotated to hold arrays is a leaf, as in an
    `eqx.Module`: a tree mapped from the model that keeps it, and its arrays, is a
    model still, whose containers changed in place are seen by `jax.jit` as by eager
    code (a template's would be the ones it was unflattened with)."""

    def run(cls: type, jit: Callable[..., Any]) -> tuple[Any, ...]:
        model = mapped(cls(jnp.ones(2), [], [1, jnp.ones(2)]))
        model.history.append("step-1")
        model.tags[0] = 7
        eager = model.tags[0] * model.w + len(model.history)
        jitted = jit(lambda m: m.tags[0] * m.w + len(m.history))(model)
        flat = jax.tree_util.tree_flatten_with_path(model)[0]
        paths = [jax.tree_util.keystr(p) for p, _ in flat]
        return eager.tolist(), jitted.tolist(), paths

    ours, expected = run(Counted, jax.jit), run(CountedTwin, eqx.filter_jit)
    assert ours[0] == ours[1] == expected[0] == expected[1]
    # The twin's strings and ints are leaves too; its arrays' paths are ours.
    assert ours[2] == [p for p in expected[2] if p not in (".history[0]", ".tags[0]")]


def test_a_spec_of_a_model_holding_a_number_as_loop_state_filters_it():
    # Labels everywhere, no array: a tree of labels mapped from the model, a prefix.
    found = []
    for cls in (Counted, CountedTwin):
        model = cls(jnp.ones(2), ["a"], [1, jnp.ones(2)])
        spec = jax.tree.map(lambda x: not isinstance(x, int), model)
        kept = jax.tree_util.tree_flatten_with_path(eqx.filter(model, spec))[0]
        found.append([jax.tree_util.keystr(p) for p, x in kept if eqx.is_array(x)])
    assert found[0] == found[1] == [".w", ".tags[1]"]
