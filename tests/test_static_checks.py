"""Semantics 7: an array is never static; hidden arrays are reported by attribute path."""

import functools as ft
import types
import warnings
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import autostatic as asx
from autostatic.core import _checks as _static_checks

from .helpers import keystrs


@pytest.fixture(autouse=True)
def fresh_warnings():
    """Each warning is shown once per process; each test starts afresh."""
    _static_checks._warned.clear()
    yield
    _static_checks._warned.clear()


class Holder(asx.AutoModule):
    w: jax.Array
    thing: object


def test_static_true_on_an_array_is_an_error_naming_the_field():
    class Marked(asx.AutoModule):
        w: jax.Array = eqx.field(static=True)

    with (
        pytest.raises(
            TypeError,
            match=r"Marked\.w is marked eqx.field\(static=True\) but holds 1 array",
        ),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")  # Equinox warns first
        Marked(jnp.ones(2))


def test_static_true_on_non_arrays_is_honoured():
    class Marked(asx.AutoModule):
        w: jax.Array
        n: int = eqx.field(static=True)

    assert keystrs(Marked(jnp.ones(2), 3)) == [".w"]


def test_arrays_in_containers_are_never_static():
    m = Holder(jnp.ones(1), {"a": (np.zeros(2), "s"), "b": [jnp.ones(3), 1.0]})
    assert keystrs(m) == [".w", ".thing['a'][0]", ".thing['b'][0]"]


@pytest.mark.parametrize(
    "make, where",
    [
        (
            lambda w: ft.partial(lambda x, y: x * y, w),
            r"Holder\.thing holds an array in argument 0 of a functools.partial",
        ),
        (
            lambda w: lambda x: x * w,
            r"Holder\.thing holds an array in closure variable 'w'",
        ),
        (
            lambda w: jax.jit(lambda x: x * w),
            r"Holder\.thing holds an array in closure variable 'w'",
        ),
        (
            lambda w: [1, ft.partial(jnp.add, w)],
            r"Holder\.thing\[1\] holds an array in argument 0",
        ),
        (lambda w: [w, ft.partial(jnp.add, w)], r"Holder\.thing\[1\] holds an array"),
        (
            lambda w: [types.MappingProxyType({"w": w})],
            r"Holder\.thing\[0\] holds an array in key 'w'",
        ),
    ],
    ids=[
        "partial",
        "closure",
        "jitted",
        "in-static-list",
        "in-mixed-list",
        "mapping-proxy",
    ],
)
def test_hidden_arrays_warn_with_the_attribute_path(make, where):
    with pytest.warns(UserWarning, match=where):
        Holder(jnp.ones(1), make(jnp.ones(2)))


class Opaque:
    def __init__(self, table):
        self.table = table


def test_hidden_array_in_opaque_object_warns():
    with pytest.warns(UserWarning, match=r"attribute 'table' of a .*Opaque"):
        Holder(jnp.ones(1), Opaque(jnp.ones(3)))


def test_numpy_constant_table_in_opaque_object_is_silent():
    # A host constant, as JAX takes a numpy array closed over by a function: the
    # Butcher tableaus of diffrax's solvers are numpy arrays in plain dataclasses.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = Holder(jnp.ones(1), Opaque(np.ones(3)))
    assert keystrs(m) == [".w"]


def test_hidden_array_check_goes_by_identity_not_equality():
    class AllEqual:
        def __init__(self, table):
            self.table = table

        def __eq__(self, other):
            return isinstance(other, AllEqual)

        def __hash__(self):
            return 0

    Holder(jnp.ones(1), AllEqual(None))  # clean: cached
    with pytest.warns(UserWarning, match=r"attribute 'table' of a .*AllEqual"):
        Holder(jnp.ones(1), AllEqual(jnp.ones(2)))


def _scaled_by(rate):
    def scale(x):
        return x * rate

    def apply(x):  # Optax's transformations nest closures like this
        return scale(x)

    return apply


def test_closure_converted_function_is_silent_and_its_arrays_stay_live():
    # `equinox.internal.closure_to_pytree` (optimistix wraps Optax with it) turns the
    # cells into leaves beside the function; the function's own cells are never read.
    import equinox.internal as eqxi

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m1 = Holder(jnp.ones(2), eqxi.closure_to_pytree(_scaled_by(jnp.array(0.5))))
        m2 = Holder(jnp.ones(2), eqxi.closure_to_pytree(_scaled_by(jnp.array(3.0))))
    traces = []

    @jax.jit
    def run(m):
        traces.append(None)
        return m.thing(m.w)

    assert run(m1).tolist() == [0.5, 0.5]
    assert run(m2).tolist() == [3.0, 3.0]
    assert len(traces) == 1


def test_no_warning_for_ordinary_static_values():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Holder(
            jnp.ones(1), [jax.nn.relu, jnp.tanh, ft.partial(jnp.sum, axis=0), "x", 3]
        )
        Holder(jnp.ones(1), eqx.nn.Lambda(jax.nn.gelu))


def test_eqx_partial_keeps_its_arrays_dynamic():
    m = Holder(jnp.ones(1), eqx.Partial(jnp.add, jnp.ones(2)))
    assert keystrs(m) == [".w", ".thing.args[0]"]
    np.testing.assert_allclose(jax.jit(lambda m: m.thing(1.0))(m), 2.0)


def test_each_warning_is_shown_once_per_attribute_and_cause():
    with pytest.warns(UserWarning) as record:
        for _ in range(3):
            Holder(jnp.ones(1), ft.partial(jnp.add, jnp.ones(2)))
    assert len([w for w in record if "Holder.thing" in str(w.message)]) == 1


def test_unhashable_and_uncomparable_static_value_warns():
    class Table:
        __hash__ = None

        def __eq__(self, other):
            return np.array([True, False])  # elementwise, like a DataFrame

    with pytest.warns(
        UserWarning,
        match=r"Holder\.thing\[0\] is a static value of type .*Table.* neither hashed nor compared",
    ):
        Holder(jnp.ones(1), [Table()])


def test_an_iterator_as_a_static_value_warns_at_the_user_s_line():
    class Lazy(asx.AutoModule):
        items: Any

    with pytest.warns(
        UserWarning, match=r"Lazy\.items is an iterator \(generator\)"
    ) as record:
        Lazy(i for i in range(3))
    ours = [w for w in record if "Lazy.items" in str(w.message)]
    assert [w.filename for w in ours] == [__file__]  # JAX adds a DeprecationWarning
    with pytest.warns(UserWarning, match=r"Lazy\.items\[0\] is an iterator \(map\)"):
        Lazy([map(str, [1, 2])])


def test_paths_behind_a_held_layer_name_the_right_item():
    """A Dropout flattens to no leaves inside a model (its p and inference are its
    own static values), so the items after it are named by their own key paths."""
    with pytest.raises(TypeError, match=r"Holder\.thing\[1\] is a numpy array"):
        Holder(jnp.ones(1), [eqx.nn.Dropout(0.1), np.array([object()], dtype=object)])
    with pytest.warns(UserWarning, match=r"Holder\.thing\[2\] holds an array"):
        Holder(
            jnp.ones(1),
            [eqx.nn.Dropout(0.1), jnp.ones(1), ft.partial(jnp.add, jnp.ones(2))],
        )


@pytest.mark.parametrize(
    "value",
    [
        np.str_("relu"),
        np.bytes_(b"gelu"),
        np.datetime64("2026-01-01"),
        np.timedelta64(3, "s"),
    ],
    ids=["str_", "bytes_", "datetime64", "timedelta64"],
)
def test_numpy_text_and_date_scalars_are_static_like_their_python_twins(value):
    class Config(asx.AutoModule):
        w: jax.Array
        name: Any

    class Twin(eqx.Module):
        w: jax.Array
        name: Any = eqx.field(static=True)

    m = Config(jnp.ones(2), value)
    with warnings.catch_warnings():  # Equinox takes it for an array set static
        warnings.simplefilter("ignore")
        twin = Twin(jnp.ones(2), value)
    assert keystrs(m) == keystrs(twin) == [".w"]
    assert jax.jit(lambda m: m.w * 2)(m).tolist() == [2.0, 2.0]
    assert m.name == value and asx.explain(m) is not None


@pytest.mark.parametrize(
    "array",
    [np.array(["a", "b"]), np.array([(1, 2.0)], dtype="i4,f8"), np.array([object()])],
    ids=["<U1", "structured", "object"],
)
def test_numpy_arrays_jax_cannot_hold_are_refused_naming_the_path(array):
    with pytest.raises(
        TypeError, match=r"Holder\.thing\[1\] is a numpy array of dtype"
    ):
        Holder(jnp.ones(1), [1, array])


def test_a_tracer_closed_over_inside_a_trace_is_not_reported():
    # Libraries build modules inside traced code (optimistix: a closure over the
    # step size of this very step); they never leave the trace.
    @jax.jit
    def step(w):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            holder = Holder(w, lambda x: x * w)
        return holder.thing(2.0)

    assert step(jnp.ones(2)).tolist() == [2.0, 2.0]


def test_transformed_callable_nested_in_an_argument_warns_as_in_equinox():
    # Equinox's generated __init__ walks its arguments for these; AutoModule skips
    # that walk (its decision visits every leaf) and warns from there.
    linear = eqx.nn.Linear(2, 2, key=jax.random.key(0))
    for make in (
        lambda: Holder(jnp.ones(1), [jax.jit(linear)]),
        lambda: Holder(jnp.ones(1), {"f": jax.vmap(linear)}),
    ):
        with pytest.warns(match="Possibly assigning a JAX-transformed callable"):
            make()


def test_subclasses_inherit_the_generated_init():
    # The entry Equinox keeps per class for its argument walk is set aside for
    # AutoModule classes; a subclass must still get a generated __init__ of all fields.
    class Base(asx.AutoModule):
        a: int

    class Child(Base):
        b: jax.Array

    class Grandchild(Child):
        c: str = "x"

    g = Grandchild(1, jnp.ones(2))
    assert (g.a, g.c) == (1, "x") and jax.tree_util.tree_leaves(g) == [g.b]
    with pytest.raises(TypeError):
        Child(1)  # b is required


def test_every_class_holding_a_function_with_a_hidden_array_warns():
    # Function fields are recognised as static by their type once one has been
    # decided; each later one is still checked.
    def scale_by(w):
        return lambda x: x * w

    for name in ("First", "Second"):
        cls = type(name, (asx.AutoModule,), {"__annotations__": {"f": Any}})
        with pytest.warns(UserWarning, match=rf"{name}\.f holds an array in closure"):
            cls(scale_by(jnp.ones(2)))


def test_a_transformed_callable_warns_at_every_assignment_as_in_equinox():
    # The check of a field assigned in `__init__` is remembered only for callables
    # that warn of nothing: one that hides a layer's arrays warns each time, in an
    # AutoModule as in an eqx.Module.
    linear = eqx.nn.Linear(2, 2, key=jax.random.key(0))
    jitted = jax.jit(linear)

    class EqxHolder(eqx.Module):
        w: jax.Array
        thing: object

    for cls in (Holder, EqxHolder):
        for _ in range(2):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                cls(jnp.ones(1), jitted)
            assert any("JAX-transformed" in str(w.message) for w in caught), cls
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            Holder(jnp.ones(1), jax.nn.relu)  # a custom_jvp hiding no array
