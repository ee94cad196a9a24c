"""Semantics 9: surgery on static values, inference mode, stateful layers."""

import subprocess
import sys
import warnings
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import autostatic as asx

from .helpers import AutoMLP, keystrs, TraceCounter

KEY = jax.random.key(0)


class Net(asx.AutoModule):
    norm: eqx.nn.BatchNorm
    dropout: eqx.nn.Dropout
    linear: eqx.nn.Linear

    def __init__(self, key):
        self.norm = eqx.nn.BatchNorm(3, "batch", mode="batch")
        self.dropout = eqx.nn.Dropout(0.4)
        self.linear = eqx.nn.Linear(3, 1, key=key)

    def __call__(self, x, state, *, key):
        x, state = self.norm(x, state)
        x = self.dropout(x, key=key)
        return self.linear(x), state


class EqxNet(eqx.Module):
    norm: eqx.nn.BatchNorm
    dropout: eqx.nn.Dropout
    linear: eqx.nn.Linear

    __init__ = Net.__init__
    __call__ = Net.__call__


def _apply(model, xs, state, key):
    return jax.vmap(
        lambda x, s: model(x, s, key=key),
        in_axes=(0, None),
        out_axes=(0, None),
        axis_name="batch",
    )(xs, state)


def test_tree_at_replaces_static_values():
    net = Net(KEY)
    new = asx.tree_at(lambda m: m.dropout.p, net, 0.2)
    assert new.dropout.p == 0.2 and net.dropout.p == 0.4
    assert keystrs(new) == keystrs(net)
    both = asx.tree_at(
        lambda m: (m.dropout.p, m.linear.weight), net, (0.1, jnp.zeros((1, 3)))
    )
    assert both.dropout.p == 0.1 and jnp.all(both.linear.weight == 0)


def test_tree_at_repartitions_what_changed():
    net = Net(KEY)
    # A float replaced by an array becomes dynamic ...
    as_array = asx.tree_at(lambda m: m.dropout.p, net, jnp.array(0.3))
    assert ".dropout.p" in keystrs(as_array)
    # ... and back.
    back = asx.tree_at(lambda m: m.dropout.p, as_array, 0.3)
    assert ".dropout.p" not in keystrs(back)
    # An array-free submodule that gains arrays becomes dynamic.
    model = AutoMLP(1, 2, KEY)
    swapped = asx.tree_at(lambda m: m.layers[0].activation, model, eqx.nn.PReLU())
    assert ".layers[0].activation.negative_slope" in keystrs(swapped)


def test_tree_at_replace_fn_and_is_leaf():
    model = AutoMLP(2, 2, KEY, scale=2.0)
    new = asx.tree_at(lambda m: m.scale, model, replace_fn=lambda s: s * 3)
    assert new.scale == 6.0
    new = asx.tree_at(lambda m: m.layers[1].sizes, model, replace_fn=lambda s: [*s, 9])
    assert new.layers[1].sizes == [2, 2, 9] and type(new.layers[1].sizes) is list
    assert model.layers[1].sizes == [2, 2]


def test_inference_mode_sets_every_flag():
    net = Net(KEY)
    inf = asx.inference_mode(net)
    assert inf.dropout.inference and inf.norm.inference
    assert not net.dropout.inference and not net.norm.inference
    train = asx.inference_mode(inf, value=False)
    assert jax.tree_util.tree_structure(train) == jax.tree_util.tree_structure(net)
    assert keystrs(inf) == keystrs(net)


def test_inference_mode_changes_behaviour_under_plain_jit():
    xs = jax.random.normal(jax.random.key(5), (4, 3))
    model, state = eqx.nn.make_with_state(Net)(KEY)
    inf = asx.inference_mode(model)
    run = jax.jit(_apply)
    a, _ = run(inf, xs, state, jax.random.key(1))
    b, _ = run(inf, xs, state, jax.random.key(2))
    np.testing.assert_allclose(a, b)  # no dropout in inference mode
    c, _ = run(model, xs, state, jax.random.key(1))
    d, _ = run(model, xs, state, jax.random.key(2))
    assert not np.allclose(c, d)


def test_stateful_layers_under_plain_jit_and_filter_jit_match_eqx():
    model, state = eqx.nn.make_with_state(Net)(KEY)
    ref, ref_state = eqx.nn.make_with_state(EqxNet)(KEY)
    xs = jax.random.normal(jax.random.key(3), (5, 3))
    key = jax.random.key(4)
    out, new_state = jax.jit(_apply)(model, xs, state, key)
    ref_out, ref_new_state = eqx.filter_jit(_apply)(ref, xs, ref_state, key)
    np.testing.assert_allclose(out, ref_out, rtol=1e-6)
    out2, _ = eqx.filter_jit(_apply)(model, xs, state, key)
    np.testing.assert_allclose(out2, ref_out, rtol=1e-6)
    for a, b in zip(
        jax.tree_util.tree_leaves(new_state), jax.tree_util.tree_leaves(ref_new_state)
    ):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_stateful_layer_steps_do_not_retrace():
    model, state = eqx.nn.make_with_state(Net)(KEY)
    counter = TraceCounter(_apply)
    run = jax.jit(counter)
    xs = jnp.ones((2, 3))
    for i in range(3):
        _, state = run(model, xs, state, jax.random.key(i))
    assert counter.count == 1


def test_spectral_norm_inside_automodule():
    class SN(asx.AutoModule):
        layer: eqx.nn.SpectralNorm

        def __init__(self, key):
            k1, k2 = jax.random.split(key)
            self.layer = eqx.nn.SpectralNorm(
                eqx.nn.Linear(3, 3, key=k1), "weight", key=k2
            )

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, state = eqx.nn.make_with_state(SN)(KEY)
    out, state = jax.jit(lambda m, x, s: m.layer(x, s))(model, jnp.ones(3), state)
    assert out.shape == (3,)


def test_eqx_tree_at_replaces_a_sub_node_of_a_mixed_attribute_as_in_equinox():
    key = jax.random.key(0)

    class Stack(asx.AutoModule):
        layers: list

        def __init__(self):
            self.layers = [
                eqx.nn.Linear(2, 8, key=key),
                jax.nn.relu,
                eqx.nn.Linear(8, 1, key=key),
            ]

    class EqxStack(eqx.Module):
        layers: list
        __init__ = Stack.__init__

    new_last = eqx.nn.Linear(8, 3, key=key)
    auto = eqx.tree_at(lambda m: m.layers[-1], Stack(), new_last)
    ref = eqx.tree_at(lambda m: m.layers[-1], EqxStack(), new_last)
    assert auto.layers[-1].weight.shape == ref.layers[-1].weight.shape == (3, 8)
    assert auto.layers[1] is jax.nn.relu
    assert keystrs(auto) == [p for p in keystrs(ref) if not p.startswith(".layers[1]")]
    out = jax.jit(lambda m, x: m.layers[2](m.layers[1](m.layers[0](x))))(
        auto, jnp.ones(2)
    )
    assert out.shape == (3,)


# Equinox's own calls, routed: the same results as for the eqx.Module twin.


class Inner(asx.AutoModule):
    dropout: eqx.nn.Dropout
    scale: float

    def __init__(self):
        self.dropout = eqx.nn.Dropout(0.5)
        self.scale = 2.0

    def __call__(self, x, key):
        return self.scale * self.dropout(x, key=key)


class Mixed(asx.AutoModule):
    dropout: eqx.nn.Dropout  # all static: a Python float and a bool
    layers: list  # mixed: a Linear, a function and a Dropout
    norm: eqx.nn.BatchNorm
    inner: Inner
    activation: object

    def __init__(self, key):
        self.dropout = eqx.nn.Dropout(0.5)
        self.layers = [eqx.nn.Linear(3, 3, key=key), jax.nn.relu, eqx.nn.Dropout(0.5)]
        self.norm = eqx.nn.BatchNorm(3, "batch")
        self.inner = Inner()
        self.activation = jax.nn.tanh

    def __call__(self, x, state, key):
        k1, k2, k3 = jax.random.split(key, 3)
        x = self.dropout(x, key=k1)
        x = self.layers[2](self.layers[1](self.layers[0](x)), key=k2)
        x, state = self.norm(x, state)
        return self.activation(self.inner(x, k3)), state


def _run_mixed(model, state, key):
    xs = jax.random.normal(jax.random.key(9), (4, 3))
    return jax.vmap(lambda x: model(x, state, key)[0], axis_name="batch")(xs)


def _flags(model):
    return [
        model.dropout.inference,
        model.layers[2].inference,
        model.norm.inference,
        model.inner.dropout.inference,
    ]


@pytest.mark.parametrize(
    "switch",
    [
        eqx.nn.inference_mode,
        lambda m, value=True: eqx.tree_inference(m, value),
        lambda m, value=True: eqx.nn.inference_mode(m, value=value),
    ],
    ids=["eqx.nn.inference_mode", "eqx.tree_inference", "value="],
)
def test_eqx_inference_mode_switches_every_flag(switch):
    model, state = eqx.nn.make_with_state(Mixed)(KEY)
    inf = switch(model)
    assert _flags(inf) == [True] * 4 and _flags(model) == [False] * 4
    ref = asx.inference_mode(model)
    assert jax.tree_util.tree_structure(inf) == jax.tree_util.tree_structure(ref)
    assert keystrs(inf) == keystrs(model)
    run = jax.jit(_run_mixed)  # plain jax.jit: the flags are static, not leaves
    a = run(inf, state, jax.random.key(1))
    b = run(inf, state, jax.random.key(2))
    np.testing.assert_allclose(a, b)  # nothing random is left
    train = switch(inf, value=False)
    assert _flags(train) == [False] * 4
    assert jax.tree_util.tree_structure(train) == jax.tree_util.tree_structure(model)
    assert not np.allclose(
        run(train, state, jax.random.key(1)), run(train, state, jax.random.key(2))
    )


def test_eqx_inference_mode_on_plain_equinox_trees_is_equinox_s():
    net = eqx.nn.Sequential([eqx.nn.Linear(2, 2, key=KEY), eqx.nn.Dropout(0.3)])
    inf = eqx.nn.inference_mode(net)
    assert inf.layers[1].inference and not net.layers[1].inference
    assert eqx.nn.inference_mode is not asx.inference_mode


@pytest.mark.parametrize(
    ("where", "replace", "read"),
    [
        (lambda m: m.dropout.p, 0.2, lambda m: m.dropout.p),
        (lambda m: m.activation, jax.nn.relu, lambda m: m.activation),
        (lambda m: m.layers[1], jax.nn.gelu, lambda m: m.layers[1]),
        (lambda m: m.layers[2].p, 0.1, lambda m: m.layers[2].p),
        (lambda m: m.inner.scale, 3.0, lambda m: m.inner.scale),
        (lambda m: m.dropout, eqx.nn.Dropout(0.9), lambda m: m.dropout.p),
        (lambda m: m.layers[2], eqx.nn.Dropout(0.9), lambda m: m.layers[2].p),
    ],
    ids=[
        "dropout.p",
        "activation",
        "relu-in-mixed-list",
        "p-in-mixed-list",
        "nested",
        "static-submodule",
        "dropout-in-mixed-list",
    ],
)
def test_eqx_tree_at_replaces_static_values_as_autostatic_tree_at(where, replace, read):
    model, state = eqx.nn.make_with_state(Mixed)(KEY)
    new = eqx.tree_at(where, model, replace)
    ref = asx.tree_at(where, model, replace)
    assert jax.tree_util.tree_structure(new) == jax.tree_util.tree_structure(ref)
    assert eqx.tree_equal(new, ref)
    expected = replace.p if isinstance(replace, eqx.nn.Dropout) else replace
    assert read(new) == expected and read(model) != expected
    assert keystrs(new) == keystrs(model)  # still static: no new leaves
    jax.jit(_run_mixed)(new, state, jax.random.key(0))  # plain jit takes it


class Leafless(asx.AutoModule):
    """Fields whose values hold no leaf: each a node of the pytree with nothing in it."""

    w: jax.Array
    act: Any
    drop: eqx.nn.Dropout
    opts: dict
    cfg: list
    mixed: list
    t: tuple

    def __init__(self):
        self.w = jnp.ones(2)
        self.act = None
        self.drop = eqx.nn.Dropout(0.5)
        self.opts = {}
        self.cfg = [1, []]
        self.mixed = [jnp.ones(2), []]
        self.t = ()


@pytest.mark.parametrize(
    "where, replace",
    [
        (lambda m: m.act, jax.nn.relu),
        (lambda m: m.act, "gelu"),
        (lambda m: m.drop, jax.nn.relu),
        (lambda m: m.opts, {"k": 3}),
        (lambda m: m.cfg[1], [7]),
        (lambda m: m.mixed[1], [jnp.zeros(1), 5]),
        (lambda m: m.t, (jnp.zeros(1), 3)),
    ],
    ids=[
        "none-fn",
        "none-str",
        "dropout",
        "empty-dict",
        "static-list",
        "mixed",
        "tuple",
    ],
)
def test_eqx_tree_at_on_a_target_without_leaves_decides_the_replacement(where, replace):
    # Such a target is a node: Equinox's own `tree_at` put a non-array replacement
    # in as a leaf (plain `jax.jit` then refused it), or lost it in an empty container.
    model = Leafless()
    new = eqx.tree_at(where, model, replace)
    ref = asx.tree_at(where, model, replace)
    assert jax.tree_util.tree_structure(new) == jax.tree_util.tree_structure(ref)
    assert all(eqx.is_array(x) for x in jax.tree_util.tree_leaves(new))
    assert eqx.tree_equal(where(new), replace)
    jax.jit(lambda m: m.w + 1)(new)


def test_eqx_tree_at_replace_fn_on_a_static_value():
    model = eqx.nn.make_with_state(Mixed)(KEY)[0]
    new = eqx.tree_at(lambda m: m.inner.scale, model, replace_fn=lambda s: s * 5)
    assert new.inner.scale == 10.0


def test_eqx_tree_at_on_arrays_keeps_equinox_results():
    model = eqx.nn.make_with_state(Mixed)(KEY)[0]
    weight = jnp.zeros((3, 3))
    new = eqx.tree_at(lambda m: m.layers[0].weight, model, weight)
    assert new.layers[0].weight is weight
    assert jax.tree_util.tree_structure(new) == jax.tree_util.tree_structure(model)
    linear = eqx.nn.Linear(3, 3, key=jax.random.key(7))
    swapped = eqx.tree_at(lambda m: m.layers[0], model, linear)
    # A copy, as Equinox makes; as a layer inside an AutoModule, of the fast carrier class.
    assert isinstance(swapped.layers[0], eqx.nn.Linear)
    assert eqx.tree_equal(
        jax.tree_util.tree_leaves(swapped.layers[0]), jax.tree_util.tree_leaves(linear)
    )
    assert jax.tree_util.tree_structure(swapped) == jax.tree_util.tree_structure(model)
    # An array where a float was: dynamic now, as autostatic.tree_at decides.
    as_array = eqx.tree_at(lambda m: m.inner.scale, model, jnp.array(4.0))
    assert ".inner.scale" in keystrs(as_array)


def test_eqx_tree_at_errors_stay_equinox_s():
    with pytest.raises(TypeError, match="not a leaf"):
        eqx.tree_at(lambda t: 7.0, (1.0, 2.0), 3.0)
    model = eqx.nn.make_with_state(Mixed)(KEY)[0]
    with pytest.raises(ValueError, match="same length"):
        eqx.tree_at(lambda m: (m.inner.scale, m.dropout.p), model, (1.0,))
    with pytest.raises(TypeError, match=r"7\.0 is not a leaf"):
        eqx.tree_at(lambda m: 7.0, model, 3.0)


class Layers(asx.AutoModule):
    layers: list


class EqxLayers(eqx.Module):
    layers: list


def test_eqx_tree_at_on_a_filter_spec_keeps_its_structure():
    """Equinox's recipe for training only the last layer: a spec of bools mapped from
    the model, with `eqx.tree_at` setting some to True. The spec is not a model (its
    children hold bools where the arrays were), so nothing is decided afresh."""
    results = []
    for cls in (Layers, EqxLayers):
        model = cls(
            [eqx.nn.Linear(2, 2, key=KEY), jax.nn.relu, eqx.nn.Linear(2, 2, key=KEY)]
        )
        spec = jax.tree_util.tree_map(lambda _: False, model)
        spec = eqx.tree_at(
            lambda t: (t.layers[-1].weight, t.layers[-1].bias),
            spec,
            replace=(True, True),
        )
        trained, frozen = eqx.partition(model, spec)
        results.append([x.shape for x in jax.tree_util.tree_leaves(trained)])
        assert eqx.combine(trained, frozen).layers[1] is jax.nn.relu
    assert results[0] == results[1] == [(2, 2), (2,)]


class Head(asx.AutoModule):
    enc: eqx.nn.Linear
    head: eqx.nn.MLP


class EqxHead(eqx.Module):
    enc: eqx.nn.Linear
    head: eqx.nn.MLP


def _head(cls):
    k1, k2 = jax.random.split(KEY)
    return cls(eqx.nn.Linear(3, 4, key=k1), eqx.nn.MLP(4, 2, 4, 1, key=k2))


def _trained_paths(model, spec):
    trained, frozen = eqx.partition(model, spec)
    grads = eqx.filter_grad(lambda t, f: eqx.combine(t, f).head(jnp.ones(4)).sum())(
        trained, frozen
    )
    return [
        jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(grads)
    ]


@pytest.mark.parametrize("label", ["sgd", eqx.is_inexact_array])
@pytest.mark.parametrize(
    "where", [lambda t: t.enc.weight, lambda t: t.head.layers[0].weight]
)
def test_eqx_tree_at_puts_any_label_into_a_layer_of_a_mapped_tree(label, where):
    """optax.multi_transform's labels, and a filter spec holding a filter function:
    a string or a function put where a held layer's array was (in a layer inside a
    layer too) stays a leaf."""
    found = []
    for cls in (Head, EqxHead):
        model = _head(cls)
        tree = jax.tree_util.tree_map(lambda _: False, model)
        tree = eqx.tree_at(where, tree, label)
        assert jax.tree_util.tree_structure(tree) == jax.tree_util.tree_structure(
            jax.tree_util.tree_map(lambda _: False, model)
        )
        found.append(
            [
                jax.tree_util.keystr(p)
                for p, x in jax.tree_util.tree_leaves_with_path(tree)
                if x is label
            ]
        )
    assert found[0] == found[1] and len(found[0]) == 1


def test_optax_labels_set_by_eqx_tree_at_in_a_layer_as_for_eqx_module():
    import optax

    updated = []
    for cls in (Head, EqxHead):
        model = _head(cls)
        params = model if cls is Head else eqx.filter(model, eqx.is_array)
        labels = jax.tree_util.tree_map(lambda _: "adam", params)
        labels = eqx.tree_at(lambda t: t.enc.weight, labels, "sgd")
        tx = optax.multi_transform(
            {"sgd": optax.sgd(0.1), "adam": optax.adam(0.1)}, labels
        )
        update = tx.update(params, tx.init(params), params)[0]
        updated.append(jax.tree_util.tree_leaves(eqx.apply_updates(params, update)))
    for ours, twin in zip(*updated):
        np.testing.assert_array_equal(ours, twin)


def test_eqx_tree_at_puts_a_spec_mapped_from_a_standalone_layer_in_place():
    """A spec's subtree made from the layer alone has Equinox's structure (an MLP's
    activations are leaves there, static in the model): put in place of the
    spec's layer, it takes that layer's structure."""
    paths = []
    for cls in (Head, EqxHead):
        model = _head(cls)
        spec = jax.tree_util.tree_map(lambda _: False, model)
        subtree = jax.tree_util.tree_map(lambda _: True, model.head)
        spec = eqx.tree_at(lambda t: t.head, spec, replace=subtree)
        paths.append(_trained_paths(model, spec))
    assert paths[0] == paths[1] and len(paths[0]) == 4
    assert paths[0][0] == ".head.layers[0].weight"


class _Inner(asx.AutoModule):
    linear: eqx.nn.Linear


class _EqxInner(eqx.Module):
    linear: eqx.nn.Linear


class _Outer(asx.AutoModule):
    inner: Any
    params: dict
    layers: list


class _EqxOuter(eqx.Module):
    inner: Any
    params: dict
    layers: list


@pytest.mark.parametrize(
    "where",
    [lambda t: t.inner, lambda t: t.params["a"], lambda t: t.layers],
    ids=["module", "dict entry", "list field"],
)
def test_eqx_tree_at_on_a_none_mapped_tree_puts_the_axis_in_as_a_leaf(where):
    """Equinox's recipe for `in_axes` (or shardings) of some parameters: a tree of
    `None` mapped from the model, with `eqx.tree_at` putting an axis at a target. That
    tree has no leaves, so it is no model: the axis goes in as a leaf, as in
    Equinox, and `jax.vmap` takes the tree."""
    results = []
    for inner, outer in ((_Inner, _Outer), (_EqxInner, _EqxOuter)):
        model = eqx.filter_vmap(
            lambda k, inner=inner, outer=outer: outer(
                inner(eqx.nn.Linear(2, 2, key=k)), {"a": jnp.ones(2)}, [jnp.ones(2)]
            )
        )(jax.random.split(KEY, 3))
        axes = jax.tree_util.tree_map(lambda _: None, model)
        axes = eqx.tree_at(where, axes, 0, is_leaf=lambda x: x is None)
        assert jax.tree_util.tree_leaves(axes) == [0]
        picked = jax.vmap(lambda m: jax.tree_util.tree_leaves(where(m)), (axes,))(
            eqx.tree_at(where, model, replace_fn=lambda x: x)
        )
        results.append([x.shape for x in picked])
    assert results[0] == results[1]


class _Named(asx.AutoModule):
    params: Any  # arrays and a name: a mixed field
    bias: jax.Array


class _EqxNamed(eqx.Module):
    params: Any
    bias: jax.Array


def _batched_w(model, batch):
    return eqx.tree_at(lambda m: m.params["w"], model, jnp.ones((batch, 3, 4)))


_DEVICE = jax.sharding.SingleDeviceSharding(jax.devices()[0])


@pytest.mark.parametrize(
    "fill, label, use",
    [
        (None, 0, lambda m, t: jax.vmap(lambda m: m.params["w"].sum(), (t,))(m)),
        (False, True, lambda m, t: eqx.partition(m, t)[0].params["w"]),
        (_DEVICE, _DEVICE, lambda m, t: jax.device_put(m, t).params["w"]),
    ],
    ids=["vmap in_axes", "filter spec", "shardings"],
)
def test_eqx_tree_at_puts_a_label_over_a_whole_mixed_field_of_a_mapped_tree(
    fill, label, use
):
    """An axis, a flag or a sharding that `eqx.tree_at` puts over a whole field
    mixing arrays and static values, in a tree mapped from the model, stands for
    the whole field, as in the twin's dynamic half: the tree stays a prefix of the
    model, also mapped again (`jax.jit` maps shardings to layouts of `None`s)."""
    results = []
    for cls in (_Named, _EqxNamed):
        model = _batched_w(
            cls({"w": jnp.ones((3, 4)), "name": "proj"}, jnp.zeros(4)), 2
        )
        if cls is _EqxNamed:  # plain JAX refuses the name: the dynamic half
            model = eqx.filter(model, eqx.is_array)
        tree = jax.tree_util.tree_map(lambda _: fill, model)
        tree = eqx.tree_at(lambda t: t.params, tree, label, is_leaf=lambda x: x is None)
        assert jax.tree_util.tree_leaves(tree)[0] is label
        for prefix in (tree, jax.tree_util.tree_map(lambda _: None, tree)):
            jax.tree_util.tree_map(
                lambda *_: None, prefix, model, is_leaf=lambda x: x is None
            )
        results.append(use(model, tree))
    assert eqx.tree_equal(*results)


class _Parts(asx.AutoModule):
    x: dict  # arrays beside a name and a function, in lists and alone
    act: Any
    bias: jax.Array


class _EqxParts(eqx.Module):
    x: dict
    act: Any
    bias: jax.Array


def _params(cls):
    x = {"a": [jnp.ones(2), "s"], "b": [jnp.ones(2), "t"], "f": jax.nn.relu}
    model = cls(x, jax.nn.relu, jnp.ones(2))
    return model if cls is _Parts else eqx.filter(model, eqx.is_array)


@pytest.mark.parametrize(
    "fill, where, label",
    [
        (None, lambda t: t.x["a"], 0),
        (None, lambda t: (t.x, t.bias), (0, 0)),
        (0, lambda t: t.x["b"], None),
        (0, lambda t: t.x["f"], None),
        (0, lambda t: t.act, None),
        (False, lambda t: t.x["a"], True),
    ],
    ids=[
        "a mixed list, in Nones",
        "a mixed field and an array",
        "a mixed list, in 0s",
        "a static leaf",
        "a static field",
        "a mixed list, in bools",
    ],
)
def test_labels_put_by_eqx_tree_at_in_a_mapped_tree_are_as_in_the_twin_s(
    fill, where, label
):
    """Wherever `eqx.tree_at` puts labels in a tree mapped from a model, the tree
    has the leaves the twin's dynamic half's tree has, and stays a prefix of the
    model: the model's static leaves never become labels."""
    results = []
    for cls in (_Parts, _EqxParts):
        model = _params(cls)
        tree = jax.tree_util.tree_map(lambda _: fill, model)
        tree = eqx.tree_at(where, tree, label, is_leaf=lambda x: x is None)
        jax.tree_util.tree_map(lambda *_: 0, tree, model, is_leaf=lambda x: x is None)
        found = jax.tree_util.tree_leaves_with_path(tree)
        results.append([(jax.tree_util.keystr(p), x) for p, x in found])
    assert results[0] == results[1]


@pytest.mark.parametrize(
    "params, where",
    [
        ([jnp.ones(3), "s", jnp.ones(2)], lambda t: t.params[2]),
        ([jnp.ones(3), "s", (jnp.ones(2), jnp.ones(2))], lambda t: t.params[2]),
        ({"w": jnp.ones(3), "name": "proj"}, lambda t: t.params),
        (
            [eqx.nn.Linear(2, 2, key=KEY), jax.nn.relu, eqx.nn.Linear(2, 2, key=KEY)],
            lambda t: t.params[0],
        ),
    ],
    ids=[
        "a mixed list",
        "a container item",
        "a mixed dict",
        "a list of layers and a function",
    ],
)
def test_optax_masked_and_multi_transform_over_mixed_fields_as_for_eqx_module(
    params, where
):
    """`optax.masked` puts `MaskedNode()` where its mask leaves a part out, and
    `multi_transform` a mask per label: the updates keep the model's structure,
    as with the twin's array half."""
    import optax

    results = []
    for cls in (_Named, _EqxNamed):
        model = cls(params, jnp.ones(4))
        model = model if cls is _Named else eqx.filter(model, eqx.is_array)
        off = eqx.tree_at(where, jax.tree_util.tree_map(lambda _: True, model), False)
        labels = eqx.tree_at(where, jax.tree_util.tree_map(lambda _: "a", model), "b")
        for tx in (
            optax.masked(
                optax.sgd(1.0), jax.tree_util.tree_map(lambda _: False, model)
            ),
            optax.masked(optax.sgd(1.0), off),
            optax.multi_transform({"a": optax.sgd(1.0), "b": optax.sgd(-3.0)}, labels),
        ):
            updates, _ = tx.update(model, tx.init(model), model)
            results.append(jax.tree_util.tree_leaves(updates))
    half = len(results) // 2
    assert eqx.tree_equal(results[:half], results[half:])


class _Scaled(asx.AutoModule):
    w: jax.Array
    scale: jax.Array  # a Python number here is a leaf: a tree map makes a template
    layers: list


def _scaled_by_tree_map():
    model = _Scaled(jnp.ones(2), 2.0, [jnp.ones(2), jax.nn.relu])
    return jax.tree_util.tree_map(lambda x: x, model)


def _placeholders():
    return _Scaled(None, None, [None, jax.nn.relu])


@pytest.mark.parametrize(
    "make", [_scaled_by_tree_map, _placeholders], ids=["template", "no array"]
)
def test_eqx_tree_at_of_a_static_value_in_a_model_is_decided_from_its_values(make):
    """A model that is a template (a number held for an array, then a tree map) or
    holds no array yet is no tree of labels: a static value `eqx.tree_at` puts in
    it is static, what the model flattens as and what `jax.jit` runs."""
    new = eqx.tree_at(lambda m: m.layers[1], make(), jax.nn.gelu)
    new = eqx.tree_at(
        lambda m: (m.w, m.scale, m.layers[0]),
        new,
        (jnp.ones(2), jnp.array(2.0), jnp.ones(2)),
        is_leaf=lambda x: x is None,
    )
    assert jax.tree_util.tree_map(lambda x: x, new).layers[1] is jax.nn.gelu
    out = jax.jit(lambda m: m.layers[1](m.w * m.scale + m.layers[0]))(new)
    assert jnp.allclose(out, jax.nn.gelu(jnp.full(2, 3.0)))


def test_eqx_tree_at_with_another_field_s_list_gives_a_fresh_model_s_treedef():
    a = Layers([jnp.ones(2), jax.nn.relu])
    b = Stack([jnp.zeros(2), jax.nn.relu])
    moved = eqx.tree_at(lambda m: m.layers, a, b.blocks)
    fresh = Layers([jnp.zeros(2), jax.nn.relu])
    assert jax.tree_util.tree_structure(moved) == jax.tree_util.tree_structure(fresh)
    assert type(moved.layers) is list and moved.layers[1] is jax.nn.relu
    plain = eqx.tree_at(lambda m: m.layers, a, [jnp.zeros(2), jax.nn.relu])
    assert jax.tree_util.tree_structure(plain) == jax.tree_util.tree_structure(fresh)


class Stack(asx.AutoModule):
    blocks: list


class _Box(eqx.Module):
    """What Equinox's checkpointed loops put where an array was (their `_Buffer`)."""

    a: jax.Array
    tag: object = eqx.field(static=True)


class _VectorField(asx.AutoModule):
    params: dict  # an array and a function: a mixed field


class _State(eqx.Module):
    ys: Any
    n: jax.Array
    flag: Any


@pytest.mark.parametrize(
    "where, replace",
    [
        (lambda s: [s.ys, s.n], "same-ys"),  # one replacement per target, arrays only
        (lambda s: s.flag, False),  # a non-array: the expose path
        (lambda s: (s.n, s.flag), (jnp.array(2), True)),
    ],
    ids=["list-of-targets", "non-array", "tuple-with-non-array"],
)
def test_eqx_tree_at_keeps_the_structure_of_what_it_does_not_replace(where, replace):
    # A module mapped into another form (an array's place holding a node, as
    # diffrax's saved states and optax's masked states have) keeps its partition:
    # deciding it again from its values would give another treedef.
    model = _VectorField({"w": jnp.ones(2), "act": jnp.tanh})
    boxed = jax.tree_util.tree_map(lambda x: _Box(x, "tag"), model)
    state = _State(boxed, jnp.array(0), None)
    if replace == "same-ys":
        replace = [boxed, jnp.array(1)]
    new = eqx.tree_at(where, state, replace, is_leaf=lambda x: x is None)
    assert jax.tree_util.tree_structure(new.ys) == jax.tree_util.tree_structure(boxed)
    assert new.ys.params["act"] is jnp.tanh


class VectorField(asx.AutoModule):
    mlp: eqx.nn.MLP

    def __call__(self, t, y, args):
        return self.mlp(y)


class EqxVectorField(eqx.Module):
    mlp: eqx.nn.MLP

    __call__ = VectorField.__call__


def test_replace_fn_sees_a_held_layer_s_array_half_as_equinox_gives_it():
    # diffrax's BacksolveAdjoint stops gradients through `eqx.tree_at(...,
    # replace_fn=lax.stop_gradient)` of a state holding such a half: an MLP's
    # activations are `None` there, as in Equinox's filter of the layer.
    mlp = eqx.nn.MLP(2, 2, 4, 1, key=KEY)
    for cls in (VectorField, EqxVectorField):
        half = eqx.filter(cls(mlp), eqx.is_inexact_array)
        seen = []
        out = eqx.tree_at(
            lambda h: h.mlp,
            half,
            replace_fn=lambda x, seen=seen: (
                seen.append(x.activation) or jax.lax.stop_gradient(x)
            ),
        )
        assert seen == [None]
        assert len(jax.tree_util.tree_leaves(out)) == 4


def test_backsolve_adjoint_through_a_held_mlp_as_for_eqx_module():
    import diffrax

    def loss(field, y0):
        solution = diffrax.diffeqsolve(
            diffrax.ODETerm(field),
            diffrax.Tsit5(),
            0.0,
            1.0,
            0.1,
            y0,
            adjoint=diffrax.BacksolveAdjoint(),
        )
        return solution.ys[-1].sum()

    mlp = eqx.nn.MLP(2, 2, 4, 1, key=KEY)
    y0 = jnp.array([1.0, -0.5])
    twin = eqx.filter_jit(eqx.filter_grad(loss))(EqxVectorField(mlp), y0)
    ours = jax.jit(jax.grad(loss))(VectorField(mlp), y0)
    for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(twin)):
        np.testing.assert_allclose(a, b, rtol=1e-5)


def _body_and_head(base):
    class BodyHead(base):
        body: eqx.nn.Linear
        head: eqx.nn.Linear

        def __init__(self):
            self.body = eqx.nn.Linear(2, 2, key=jax.random.key(0))
            self.head = eqx.nn.Linear(2, 2, key=jax.random.key(1))

        def __call__(self, x):
            return self.head(self.body(x))

    return BodyHead()


def test_a_layer_put_where_a_spec_held_a_leaf_splits_by_its_markers():
    """Freeze all but the head, with the spec made at layer granularity and the
    head's slot given the standalone head mapped to True: as for eqx.Module."""

    def head_grads(model):
        is_linear = lambda x: isinstance(x, eqx.nn.Linear)
        spec = jax.tree_util.tree_map(lambda _: False, model, is_leaf=is_linear)
        head = jax.tree_util.tree_map(lambda _: True, model.head)
        spec = eqx.tree_at(lambda s: s.head, spec, head)
        params, static = eqx.partition(model, spec)
        loss = lambda p, s: eqx.combine(p, s)(jnp.ones(2)).sum()
        return eqx.filter_grad(loss)(params, static)

    ours, twin = (
        head_grads(_body_and_head(asx.AutoModule)),
        head_grads(_body_and_head(eqx.Module)),
    )
    assert keystrs(ours) == keystrs(twin) == [".head.weight", ".head.bias"]
    for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(twin)):
        np.testing.assert_allclose(a, b)


# Built and given to `eqx.tree_at` before anything else flattens a model with these
# layers, in a fresh interpreter: then no carrier of them has been made yet.
_TREE_AT_FIRST = """
import equinox as eqx, jax, jax.numpy as jnp
import autostatic as asx

def init(self, key):
    self.linear = eqx.nn.Linear(3, 3, key=key)
    self.attention = eqx.nn.MultiheadAttention(1, 3, key=key)
    self.activation = jax.nn.relu

def call(self, x):
    x = self.activation(self.linear(x))[None]
    return self.attention(x, x, x)[0]

class Net(asx.AutoModule):
    linear: eqx.nn.Linear
    attention: eqx.nn.MultiheadAttention
    activation: object
    __init__, __call__ = init, call

class Twin(eqx.Module):
    linear: eqx.nn.Linear
    attention: eqx.nn.MultiheadAttention
    activation: object = eqx.field(static=True)
    __init__, __call__ = init, call

def zero_weights(model):
    where = lambda m: (m.linear.weight, m.attention.query_proj.weight)
    return eqx.tree_at(where, model, replace_fn=jnp.zeros_like)

net, twin = zero_weights(Net(jax.random.key(0))), zero_weights(Twin(jax.random.key(0)))
def arrays(model):
    leaves = jax.tree_util.tree_leaves_with_path(model)
    return [(jax.tree_util.keystr(p), x) for p, x in leaves if eqx.is_array(x)]

assert [p for p, _ in arrays(net)] == [p for p, _ in arrays(twin)]
assert all(jnp.array_equal(a, b) for (_, a), (_, b) in zip(arrays(net), arrays(twin)))
x = jnp.arange(3.0)
assert jnp.array_equal(jax.jit(Net.__call__)(net, x), eqx.filter_jit(Twin.__call__)(twin, x))
print("same")
"""


def test_tree_at_before_any_flatten():
    """`eqx.tree_at` as the first thing done with a model in a process (weights set
    right after building) leaves a model that flattens and runs under `jax.jit` as
    the `eqx.Module` twin does."""
    done = subprocess.run(
        [sys.executable, "-c", _TREE_AT_FIRST], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "same"


class _Pair(asx.AutoModule):
    a: Any
    b: Any


class _EqxPair(eqx.Module):
    a: Any
    b: Any


@pytest.mark.parametrize(
    "where, new",
    [
        (lambda m: m.a.p, 0.3),
        (lambda m: m.a.p, None),
        (lambda m: m.a, eqx.nn.Dropout(0.3)),
        (lambda m: m.a.p, jnp.array(0.3)),
    ],
    ids=["p float", "p None", "a new layer", "p array"],
)
def test_eqx_tree_at_on_a_model_without_arrays_sets_what_it_flattens_as(where, new):
    """A model holding no array (a block of dropouts and settings): the value
    `eqx.tree_at` puts in a layer is what the model flattens as, then and after an
    unflatten, as the `eqx.Module` twin's."""
    ours, twin = (
        eqx.tree_at(where, cls(eqx.nn.Dropout(0.5), 3), new)
        for cls in (_Pair, _EqxPair)
    )
    leaves, treedef = jax.tree_util.tree_flatten(ours)
    unflattened = jax.tree_util.tree_unflatten(treedef, leaves)
    for model in (ours, unflattened):
        assert bool(eqx.tree_equal(model.a, twin.a))
        assert model.b == twin.b


def test_an_operation_on_the_exposed_form_orders_dicts_as_equinox_does():
    """`eqx.nn.inference_mode` (run on the exposed form) gives an unchanged module's
    dicts in key order, as every tree operation gives an `eqx.Module`'s."""
    ours, twin = (cls({"x": [], "w": jnp.ones(2)}, 3) for cls in (_Pair, _EqxPair))
    assert list(eqx.nn.inference_mode(ours).a) == list(eqx.nn.inference_mode(twin).a)
    assert list(eqx.nn.inference_mode(ours).a) == ["w", "x"]


class _Beside(asx.AutoModule):
    params: Any  # arrays and a name: a mixed field
    other: Any  # a sub-module or a layer beside it


class _EqxBeside(eqx.Module):
    params: Any
    other: Any


def _beside(cls, other):
    model = cls([jnp.ones((3, 2)), "s"], other)
    return model if cls is _Beside else eqx.filter(model, eqx.is_array)


@pytest.mark.parametrize("other", ["module", "layer"])
@pytest.mark.parametrize(
    "fill, label", [(None, 0), (False, True)], ids=["in Nones", "in bools"]
)
def test_a_label_over_a_mixed_field_beside_a_node_keeps_the_tree_a_prefix(
    other, fill, label
):
    """A label put over a whole mixed field, beside a sub-module or an `eqx.nn`
    layer that `eqx.tree_at` rebuilt unchanged: the tree has the twin's leaves, the
    node beside keeps its own, and it still prefixes the model."""
    results = []
    for cls, sub in ((_Beside, _Inner), (_EqxBeside, _EqxInner)):
        node = eqx.nn.Linear(2, 2, key=KEY)
        model = _beside(cls, sub(node) if other == "module" else node)
        tree = jax.tree_util.tree_map(lambda _: fill, model)
        tree = eqx.tree_at(lambda t: t.params, tree, label, is_leaf=lambda x: x is None)
        jax.tree_util.tree_map(lambda *_: 0, tree, model, is_leaf=lambda x: x is None)
        found = jax.tree_util.tree_leaves_with_path(tree)
        results.append([(jax.tree_util.keystr(p), x) for p, x in found])
        if fill is None:
            total = jax.vmap(lambda m: m.params[0].sum(), in_axes=(tree,))(model)
        else:
            total = eqx.partition(model, tree)[0].params[0].sum()
        results.append(total.tolist())
    assert results[:2] == results[2:]


def test_a_label_put_over_a_sub_module_of_a_model_holding_no_array_is_static():
    """A tree without leaves or `None`s is no tree mapped from a model's arrays: a
    model holding no array, whose list appended to after `eqx.tree_at` is seen."""
    seen, models = [], []
    for cls, sub in ((_Outer, _Inner), (_EqxOuter, _EqxInner)):
        model = eqx.tree_at(lambda m: m.inner, cls(sub("relu"), {}, ["in"]), 5)
        model.layers.append(jnp.ones(2))
        flat = jax.tree_util.tree_flatten_with_path(model)[0]
        seen.append([jax.tree_util.keystr(p) for p, x in flat if eqx.is_array(x)])
        models.append(model)
    assert seen[0] == seen[1] == [".layers[1]"]
    assert jax.jit(lambda m: (m.inner, len(m.layers)))(models[0]) == (5, 2)


class _Mixed(asx.AutoModule):
    mix: list  # a tuple of an array and a name inside: split by its leaves
    sub: Any


class _EqxMixed(eqx.Module):
    mix: list
    sub: Any


def _mixed(cls, sub):
    model = cls([jnp.zeros(3), "s", (jnp.ones(3), "t")], sub(jnp.ones(3)))
    return model if cls is _Mixed else eqx.filter(model, eqx.is_array)


class _W(asx.AutoModule):
    w: jax.Array


class _EqxW(eqx.Module):
    w: jax.Array


@pytest.mark.parametrize(
    "where, label",
    [
        (lambda t: t.mix[2], 0),
        (lambda t: (t.mix, t.sub.w), (0, 0)),
        (lambda t: (t.mix[2], t.sub), (0, 0)),
    ],
    ids=[
        "a container item",
        "a mixed field and a leaf inside a module",
        "and a module",
    ],
)
def test_an_in_axes_tree_made_by_tree_at_prefixes_the_model_mapped_again(where, label):
    """Labels put by one `eqx.tree_at` in a tree of `None`s, also over a container
    item of a mixed field and inside a sub-module: the tree has the twin's leaves
    and prefixes the model, also mapped to `None`s again (as `jax.jit` maps
    shardings to layouts)."""
    results = []
    for cls, sub in ((_Mixed, _W), (_EqxMixed, _EqxW)):
        model = _mixed(cls, sub)
        axes = jax.tree_util.tree_map(lambda _: None, model)
        axes = eqx.tree_at(where, axes, label, is_leaf=lambda x: x is None)
        found = jax.tree_util.tree_leaves_with_path(axes)
        results.append([(jax.tree_util.keystr(p), x) for p, x in found])
        for prefix in (axes, jax.tree_util.tree_map(lambda _: None, axes)):
            out = jax.vmap(lambda m: m.mix[0], in_axes=(prefix,), axis_size=3)(model)
            results.append(out.shape)
    assert results[:3] == results[3:]


def test_replace_fn_over_a_block_of_a_spec_reaches_its_layers():
    """Equinox's recipe for training one block: `replace_fn` mapping the block's
    part of a filter spec to `True`, its `eqx.nn` layers included."""
    trained = []
    for cls, inner in ((_Beside, _Inner), (_EqxBeside, _EqxInner)):
        model = _beside(cls, inner(eqx.nn.Linear(2, 2, key=KEY)))
        spec = jax.tree_util.tree_map(lambda _: False, model)
        spec = eqx.tree_at(
            lambda t: t.other,
            spec,
            replace_fn=lambda s: jax.tree_util.tree_map(lambda _: True, s),
        )
        flat = jax.tree_util.tree_flatten_with_path(eqx.filter(model, spec))[0]
        trained.append([jax.tree_util.keystr(p) for p, x in flat if eqx.is_array(x)])
    assert trained[0] == trained[1] == [".other.linear.weight", ".other.linear.bias"]


def test_replace_fn_runs_once_where_the_exposed_form_decides():
    """A function put over a sub-module of a model holding no array is decided on
    the exposed form after Equinox's `tree_at` ran: the user's function is called
    once, as Equinox calls it."""
    calls = []
    for cls, sub in ((_Outer, _Inner), (_EqxOuter, _EqxInner)):
        model = cls(sub("relu"), {}, ["in"])
        eqx.tree_at(
            lambda m: m.inner, model, replace_fn=lambda x: calls.append(x) or _halve
        )
    assert len(calls) == 2


def _halve(x):
    return x / 2


class _TwoLinears(asx.AutoModule):
    first: eqx.nn.Linear
    last: eqx.nn.Linear
    activation: Any = jax.nn.relu

    def __init__(self):
        self.first = eqx.nn.Linear(4, 8, key=jax.random.key(1))
        self.last = eqx.nn.Linear(8, 8, key=jax.random.key(2))


class _EqxTwoLinears(eqx.Module):
    first: eqx.nn.Linear
    last: eqx.nn.Linear
    activation: Any = eqx.field(static=True, default=jax.nn.relu)

    __init__ = _TwoLinears.__init__


def _weight_only(layer, on, off):  # mapped from the layer the callback is given
    return eqx.tree_at(
        lambda t: t.weight, jax.tree_util.tree_map(lambda _: off, layer), on
    )


def _each_array(layer, on, off):  # every array of the layer the callback is given
    return eqx.tree_at(lambda t: (t.weight, t.bias), layer, (on, off))


@pytest.mark.parametrize("per_layer", [_weight_only, _each_array])
def test_a_tree_of_labels_made_per_held_layer_keeps_the_model_s_structure(per_layer):
    """A spec or sharding tree made per layer, in an `is_leaf` callback stopping at
    each `eqx.nn` layer, by `eqx.tree_at` over the layer it is given: its labels
    are leaves where the layer's arrays are, as in the twin's."""
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.make_mesh((len(jax.devices()),), ("d",))
    split, whole = (
        NamedSharding(mesh, PartitionSpec("d")),
        NamedSharding(mesh, PartitionSpec()),
    )
    is_linear = lambda x: isinstance(x, eqx.nn.Linear)
    found = []
    for model in (_TwoLinears(), _EqxTwoLinears()):
        spec = jax.tree_util.tree_map(
            lambda x: per_layer(x, True, False) if is_linear(x) else False,
            model,
            is_leaf=is_linear,
        )
        trained = keystrs(eqx.filter(model, spec))
        shardings = jax.tree_util.tree_map(
            lambda x: per_layer(x, split, whole) if is_linear(x) else whole,
            model,
            is_leaf=is_linear,
        )
        placed = jax.device_put(model, shardings)
        found.append(
            (
                keystrs(spec),
                trained,
                [x.sharding.spec for x in jax.tree_util.tree_leaves(placed)],
            )
        )
    assert found[0] == found[1]
    assert found[0][1] == [".first.weight", ".last.weight"]
