"""Bound methods (and modules) as lax.switch/cond/scan branches and bodies."""

import gc

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import autostatic as asx

from .helpers import keystrs, TraceCounter


@pytest.fixture
def x64():
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", previous)


class Log(asx.AutoModule):
    some_array: jax.Array

    @eqx.filter_jit
    def func(self, x):
        return jnp.log(self.some_array)


class Scale(asx.AutoModule):
    some_array: jax.Array

    @eqx.filter_jit
    def func(self, x):
        return self.some_array * x


class Container(asx.AutoModule):
    data: tuple

    @eqx.filter_jit
    def run(self, x):
        functions = tuple(m.func for m in self.data)
        return eqx.filter_vmap(
            lambda i, x: jax.lax.switch(i, functions, x), in_axes=(0, None)
        )(jnp.arange(len(self.data)), x)


def test_switch_over_filter_jit_methods_under_filter_vmap(x64):
    a = Log(jnp.array([1.0, 2.0, 3.0], dtype=jnp.float64))
    b = Scale(jnp.array([4.0, 5.0, 6.0], dtype=jnp.float64))
    x = jnp.float64(2.0)
    out = Container((a, b)).run(x)
    expected = jnp.stack([a.func(x), b.func(x)])
    assert out.dtype == jnp.float64
    np.testing.assert_allclose(out, expected)


class M(asx.AutoModule):
    w: jax.Array

    def f(self, x):
        return self.w * x + 1

    def __call__(self, x):
        return self.w - x


def test_minimal_switch_inside_jit_and_filter_jit():
    def run(x):
        fx = M(x).f
        return jax.lax.switch(0, [fx, fx], x)

    x = jnp.arange(3.0)
    expected = M(x).f(x)
    np.testing.assert_allclose(jax.jit(run)(x), expected)
    np.testing.assert_allclose(eqx.filter_jit(run)(x), expected)
    np.testing.assert_allclose(run(x), expected)


def test_modules_as_callables_in_switch_and_cond():
    m1, m2 = M(jnp.ones(2)), M(2 * jnp.ones(2))
    x = jnp.arange(2.0)
    np.testing.assert_allclose(jax.lax.switch(1, [m1, m2], x), m2(x))
    np.testing.assert_allclose(
        jax.jit(lambda i, x: jax.lax.switch(i, [m1, m2], x))(0, x), m1(x)
    )
    np.testing.assert_allclose(jax.lax.cond(True, m1.f, m2.f, x), m1.f(x))
    np.testing.assert_allclose(
        jax.jit(lambda p, a, b, x: jax.lax.cond(p, a.f, b, x))(False, m1, m2, x), m2(x)
    )


def test_methods_as_scan_and_while_bodies_and_checkpoint_targets():
    class Acc(asx.AutoModule):
        step: jax.Array

        def body(self, carry, _):
            return carry + self.step, carry

        def cond(self, carry):
            return carry < 10.0

        def inc(self, carry):
            return carry + self.step

        def square(self, x):
            return self.step * x**2

    acc = Acc(jnp.array(2.0))
    carry, ys = jax.lax.scan(acc.body, jnp.array(0.0), None, length=3)
    assert float(carry) == 6.0 and ys.tolist() == [0.0, 2.0, 4.0]
    assert float(jax.lax.while_loop(acc.cond, acc.inc, jnp.array(0.0))) == 10.0
    assert float(jax.jit(lambda a: jax.lax.while_loop(a.cond, a.inc, 1.0))(acc)) == 11.0
    assert float(jax.grad(jax.checkpoint(acc.square))(3.0)) == 12.0

    f = jax.custom_vjp(acc.square)
    f.defvjp(lambda x: (f(x), x), lambda x, g: (g * 100.0,))
    assert float(jax.grad(f)(3.0)) == 100.0


def test_bound_method_is_a_pytree_of_the_module_arrays():
    m = M(jnp.array([1.0, 2.0]))

    class EqxM(eqx.Module):
        w: jax.Array

        def f(self, x):
            return self.w * x + 1

    ref = EqxM(jnp.array([1.0, 2.0]))
    assert keystrs(m.f) == keystrs(ref.f) == [".__self__.w"]
    grads = jax.grad(lambda fn: jnp.sum(fn(3.0)))(m.f)
    assert type(grads.__self__) is M and grads.__self__.w.tolist() == [3.0, 3.0]
    assert m.f is m.f and hash(m.f) == hash(m.f)
    assert m.f == jax.tree_util.tree_map(lambda x: x, m).f
    assert m.f != M(jnp.array([1.0, 2.0])).f  # other arrays, other method
    assert m.f.__name__ == "f" and M.f.__name__ == "f"


def test_no_retrace_for_the_same_module_and_no_stale_cache_across_modules():
    counter = TraceCounter(lambda w, x: w * x)

    class Lin(asx.AutoModule):
        w: jax.Array

        def f(self, x):
            return counter(self.w, x)

        def __call__(self, x):
            return self.w + x

    x = jnp.ones(3)
    m = Lin(jnp.full(3, 2.0))
    branches = [m.f, m.f]
    for _ in range(3):
        np.testing.assert_allclose(jax.lax.switch(0, branches, x), 2.0)
    first = counter.count
    assert first >= 1
    for _ in range(3):
        jax.lax.switch(1, [m.f, m.f], x)  # m.f is branches[0] while that lives
    assert counter.count == first  # the same module's method: cache hit
    other = Lin(jnp.full(3, 5.0))
    np.testing.assert_allclose(jax.lax.switch(0, [other.f, other.f], x), 5.0)
    assert counter.count > first  # a different module's arrays: traced anew
    seen = counter.count
    twin = Lin(jnp.full(3, 5.0))  # equal numbers, other arrays: no stale reuse
    np.testing.assert_allclose(jax.lax.switch(0, [twin.f, twin.f], x), 5.0)
    assert counter.count > seen

    # Under jax.jit, a module passed as an argument traces once and is reused.
    jit_counter = TraceCounter(lambda mod, i, x: jax.lax.switch(i, [mod.f, mod], x))
    run = jax.jit(jit_counter)
    for mod in (m, other, m):
        run(mod, 0, x)
    assert jit_counter.count == 1


def test_calling_a_method_creates_no_reference_cycle():
    import weakref

    gc.disable()
    try:
        m = M(jnp.ones((100, 100)))
        m.f(1.0)
        jax.lax.switch(0, [m.f, m], jnp.ones((100, 100)))
        ref = weakref.ref(m)
        del m
        assert ref() is None  # freed by reference counting alone, no GC needed
    finally:
        gc.enable()


def test_super_reaches_the_parent_method():
    class Parent(asx.AutoModule):
        w: jax.Array

        def f(self, x):
            return x + 1

    class Child(Parent):
        def f(self, x):
            return super().f(x) * 10

        def g(self, x):
            return super().f(x)

    c = Child(jnp.ones(1))
    assert c.f(1) == 20 and c.g(1) == 2 and c.f(1) == 20


def test_switch_loop_does_not_keep_modules_alive():
    import weakref

    refs = []
    for i in range(40):
        m = M(jnp.full(4, float(i)))
        jax.lax.switch(i % 2, [m.f, m], jnp.ones(4))
        refs.append(weakref.ref(m))
    del m
    gc.collect()
    alive = sum(r() is not None for r in refs)
    assert alive <= 2, f"{alive} modules kept alive by a cache"


def test_vmap_over_switch_index_evaluates_every_branch():
    calls = []

    class Probe(asx.AutoModule):
        w: jax.Array

        def f(self, x):
            calls.append("f")
            return self.w * x

        def g(self, x):
            calls.append("g")
            return self.w + x

    p = Probe(jnp.ones(2))
    out = jax.vmap(lambda i: jax.lax.switch(i, [p.f, p.g], jnp.ones(2)))(
        jnp.array([0, 1])
    )
    assert out.shape == (2, 2) and set(calls) == {"f", "g"}


def test_methods_inherited_from_an_eqx_module_base_are_bound_too():
    class Base(eqx.Module):
        def double(self, x):
            return 2 * self.w * x

    class Impl(Base, asx.AutoModule):
        w: jax.Array

    impl = Impl(jnp.ones(2))
    assert keystrs(impl.double) == [".__self__.w"]
    np.testing.assert_allclose(jax.jit(lambda f: f(3.0))(impl.double), 6.0)
    np.testing.assert_allclose(jax.lax.switch(0, [impl.double], 1.0), 2.0)
