"""eqx.filter / eqx.partition / eqx.combine splice AutoModules as they splice
eqx.Modules: the non-array values go to the static half, so one model's arrays
combine with another's non-arrays. Each case side by side with the eqx.Module twin."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import autostatic as asx

from .helpers import keystrs


def _fields(base: type) -> type:
    class Model(base):
        linear: eqx.nn.Linear
        layers: list
        activation: Callable
        depth: int
        dropout: eqx.nn.Dropout

        def __call__(self, x):
            x = self.activation(self.linear(x))
            for layer in self.layers:
                x = layer(x) if callable(layer) else x * layer
            return x * self.depth

    return Model


Auto, Eqx = _fields(asx.AutoModule), _fields(eqx.Module)


def make(cls: type, activation: Callable, seed: int) -> Any:
    key = jax.random.key(seed)
    return cls(
        eqx.nn.Linear(2, 2, key=key),
        [eqx.nn.Linear(2, 2, key=jax.random.fold_in(key, 1)), activation, 3.0],
        activation,
        2,
        eqx.nn.Dropout(0.1),
    )


def _identity(x):
    return x


@pytest.mark.parametrize("cls", [Auto, Eqx], ids=["autostatic", "eqx"])
def test_arrays_of_one_model_with_the_non_arrays_of_another(cls):
    new, old = make(cls, jax.nn.relu, 1), make(cls, _identity, 0)
    spliced = eqx.combine(
        eqx.filter(new, eqx.is_array), eqx.filter(old, eqx.is_array, inverse=True)
    )
    assert type(spliced) is cls and type(spliced.linear) is eqx.nn.Linear
    assert spliced.activation is _identity and spliced.layers[1] is _identity
    np.testing.assert_array_equal(spliced.linear.weight, new.linear.weight)
    np.testing.assert_array_equal(spliced.layers[0].bias, new.layers[0].bias)
    x = jnp.ones(2)
    expected = old.depth * (new.layers[0](new.linear(x))) * 3.0
    np.testing.assert_allclose(spliced(x), expected, rtol=1e-6)


def test_static_half_holds_the_non_arrays_as_eqx_module_s_does():
    auto, ref = make(Auto, jax.nn.relu, 0), make(Eqx, jax.nn.relu, 0)
    arrays, rest = eqx.partition(auto, eqx.is_array)
    ref_arrays, ref_rest = eqx.partition(ref, eqx.is_array)
    assert keystrs(rest) == keystrs(ref_rest)
    assert jax.tree_util.tree_leaves(rest) == jax.tree_util.tree_leaves(ref_rest)
    assert rest.linear.weight is None and rest.activation is jax.nn.relu
    assert keystrs(arrays) == keystrs(eqx.filter(ref_arrays, eqx.is_array))
    # The array half has the model's own treedef: that of its gradients.
    assert jax.tree_util.tree_structure(arrays) == jax.tree_util.tree_structure(auto)
    again = eqx.combine(arrays, rest)
    assert jax.tree_util.tree_structure(again) == jax.tree_util.tree_structure(auto)
    assert again.activation is jax.nn.relu and eqx.tree_equal(again, auto)
    # Either order, as with eqx.Module.
    assert eqx.tree_equal(eqx.combine(rest, arrays), auto)


def test_the_array_half_holds_none_for_each_static_value_as_eqx_module_s_does():
    auto, ref = make(Auto, jax.nn.relu, 0), make(Eqx, jax.nn.relu, 0)
    arrays, ref_arrays = eqx.filter(auto, eqx.is_array), eqx.filter(ref, eqx.is_array)
    assert arrays.activation is ref_arrays.activation is None
    assert arrays.depth is ref_arrays.depth is None
    assert arrays.layers[1] is ref_arrays.layers[1] is None
    assert type(arrays.linear) is eqx.nn.Linear
    assert jax.tree_util.tree_structure(arrays) == jax.tree_util.tree_structure(auto)
    assert eqx.tree_equal(
        eqx.combine(arrays, eqx.filter(auto, eqx.is_array, True)), auto
    )


def _held_fields(base: type) -> type:
    class Held(base):
        weight: jax.Array
        count: int
        config: dict
        sizes: tuple
        mixed: list
        linear: eqx.nn.Linear
        marked: str = eqx.field(static=True)

    return Held


_Held, _EqxHeld = _held_fields(asx.AutoModule), _held_fields(eqx.Module)


def _held(cls: type) -> Any:
    key = jax.random.key(0)
    return cls(
        jnp.ones(2),
        3,
        {"a": 1, "b": (2.0, "x"), "f": jax.nn.relu},
        (4, 5),
        [jnp.zeros(1), 6, None, eqx.nn.Linear(1, 1, key=key)],
        eqx.nn.Linear(2, 2, key=key),
        "kept",
    )


@pytest.mark.parametrize("replace", [None, 0, "R"])
def test_the_array_half_reads_as_the_unmarked_twin_s_for_any_replace(replace):
    auto, twin = _held(_Held), _held(_EqxHeld)
    half = eqx.filter(auto, eqx.is_array, replace=replace)
    twin_half = eqx.filter(twin, eqx.is_array, replace=replace)
    for name in ("weight", "count", "config", "sizes", "mixed", "linear", "marked"):
        ours, theirs = getattr(half, name), getattr(twin_half, name)
        assert jax.tree_util.tree_structure(ours) == jax.tree_util.tree_structure(
            theirs
        ), name
        assert eqx.tree_equal(ours, theirs), name
    # Its treedef stays the model's (the gradients'), whatever `replace` is.
    assert jax.tree_util.tree_structure(half) == jax.tree_util.tree_structure(auto)


class _Operator(asx.AutoModule):
    fn: Callable
    scale: float


class _EqxOperator(eqx.Module):
    fn: Callable
    scale: float


@pytest.mark.parametrize("cls", [_Operator, _EqxOperator], ids=["auto", "eqx"])
def test_array_halves_made_in_two_cond_branches_have_one_static_half(cls):
    # optimistix's L-BFGS: each branch of its `filter_cond` builds a lineax operator
    # (a closure-converted function: a new jaxpr) and returns its array half; the
    # static halves of the two outputs, compared in `eqxi.Static`, must be equal.
    import equinox.internal as eqxi

    def branch(k: float) -> Callable:
        def run(x):
            z = x * k  # closed over: the two programs print alike, as optimistix's
            fn = eqx.filter_closure_convert(lambda y: y * z, jnp.zeros(()))
            out = eqx.filter(cls(fn, 2.0), eqx.is_array)
            dynamic, static = eqx.partition(out, eqx.is_array)
            return dynamic, eqxi.Static(static)

        return run

    def cond(pred, x):
        dynamic, static = jax.lax.cond(pred, branch(1.0), branch(2.0), x)
        return eqx.combine(dynamic, static.value)

    out = jax.jit(cond)(False, jnp.ones(()))
    assert type(out) is cls


def test_the_static_half_can_be_a_static_argument_of_plain_jit():
    model = make(Auto, jax.nn.relu, 0)
    arrays, rest = eqx.partition(model, eqx.is_array)
    run = jax.jit(lambda a, r, x: eqx.combine(a, r)(x), static_argnums=1)
    np.testing.assert_allclose(run(arrays, rest, jnp.ones(2)), model(jnp.ones(2)))


def test_the_optax_loop_of_equinox_s_docs_runs_unchanged():
    model = make(Auto, jax.nn.relu, 0)
    optimiser = optax.adam(1e-2)
    state = optimiser.init(eqx.filter(model, eqx.is_inexact_array))

    @eqx.filter_jit
    def step(model, state, x):
        grads = eqx.filter_grad(lambda m: jnp.sum(m(x)))(model)
        updates, state = optimiser.update(
            grads, state, eqx.filter(model, eqx.is_inexact_array)
        )
        return eqx.apply_updates(model, updates), state

    for _ in range(2):
        model, state = step(model, state, jnp.ones(2))
    assert type(model) is Auto and model.activation is jax.nn.relu
    # And with plain jax.jit and jax.grad.
    grads = jax.jit(jax.grad(lambda m: jnp.sum(m(jnp.ones(2)))))(model)
    updates, state = optimiser.update(grads, state, model)
    assert type(eqx.apply_updates(model, updates)) is Auto


def test_a_pytree_filter_spec_trains_the_last_layer():
    model = make(Auto, jax.nn.relu, 0)
    spec = jax.tree_util.tree_map(lambda _: False, model)
    spec = eqx.tree_at(
        lambda t: (t.layers[0].weight, t.layers[0].bias), spec, replace=(True, True)
    )
    trainable, frozen = eqx.partition(model, spec)
    grads = jax.grad(lambda t: jnp.sum(eqx.combine(t, frozen)(jnp.ones(2))))(trainable)
    assert grads.linear.weight is None and grads.layers[0].weight.shape == (2, 2)


def test_filter_keeps_declared_static_fields_out_of_reach():
    class Marked(asx.AutoModule):
        w: jax.Array
        size: int = eqx.field(static=True)
        tag: str = "t"

    model = Marked(jnp.ones(2), 3)
    rest = eqx.filter(model, eqx.is_array, inverse=True)
    assert keystrs(rest) == [".tag"] and rest.size == 3


@pytest.mark.parametrize("base", [asx.AutoModule, eqx.Module], ids=["auto", "eqx"])
def test_is_leaf_stops_the_filter_at_a_module(base):
    # Equinox's own test of `is_leaf`: the spec sees the whole module.
    class Holder(base):
        value: Any

    def spec(x):
        return x.value == 1 if isinstance(x, Holder) else True

    tree = [Holder(1), Holder(2), 3]
    is_holder = lambda x: isinstance(x, Holder)
    assert eqx.filter(tree, spec, is_leaf=is_holder) == [Holder(1), None, 3]
    kept, rest = eqx.partition(tree, spec, is_leaf=is_holder)
    assert kept == [Holder(1), None, 3] and rest == [None, Holder(2), None]


class _Operator(eqx.Module):  # an unported module holding no array (a lineax operator)
    fn: Callable
    size: int


@pytest.mark.parametrize("base", [asx.AutoModule, eqx.Module])
def test_static_half_first_combines_a_field_without_arrays(base):
    # optimistix's loop: partition the solver state once, carry the array half
    # through lax.while_loop, combine(static_half, array_half) in the body.
    class State(base):
        y: jax.Array
        operator: _Operator

    state = State(jnp.ones(2), _Operator(jnp.sin, 2))
    dynamic, static = eqx.partition(state, eqx.is_array)

    def body(d):
        s = eqx.combine(static, d)
        return eqx.partition(State(s.operator.fn(s.y), s.operator), eqx.is_array)[0]

    out = eqx.combine(static, jax.lax.while_loop(lambda d: False, body, dynamic))
    out = eqx.combine(static, body(dynamic))
    assert out.operator.fn is jnp.sin and out.operator.size == 2
    np.testing.assert_allclose(out.y, jnp.sin(jnp.ones(2)))


class _Inner(asx.AutoModule):
    w: jax.Array
    activation: Callable
    size: int


class _InnerTwin(eqx.Module):  # unmarked: Equinox's filter sees every leaf
    w: jax.Array
    activation: Callable
    size: int


class _Outer(eqx.Module):  # a user's module that AutoModule never touched
    child: Any
    scale: jax.Array


def _nested(inner: type, where: str) -> Any:
    w, scale = jnp.arange(3.0), jnp.ones(())
    module = inner(w, jax.nn.relu, 3)
    if where == "root":
        return module
    if where == "in an eqx.Module":
        return _Outer(module, scale)
    return [_Outer({"a": [1, module]}, scale), "tag"]


@pytest.mark.parametrize("where", ["root", "in an eqx.Module", "deep in containers"])
def test_filter_and_partition_find_an_automodule_anywhere(where):
    # Equinox's own filter runs first and is stopped at the first AutoModule: the
    # halves are the unmarked twin's wherever it sits.
    ours, twin = _nested(_Inner, where), _nested(_InnerTwin, where)
    for split in (
        lambda t: eqx.partition(t, eqx.is_array),
        lambda t: (eqx.filter(t, eqx.is_array), eqx.filter(t, eqx.is_array, True)),
    ):
        for half, twin_half in zip(split(ours), split(twin)):
            assert keystrs(half) == keystrs(twin_half)
            leaves = jax.tree_util.tree_leaves(half)
            assert len(leaves) == len(jax.tree_util.tree_leaves(twin_half))
            for a, b in zip(leaves, jax.tree_util.tree_leaves(twin_half)):
                assert a is b or (eqx.is_array(a) and np.array_equal(a, b))
        dynamic, static = split(ours)
        assert eqx.tree_equal(eqx.combine(dynamic, static), ours)


def test_is_leaf_that_stops_above_an_automodule_filters_as_equinox_does():
    # The user's is_leaf stops the walk at the list holding the AutoModule: Equinox's
    # filter gives the spec the whole list, as it does in a tree of eqx.Modules.
    tree = [[_Inner(jnp.ones(2), jax.nn.relu, 2)], jnp.zeros(1)]
    is_list = lambda x: isinstance(x, list) and x is not tree
    got = eqx.filter(tree, lambda x: isinstance(x, list), is_leaf=is_list)
    assert got[0] is tree[0] and got[1] is None
    kept, rest = eqx.partition(tree, lambda x: isinstance(x, list), is_leaf=is_list)
    assert kept[0] is tree[0] and rest == [None, tree[1]]


def _kept(tree: Any) -> list[tuple[str, Any]]:
    """The key paths of a filtered tree's leaves, with each non-array leaf."""
    return [
        (jax.tree_util.keystr(path), None if eqx.is_array(leaf) else leaf)
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
    ]


def _is_linear(x: Any) -> bool:
    return isinstance(x, eqx.nn.Linear)


def _holder(base: type) -> type:
    class Inner(base):
        mlp: eqx.nn.MLP

    class Holder(base):
        linear: eqx.nn.Linear  # a layer in a field of its own
        linears: list
        attention: eqx.nn.MultiheadAttention  # layers inside a layer
        inner: Inner  # layers inside a nested module
        dropout: eqx.nn.Dropout

    return Holder, Inner


@pytest.mark.parametrize("base", [asx.AutoModule, eqx.Module], ids=["auto", "eqx"])
def test_a_filter_takes_whole_layers_where_is_leaf_stops_at_them(base):
    holder, inner = _holder(base)
    keys = jax.random.split(jax.random.key(0), 4)
    model = holder(
        eqx.nn.Linear(2, 2, key=keys[0]),
        [eqx.nn.Linear(2, 2, key=keys[1])],
        eqx.nn.MultiheadAttention(1, 2, key=keys[2]),
        inner(eqx.nn.MLP(2, 2, 2, 1, key=keys[3])),
        eqx.nn.Dropout(0.5),
    )
    linears, rest = eqx.partition(model, _is_linear, is_leaf=_is_linear)
    paths = [path for path, _ in _kept(linears)]
    assert ".linear.weight" in paths and ".linears[0].weight" in paths
    assert ".attention.query_proj.weight" in paths
    assert ".inner.mlp.layers[0].weight" in paths
    assert eqx.tree_equal(eqx.combine(linears, rest, is_leaf=_is_linear), model)
    # A layer kept whole keeps its static values.
    is_dropout = lambda x: isinstance(x, eqx.nn.Dropout)
    kept = eqx.filter(model, is_dropout, is_leaf=is_dropout)
    assert kept.dropout.p == 0.5


def _with_layers(base: type) -> Any:
    holder, inner = _holder(base)
    keys = jax.random.split(jax.random.key(0), 3)
    return holder(
        eqx.nn.Linear(2, 2, key=keys[0]),
        [],
        eqx.nn.MultiheadAttention(1, 2, key=keys[1]),
        inner(eqx.nn.MLP(2, 2, 2, 1, key=keys[2])),
        eqx.nn.Dropout(0.5),
    )


@pytest.mark.parametrize(
    "spec",
    [lambda x: isinstance(x, float), callable, lambda x: isinstance(x, bool)],
    ids=["floats", "callables", "bools"],
)
def test_a_filter_keeps_the_non_arrays_of_held_layers_as_equinox_s_does(spec):
    auto, twin = _with_layers(asx.AutoModule), _with_layers(eqx.Module)
    kept = _kept(eqx.filter(auto, spec))
    assert kept == _kept(eqx.filter(twin, spec))
    assert kept  # a dropout's rate, an MLP's activations, a dropout's flag
    halves = eqx.partition(auto, spec)
    assert [_kept(half) for half in halves] == [
        _kept(half) for half in eqx.partition(twin, spec)
    ]


KEY = jax.random.key(0)


class _Split(asx.AutoModule):
    activation: Callable
    n: int
    dropout: eqx.nn.Dropout
    linear: eqx.nn.Linear

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.dropout(self.activation(self.linear(x)), inference=True) * self.n


@pytest.mark.parametrize(
    "spec",
    [eqx.is_array, callable, lambda x: isinstance(x, int)],
    ids=["is_array", "callable", "is int"],
)
def test_halves_that_each_keep_static_values_combine_to_the_model(spec):
    # Halves of one structure (each in the exposed form) are joined by Equinox's own
    # combine; the result is decided afresh, so plain `jax.jit` takes it.
    model = _Split(jnp.tanh, 2, eqx.nn.Dropout(0.5), eqx.nn.Linear(2, 2, key=KEY))
    combined = eqx.combine(*eqx.partition(model, spec))
    treedef = jax.tree_util.tree_structure(model)
    assert jax.tree_util.tree_structure(combined) == treedef
    x = jnp.ones(2)
    np.testing.assert_allclose(jax.jit(_Split.__call__)(combined, x), model(x))


@pytest.mark.parametrize("cls", [Auto, Eqx], ids=["autostatic", "eqx"])
def test_the_arrays_of_one_model_combine_with_another_whole_model(cls):
    # Equinox's combine takes each leaf from the first tree that has one: the array
    # half holds `None` for every non-array, so they come from the second model.
    new, old = make(cls, jax.nn.relu, 1), make(cls, _identity, 0)
    spliced = eqx.combine(eqx.filter(new, eqx.is_array), old)
    assert spliced.activation is _identity and spliced.depth == 2
    np.testing.assert_array_equal(spliced.linear.weight, new.linear.weight)
