"""Static `functools.partial`s: one of plain arguments is the call it makes, so two
models built alike (an activation `partial(jax.nn.leaky_relu, negative_slope=0.1)`,
`eqx.nn.WeightNorm`'s norm) have equal treedefs, as their `eqx.Module` twins do
(which hold the partial as a leaf)."""

import functools
import warnings
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import autostatic as asx

from .helpers import TraceCounter

LEAKY = functools.partial(jax.nn.leaky_relu, negative_slope=0.1)


def _held_layers(base: type, kind: str) -> type:
    class Net(base):
        layer: Any

        def __init__(self, key):
            if kind == "mlp":
                activation = functools.partial(jax.nn.leaky_relu, negative_slope=0.1)
                self.layer = eqx.nn.MLP(3, 3, 4, 1, activation=activation, key=key)
            else:
                self.layer = eqx.nn.WeightNorm(eqx.nn.Linear(3, 3, key=key))

        def __call__(self, x):
            return self.layer(x)

    return Net


def _mean(a, b):
    return (a + b) / 2 if eqx.is_array(a) else a


@pytest.mark.parametrize("kind", ["mlp", "weight_norm"])
def test_models_built_alike_map_together_as_the_eqx_module_twins(kind):
    x = jnp.arange(3.0)
    results = []
    for base in (asx.AutoModule, eqx.Module):
        net = _held_layers(base, kind)
        one, two = net(jax.random.key(1)), net(jax.random.key(2))
        assert jax.tree.structure(one) == jax.tree.structure(two)
        mean = jax.tree.map(_mean, one, two)
        shapes = eqx.filter_eval_shape(net, jax.random.key(0))
        again = jax.tree.map(lambda _, a: a, shapes, one)
        results.append((mean(x), again(x)))
    np.testing.assert_allclose(results[0], results[1], rtol=1e-6)


class Act(asx.AutoModule):
    w: jax.Array
    activation: Any

    def __call__(self):
        return self.activation(self.w)


def test_equal_partials_share_a_trace_and_read_back_as_assigned():
    counter = TraceCounter(lambda m: m())
    f = jax.jit(counter)
    first = functools.partial(jax.nn.leaky_relu, negative_slope=0.1)
    second = functools.partial(jax.nn.leaky_relu, negative_slope=0.1)
    w = -jnp.ones(2)
    np.testing.assert_allclose(f(Act(w, first)), LEAKY(w))
    np.testing.assert_allclose(f(Act(w, second)), LEAKY(w))
    assert counter.count == 1
    assert Act(w, second).activation is second
    f(Act(w, functools.partial(jax.nn.leaky_relu, negative_slope=0.2)))
    assert counter.count == 2


@pytest.mark.parametrize(
    "a, b",
    [
        (functools.partial(jnp.sum, axis=1), functools.partial(jnp.sum, axis=1.0)),
        (functools.partial(jnp.sum, axis=1), functools.partial(jnp.max, axis=1)),
        (functools.partial(jnp.sum, axis=0.0), functools.partial(jnp.sum, axis=-0.0)),
        (functools.partial(jnp.sum, 1), functools.partial(jnp.sum, axis=1)),
    ],
    ids=["int-float", "function", "signed-zero", "positional-keyword"],
)
def test_partials_of_other_calls_differ(a, b):
    assert jax.tree.structure(Act(jnp.ones(2), a)) != (
        jax.tree.structure(Act(jnp.ones(2), b))
    )


def test_a_partial_holding_an_array_is_compared_by_identity():
    def make():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return Act(jnp.ones(2), functools.partial(jnp.add, np.ones(2)))

    assert jax.tree.structure(make()) != jax.tree.structure(make())
