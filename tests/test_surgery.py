"""Semantics 9: surgery on static values, inference mode, stateful layers."""

import warnings

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
    assert new.layers[1].sizes == [2, 2, 9]
    with pytest.raises(TypeError, match="cannot be modified"):
        new.layers[1].sizes.append(1)


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
