"""Semantics 5 and 6: plain JAX transforms take modules directly; retracing rules."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import autostatic as asx

from .helpers import AutoLayer, AutoMLP, EqxMLP, needs_devices, TraceCounter

KEY = jax.random.key(0)
X = jnp.linspace(-1.0, 1.0, 4)


def _loss(model, x):
    return jnp.sum(model(x) ** 2)


def test_jit_grad_vmap_agree_with_eqx():
    auto, ref = AutoMLP(3, 4, KEY), EqxMLP(3, 4, KEY)
    np.testing.assert_allclose(jax.jit(_loss)(auto, X), eqx.filter_jit(_loss)(ref, X))
    g_auto = jax.jit(jax.grad(_loss))(auto, X)
    g_ref = eqx.filter_jit(eqx.filter_grad(_loss))(ref, X)
    assert type(g_auto) is AutoMLP
    for a, b in zip(
        jax.tree_util.tree_leaves(g_auto), jax.tree_util.tree_leaves(g_ref)
    ):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    xs = jnp.stack([X, 2 * X])
    np.testing.assert_allclose(
        jax.vmap(lambda m, x: m(x), in_axes=(None, 0))(auto, xs),
        eqx.filter_vmap(lambda m, x: m(x), in_axes=(None, 0))(ref, xs),
        rtol=1e-6,
    )


def test_equinox_filtered_transforms_accept_modules():
    auto = AutoMLP(2, 4, KEY)
    assert eqx.filter_jit(_loss)(auto, X).shape == ()
    assert type(eqx.filter_grad(_loss)(auto, X)) is AutoMLP
    batched = jax.tree_util.tree_map(lambda x: jnp.stack([x, x]), auto)
    out = eqx.filter_vmap(lambda m: m(X))(batched)
    assert out.shape == (2, 4)


def test_vmap_over_a_batch_of_modules():
    keys = jax.random.split(KEY, 5)
    stacked = jax.vmap(lambda k: AutoLayer(4, k))(keys)
    assert stacked.weight.shape == (5, 4, 4) and stacked.activation is jax.nn.relu
    out = jax.vmap(lambda layer: layer(X))(stacked)
    assert out.shape == (5, 4)


def test_scan_with_module_as_carry():
    model = AutoMLP(2, 4, KEY)

    def step(m, _):
        g = jax.grad(_loss)(m, X)
        m = jax.tree_util.tree_map(lambda p, d: p - 0.01 * d, m, g)
        return m, _loss(m, X)

    final, losses = jax.lax.scan(step, model, None, length=5)
    assert type(final) is AutoMLP and losses.shape == (5,)
    assert float(losses[-1]) < float(_loss(model, X))


def test_eval_shape():
    out = jax.eval_shape(lambda m: m, AutoMLP(2, 4, KEY))
    assert isinstance(out.layers[0].weight, jax.ShapeDtypeStruct)
    assert out.layers[0].activation is jax.nn.relu


@needs_devices(8)
def test_device_put_with_module_shaped_shardings():
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))
    model = AutoMLP(2, 8, KEY)

    def spec(x):
        return NamedSharding(mesh, P("model") if x.ndim == 1 else P(None, "model"))

    shardings = jax.tree_util.tree_map(spec, model)
    placed = jax.device_put(model, shardings)
    assert placed.layers[0].weight.sharding == shardings.layers[0].weight
    xs = jax.device_put(jnp.ones((4, 8)), NamedSharding(mesh, P("data")))
    out = jax.jit(jax.vmap(lambda m, x: m(x), in_axes=(None, 0)))(placed, xs)
    np.testing.assert_allclose(out, jax.vmap(model)(jnp.ones((4, 8))), rtol=1e-5)


def _traces(fn, models):
    counter = TraceCounter(fn)
    jitted = jax.jit(counter)
    for model in models:
        jax.block_until_ready(jitted(model, X))
    return counter.count


def test_rebuilt_model_with_equal_static_values_hits_cache():
    assert _traces(_loss, [AutoMLP(2, 4, KEY) for _ in range(5)]) == 1
    model = AutoMLP(2, 4, KEY)
    assert _traces(_loss, [model, jax.tree_util.tree_map(lambda x: 2 * x, model)]) == 1


def test_changed_float_hyperparameter_retraces():
    assert _traces(_loss, [AutoMLP(2, 4, KEY, scale=s) for s in (1.0, 1.0, 2.0)]) == 2


def test_unhashable_static_values_work_under_jit():
    class Config(asx.AutoModule):
        w: jax.Array
        sizes: list
        table: dict
        tags: set
        nested: list

        def __call__(self, x):
            return self.w * x * len(self.sizes) * len(self.tags)

    def make():
        return Config(jnp.ones(4), [1, 2], {"a": [1]}, {"x", "y"}, [[1], {"b": {2}}])

    assert _traces(lambda m, x: m(x), [make(), make(), make()]) == 1
    changed = Config(jnp.ones(4), [1, 2, 3], {"a": [1]}, {"x"}, [[1], {"b": {2}}])
    assert _traces(lambda m, x: m(x), [make(), changed]) == 2


def test_new_equal_lambda_retraces_as_in_equinox():
    def make():
        return AutoLayer(4, KEY, activation=lambda x: jax.nn.relu(x))

    assert _traces(lambda m, x: m(x), [make(), make()]) == 2


def test_storing_as_array_makes_a_value_dynamic():
    class Scaled(asx.AutoModule):
        w: jax.Array
        lr: jax.Array = eqx.field(converter=jnp.asarray)

    models = [Scaled(jnp.ones(4), lr) for lr in (0.1, 0.2, 0.3)]
    assert _traces(lambda m, x: m.lr * m.w * x, models) == 1


def test_replace_static_hyperparameter_with_tree_at():
    model = AutoMLP(2, 4, KEY, scale=1.0)
    halved = asx.tree_at(lambda m: m.scale, model, 0.5)
    assert halved.scale == 0.5 and model.scale == 1.0
    np.testing.assert_allclose(
        jax.jit(lambda m: m(X))(halved), 0.5 * model(X), rtol=1e-6
    )
    # still static: a jax.jit over it does not see a leaf for it
    assert len(jax.tree_util.tree_leaves(halved)) == len(
        jax.tree_util.tree_leaves(model)
    )
    relu6 = asx.tree_at(lambda m: m.layers[0].activation, model, jax.nn.relu6)
    assert relu6.layers[0].activation is jax.nn.relu6


def test_module_as_jit_output_keeps_statics():
    model = AutoMLP(2, 4, KEY, scale=0.25)
    out = jax.jit(lambda m: jax.tree_util.tree_map(lambda x: x + 1, m))(model)
    assert type(out) is AutoMLP and out.scale == 0.25
    assert out.layers[0].activation is jax.nn.relu


def test_equal_static_values_of_other_types_do_not_share_a_trace():
    class Scaled(asx.AutoModule):
        w: jax.Array
        scale: object

    f = jax.jit(lambda m: m.w * m.scale)
    assert f(Scaled(jnp.arange(3), 1)).dtype == jnp.int32
    assert f(Scaled(jnp.arange(3), 1.0)).dtype == jnp.float32
    assert (
        _traces(
            lambda m, x: m.w * m.scale, [Scaled(jnp.ones(1), v) for v in (1, 1.0, True)]
        )
        == 3
    )
    assert asx.retrace_reasons(Scaled(jnp.ones(1), 1), Scaled(jnp.ones(1), 1.0))


@pytest.mark.parametrize("kind", [set, frozenset])
def test_sets_of_equal_items_of_other_types_do_not_share_a_trace(kind):
    # A set's own `==` equates {1} and {1.0}; its items follow the rule a list's do.
    class Holds(asx.AutoModule):
        w: jax.Array
        items: object

    f = jax.jit(lambda m: m.w * next(iter(m.items)))
    assert f(Holds(jnp.arange(3), kind({1}))).dtype == jnp.int32
    assert f(Holds(jnp.arange(3), kind({1.0}))).dtype == jnp.float32
    assert jnp.signbit(f(Holds(jnp.ones(1), kind({-0.0}))))[0]
    assert not jnp.signbit(f(Holds(jnp.ones(1), kind({0.0}))))[0]
    models = [Holds(jnp.ones(1), kind({v})) for v in (1, 1.0, True, 1)]
    assert _traces(lambda m, x: m.w * next(iter(m.items)), models) == 3
    rebuilt = jax.tree_util.tree_map(lambda x: x, models[0])
    assert type(rebuilt.items) is kind and rebuilt.items == {1}


def test_threads_constructing_at_once_share_one_structure():
    import concurrent.futures
    import sys

    class Fresh(asx.AutoModule):
        w: jax.Array
        n: int

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            modules = list(pool.map(lambda i: Fresh(jnp.ones(2), 3), range(8)))
    finally:
        sys.setswitchinterval(interval)
    treedefs = {jax.tree_util.tree_structure(m) for m in modules}
    first = jax.tree_util.tree_structure(modules[0])
    assert all(jax.tree_util.tree_structure(m) == first for m in modules), treedefs
