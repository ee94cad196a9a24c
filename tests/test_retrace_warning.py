"""Retraces nobody asked for are reported: a static number traced with several values
of one field warns once, naming Class.field and the fix."""

import re
import warnings
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest
from jaxtyping import ArrayLike, Int

import autostatic as asx
from autostatic.core import _checks as _static_checks

from .helpers import TraceCounter


@pytest.fixture(autouse=True)
def fresh():
    _static_checks._warned.clear()
    asx.warn_on_retrace(3)
    yield
    asx.warn_on_retrace()


class Net(asx.AutoModule):
    w: jax.Array
    lr: float
    activation: Callable

    def __call__(self, x):
        return self.activation(self.w * x * self.lr)


def test_a_changing_static_float_warns_once_after_three_traces():
    counter = TraceCounter(lambda m, x: m(x))
    f = jax.jit(counter)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for lr in (0.1, 0.2, 0.1, 0.3, 0.4, 0.5):
            f(Net(jnp.ones(2), lr, jax.nn.relu), 1.0)
    retraces = [w for w in caught if issubclass(w.category, asx.RetraceWarning)]
    assert counter.count == 5  # the same value (0.1) reuses its program
    assert len(retraces) == 1
    message = str(retraces[0].message)
    assert "Net.lr has been traced with 3 different values (0.1, 0.2, 0.3)" in message
    assert "lr: float | jax.Array" in message
    assert retraces[0].filename == __file__  # points at the user's call


def test_a_fresh_function_each_call_is_not_counted():
    # Equinox's `filter_jit` compiles anew for each new function object too; a suite
    # whose tests each pass their own function must not be told otherwise.
    counter = TraceCounter(lambda m, x: m(x))
    f = jax.jit(counter)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for scale in (1.0, 2.0, 3.0, 4.0):
            f(Net(jnp.ones(2), 0.5, lambda x, s=scale: x * s), 1.0)
    assert counter.count == 4


def test_no_warning_when_values_repeat_or_when_silenced():
    f = jax.jit(lambda m, x: m(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(5):
            for lr in (0.1, 0.2):  # two programs, reused
                f(Net(jnp.ones(2), lr, jax.nn.relu), 1.0)
        asx.warn_on_retrace(None)
        for lr in (0.3, 0.4, 0.5, 0.6):
            f(Net(jnp.ones(2), lr, jax.nn.relu), 1.0)


def test_tree_maps_outside_a_trace_are_not_counted():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for lr in (0.1, 0.2, 0.3, 0.4):
            jax.tree.map(lambda x: x + 1, Net(jnp.ones(2), lr, jax.nn.relu))


def test_eager_transforms_which_compile_nothing_are_not_counted():
    # An eager `jax.grad` or `jax.vmap` traces at each call whatever the value:
    # storing it as an array would save no trace.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for lr in (0.1, 0.2, 0.3, 0.4):
            model = Net(jnp.ones(2), lr, jax.nn.relu)
            jax.grad(lambda m: m(1.0).sum())(model)
            jax.vmap(lambda m, x: m(x), in_axes=(None, 0))(model, jnp.ones(3))


class Sized(asx.AutoModule):
    w: jax.Array
    hidden: int

    def __init__(self, hidden: int):
        self.w = jnp.zeros(hidden)  # a size: the arrays' shapes change with it
        self.hidden = hidden


def test_a_sweep_of_sizes_is_not_counted():
    # Each size retraces for its arrays' shapes; a traced `hidden` could not make
    # them (`jnp.zeros(hidden)` needs a concrete size), so no warning advises it.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for hidden in range(1, 6):
            jax.jit(lambda m: jnp.zeros(m.hidden) + m.w)(Sized(hidden))


def test_the_default_waits_for_eight_values():
    asx.warn_on_retrace()
    f = jax.jit(lambda m, x: m(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(7):
            f(Net(jnp.ones(2), 0.1 * i, jax.nn.relu), 1.0)
    with pytest.warns(asx.RetraceWarning, match="8 different values"):
        f(Net(jnp.ones(2), 0.9, jax.nn.relu), 1.0)


def test_warn_on_retrace_checks_its_argument():
    with pytest.raises(ValueError, match="at least 2"):
        asx.warn_on_retrace(1)


class Block(asx.AutoModule):
    w: jax.Array
    scale: float


class Stack(asx.AutoModule):
    blocks: list


def test_blocks_differing_in_a_static_number_are_one_trace():
    # One model whose 12 blocks each hold their own static float compiles once: its
    # one trace meets 12 values of Block.scale, and that is no retrace.
    model = Stack([Block(jnp.ones(2), 0.1 * i + 0.05) for i in range(12)])
    counter = TraceCounter(lambda m: sum(b.w * b.scale for b in m.blocks))
    f = jax.jit(counter)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f(model)
        f(jax.tree.map(lambda x: x + 1, model))
    assert counter.count == 1


def test_new_values_in_separate_traces_still_warn_with_many_blocks():
    f = jax.jit(lambda m: sum(b.w * b.scale for b in m.blocks))
    with pytest.warns(asx.RetraceWarning, match=r"Block\.scale has been traced"):
        for step in range(3):
            f(Stack([Block(jnp.ones(2), step + 0.01 * i) for i in range(4)]))


def test_a_field_that_has_warned_keeps_no_more_values():
    # A step counter held as a static int brings a new value to every trace: once
    # its field has warned, its values are no longer kept (memory stays bounded).
    from autostatic.core import _retrace

    f = jax.jit(lambda m, x: m(x))
    with pytest.warns(asx.RetraceWarning):
        for lr in range(20):
            f(Net(jnp.ones(2), float(lr), jax.nn.relu), 1.0)
    assert len(_retrace._seen[Net]["lr"].keys) == 3


class Counted(asx.AutoModule):
    w: jax.Array
    step: Int[ArrayLike, ""] = 0


def _bump(model: Counted) -> Counted:
    return asx.tree_at(lambda m: m.step, model, model.step + 1)


def test_a_held_python_counter_under_filter_jit_warns_naming_the_field():
    # The field is annotated to hold arrays, so `jax.jit` traces the counter; but
    # `eqx.filter_jit` holds every non-array leaf static and compiles once per value.
    counter = TraceCounter(lambda m, x: m.w * x)
    f = eqx.filter_jit(counter)
    model = Counted(jnp.ones(2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(5):
            f(model, 1.0)
            model = _bump(model)
    retraces = [w for w in caught if issubclass(w.category, asx.RetraceWarning)]
    assert counter.count == 5
    assert len(retraces) == 1
    message = str(retraces[0].message)
    assert "Counted.step is annotated to hold arrays" in message
    assert "(0, 1, 2)" in message
    assert "jax.jit" in message and "jnp.asarray(0)" in message


def test_the_same_counter_under_jax_jit_traces_once_and_is_quiet():
    counter = TraceCounter(lambda m, x: m.w * x + m.step)
    f = jax.jit(counter)
    model = Counted(jnp.ones(2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for step in range(5):
            assert float(f(model, 1.0)[0]) == 1.0 + step
            model = _bump(model)
    assert counter.count == 1


def test_the_current_trace_is_the_one_jax_gives():
    # The retrace count reads JAX's current trace through a private name, in C++;
    # it must be the object JAX's public function gives, traced or not.
    import jax._src.core as jax_core
    from jax.extend.core import find_top_trace

    from autostatic import _compat

    if hasattr(jax_core, "trace_state_strong_ref"):
        assert type(_compat.trace_state) is not _compat._PublicTraceState
    seen = []

    def f(x):
        seen.append(_compat.trace_state.value is find_top_trace(()))
        return x

    jax.jit(f)(1.0)
    jax.vmap(f)(jnp.ones(2))
    assert seen == [True, True]
    assert _compat.trace_state.value is find_top_trace(())


class IntCounter(asx.AutoModule):
    w: jax.Array
    step: int


def _bumped(where: str, jit: Callable) -> Callable:
    """A training step that bumps the counter, in or after the jitted function."""
    if where == "inside":
        return jit(lambda m: asx.tree_at(lambda m: m.step, m, m.step + 1))
    jitted = jit(lambda m: m)
    return lambda m: asx.tree_at(lambda m: m.step, jitted(m), m.step + 1)


@pytest.mark.parametrize(
    "jit", [jax.jit, eqx.filter_jit], ids=["jax.jit", "filter_jit"]
)
@pytest.mark.parametrize("where", ["inside", "outside"])
def test_an_int_counter_bumped_each_step_is_reported_as_a_static_int(where, jit):
    step = _bumped(where, jit)
    model = IntCounter(jnp.ones(2), 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(6):
            model = step(model)
    retraces = [w for w in caught if issubclass(w.category, asx.RetraceWarning)]
    assert len(retraces) == 1
    message = str(retraces[0].message)
    found = re.search(
        r"IntCounter.step has been traced with (\d+) different values \((.*?)\)",
        message,
    )
    assert found is not None, message
    assert found[2] == ", ".join(map(str, range(int(found[1]))))  # each value counted
    assert "static Python int" in message
    assert 'step: Int[ArrayLike, ""]' in message and "jnp.asarray(0)" in message
    assert "annotated to hold arrays" not in message
    assert "filter_jit" not in message


def test_a_warning_counts_the_values_it_lists():
    asx.warn_on_retrace(12)
    f = jax.jit(lambda m: m.w * m.step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(12):
            f(IntCounter(jnp.ones(2), n))
    (warning,) = [w for w in caught if issubclass(w.category, asx.RetraceWarning)]
    assert "12 different values (0, 1, 2, 3, 4, 5, 6, 7, and 4 more)" in str(
        warning.message
    )


class Dropped(asx.AutoModule):
    dropout: eqx.nn.Dropout


def test_a_held_layer_s_number_warns_with_a_fix_the_user_can_make():
    # `Dropout.p` is Equinox's field: no annotation of the user's reaches it.
    f = jax.jit(lambda m: m.dropout(jnp.ones(2), key=jax.random.key(0)))
    with pytest.warns(asx.RetraceWarning) as caught:
        for p in (0.1, 0.2, 0.3):
            f(Dropped(eqx.nn.Dropout(p)))
    (message,) = [str(w.message) for w in caught]
    assert message.startswith("Dropout.p has been traced with 3 different values")
    assert "give the layer an array (`jnp.asarray(0.1)`)" in message
    assert "annotate" not in message
    quiet = Dropped(eqx.nn.Dropout(jnp.asarray(0.4)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f(quiet), f(Dropped(eqx.nn.Dropout(jnp.asarray(0.5))))
