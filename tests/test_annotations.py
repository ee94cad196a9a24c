"""Fields annotated to hold arrays: Python numbers and ShapeDtypeStructs there are
leaves (as in an eqx.Module), elsewhere static; explicit static=True always wins."""

import warnings
from typing import Any, Generic, Optional, TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PyTree

import autostatic as asx
from autostatic.core import _checks
from autostatic.core._fields import fields_of

from .helpers import keystrs

_State = TypeVar("_State")


def array_fields(cls: type) -> tuple[bool, ...]:
    return fields_of(cls).array_fields


class LoopState(asx.AutoModule):
    y: Float[Array, " n"]
    num_steps: Int[ArrayLike, ""]
    made_jump: Bool[ArrayLike, ""]
    tol: float  # a hyperparameter: static


class EqxLoopState(eqx.Module):
    y: Float[Array, " n"]
    num_steps: Int[ArrayLike, ""]
    made_jump: Bool[ArrayLike, ""]
    tol: float = eqx.field(static=True)


def _run_loop(cls: type) -> Any:
    def f(y):
        state = cls(y, 0, False, 1e-3)

        def body(s):
            return cls(s.y + s.tol, s.num_steps + 1, s.num_steps > 1, s.tol)

        return jax.lax.while_loop(lambda s: s.num_steps < 3, body, state)

    return jax.jit(f)(jnp.ones(2))


def test_python_numbers_as_loop_state_are_leaves_like_eqx_module():
    ours, ref = _run_loop(LoopState), _run_loop(EqxLoopState)
    assert keystrs(ours) == keystrs(ref) == [".y", ".num_steps", ".made_jump"]
    assert int(ours.num_steps) == int(ref.num_steps) == 3
    assert bool(ours.made_jump) and ours.tol == 1e-3
    np.testing.assert_array_equal(ours.y, ref.y)


def test_number_leaves_need_no_retrace_and_sizes_stay_static():
    traces = []

    @jax.jit
    def f(s):
        traces.append(None)
        return s.y * s.num_steps

    f(LoopState(jnp.ones(2), 1, False, 0.1))
    f(LoopState(jnp.ones(2), 2, True, 0.1))
    assert len(traces) == 1
    f(LoopState(jnp.ones(2), 2, True, 0.2))  # `tol: float` is static
    assert len(traces) == 2


@pytest.mark.parametrize(
    "annotation, admits",
    [
        (jax.Array, True),
        (ArrayLike, True),
        (Int[ArrayLike, ""], True),
        (Optional[jax.Array], True),  # noqa: UP045  # as libraries write it
        (int | jax.Array, True),
        (np.ndarray, True),
        (PyTree[Float[Array, "..."]], True),
        (list[jax.Array], True),
        ("Float[Array, 'n']", True),  # a string that names array types
        (int, False),
        (float, False),
        (Any, False),
        (object, False),
        (jax.ShapeDtypeStruct, False),
        (PyTree[jax.ShapeDtypeStruct], False),
        (eqx.nn.Linear, True),  # a module class: a number there stands for a subtree
        (PyTree, True),  # any tree: a number there is a leaf, as an axis tree needs
        (PyTree | None, True),
        (Optional[PyTree], True),  # noqa: UP045  # as libraries write it
        (PyTree[Any], True),
        ("tuple[int, ...]", False),
        (_State, True),  # a generic class's slot for its user's data
        (TypeVar("_Size", bound=int), False),
        (TypeVar("_Leaf", int, jax.Array), True),
    ],
)
def test_which_annotations_admit_arrays(annotation, admits):
    class M(asx.AutoModule):
        x: annotation  # pyright: ignore[reportInvalidTypeForm]

    assert array_fields(M) == (admits,)


def test_unresolvable_string_annotation_is_read_by_its_words():
    class M(asx.AutoModule):
        a: "UndefinedArrayAlias"  # noqa: F821  # pyright: ignore[reportUndefinedVariable]
        b: "Float[NotDefined, 'n']"  # noqa: F821  # pyright: ignore[reportUndefinedVariable]
        c: "SomeConfig"  # noqa: F821  # pyright: ignore[reportUndefinedVariable]

    assert array_fields(M) == (False, True, False)


def test_shape_dtype_struct_describing_a_structure_is_static():
    # lineax keeps operator structures this way, diffrax a Brownian path's shape.
    class Operator(asx.AutoModule):
        matrix: jax.Array
        input_structure: PyTree[jax.ShapeDtypeStruct]

    struct = {"a": jax.ShapeDtypeStruct((3,), jnp.float32)}
    op = Operator(jnp.eye(3), struct)
    assert keystrs(op) == [".matrix"]
    out = jax.jit(lambda o: o.input_structure["a"].shape)(op)  # no tracer
    assert out == (3,)
    batched = jax.vmap(lambda m: Operator(m, struct))(jnp.ones((2, 3, 3)))
    assert batched.input_structure == struct


def test_explicit_static_true_on_a_shape_dtype_struct_is_honoured():
    class Operator(asx.AutoModule):
        structure: jax.Array = eqx.field(static=True)  # even where an array goes

    op = Operator(jax.ShapeDtypeStruct((2,), jnp.float32))
    assert jax.tree_util.tree_leaves(op) == []
    with pytest.raises(TypeError, match=r"Operator\.structure is marked"):
        Operator(jnp.ones(2))


def test_templates_keep_the_partition_they_were_made_from():
    # The host-load path: a template from filter_eval_shape or a tree_map keeps the
    # structure of the real model, whatever the field is annotated.
    class Net(asx.AutoModule):
        w: Any
        n: int

        def __init__(self, key):
            self.w = jax.random.normal(key, (3,))
            self.n = 3

    real = Net(jax.random.key(0))
    for template in (
        eqx.filter_eval_shape(Net, jax.random.key(0)),
        jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), real),
    ):
        assert jax.tree.structure(template) == jax.tree.structure(real)
        assert isinstance(template.w, jax.ShapeDtypeStruct)


def test_subclass_of_a_module_with_a_none_default():
    class A(asx.AutoModule):
        x: object = None

    class B(A):
        pass

    class C(B):
        y: int = 2

    assert B().x is None and C().x is None and C().y == 2
    assert jax.tree_util.tree_leaves(C()) == []


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.one_of(st.integers(-5, 5), st.floats(-2, 2), st.booleans()),
        min_size=1,
        max_size=4,
    )
)
def test_numbers_in_array_fields_match_eqx_module_leaves(numbers):
    class Ours(asx.AutoModule):
        xs: PyTree[ArrayLike]
        sizes: list

    class Ref(eqx.Module):
        xs: PyTree[ArrayLike]
        sizes: list = eqx.field(static=True)

    ours, ref = Ours(list(numbers), list(numbers)), Ref(list(numbers), list(numbers))
    assert keystrs(ours) == keystrs(ref)
    assert jax.tree_util.tree_leaves(ours) == jax.tree_util.tree_leaves(ref)
    double = jax.jit(lambda m: jax.tree.map(lambda x: 2 * x, m))
    doubled, doubled_ref = double(ours), double(ref)
    assert [(x.dtype, float(x)) for x in doubled.xs] == [
        (x.dtype, float(x)) for x in doubled_ref.xs
    ]
    assert ours.sizes == list(numbers)


def test_loop_state_held_directly_by_another_field_stays_a_leaf():
    # diffrax: `State.save_state: PyTree[SaveState]` holding a SaveState whose
    # `save_index: IntScalarLike` starts as 0 and is an array after a step.
    class Inner(asx.AutoModule):
        index: Int[ArrayLike, ""]
        ts: jax.Array

    class Outer(asx.AutoModule):
        inner: Any  # not annotated as an array: the inner module decides

    def body(o):
        return Outer(Inner(o.inner.index + 1, o.inner.ts))

    out = jax.jit(
        lambda ts: jax.lax.while_loop(
            lambda o: o.inner.index < 2, body, Outer(Inner(0, ts))
        )
    )(jnp.zeros(3))
    assert int(out.inner.index) == 2
    assert keystrs(Outer(Inner(0, jnp.zeros(3)))) == [".inner.index", ".inner.ts"]


class _Sized(asx.AutoModule):
    w: jax.Array
    hidden: int
    rate: float | None
    anything: Any

    def __init__(self, hidden: Any, rate: Any = None, anything: Any = None):
        self.w = jnp.ones(3)
        self.hidden, self.rate, self.anything = hidden, rate, anything


def test_a_numpy_size_in_a_field_annotated_int_is_warned_of():
    # `np.prod(shape)` is an array (`eqx.is_array`): traced under jax.jit, where a
    # size must be concrete. Ported from a field Equinox marked static, it is told.
    _checks._warned.clear()  # each warning is given once per process
    with pytest.warns(
        UserWarning, match=r"_Sized\.hidden is annotated as a Python"
    ) as w:
        model = _Sized(np.prod((2, 3)))
    assert "numpy int64 scalar" in str(w[0].message) and w[0].filename == __file__
    assert eqx.is_array(jax.tree_util.tree_leaves(model)[-1])  # still an array leaf
    with pytest.warns(UserWarning, match=r"_Sized\.rate .* numpy float32"):
        _Sized(3, rate=np.float32(0.5))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _Sized(6, rate=0.5, anything=np.int64(2))  # unconstrained: an array, quietly
        sized = _Sized(int(np.prod((2, 3))))
    assert jax.jit(lambda m: jnp.zeros(m.hidden))(sized).shape == (6,)


class _Data(asx.AutoModule):
    x: jax.Array


class _Wrap(asx.AutoModule):
    inner: _Data


class _EqxData(eqx.Module):
    x: jax.Array


class _EqxWrap(eqx.Module):
    inner: _EqxData


def test_a_number_in_a_module_typed_field_is_a_prefix_leaf_as_in_eqx_module():
    # `Wrap(0)` as a `jax.vmap` `in_axes` prefix, `Wrap(True)` as a filter spec: the
    # number stands for the whole subtree, as in an `eqx.Module`.
    auto, twin = _Wrap(_Data(jnp.ones((3, 2)))), _EqxWrap(_EqxData(jnp.ones((3, 2))))
    assert keystrs(_Wrap(0)) == keystrs(_EqxWrap(0)) == [".inner"]
    total = lambda w: w.inner.x.sum()
    out = jax.vmap(total, in_axes=(_Wrap(0),))(auto)
    assert out.tolist() == jax.vmap(total, in_axes=(_EqxWrap(0),))(twin).tolist()
    kept, _ = eqx.partition(auto, _Wrap(True))
    assert kept.inner.x is auto.inner.x


class _Clipped(asx.AutoModule, Generic[_State]):
    inner_state: _State


class _EqxClipped(eqx.Module, Generic[_State]):
    inner_state: _State


@pytest.mark.parametrize("cls", [_Clipped, _EqxClipped], ids=["auto", "eqx"])
def test_a_python_bool_in_generic_loop_state_is_a_leaf_as_in_eqx_module(cls):
    # diffrax's clipped step-size controller: `_ClipState.inner_state` holds the PID
    # controller's `(array, array, False)`, and a while loop's body returns a bool
    # array there.
    def f(x):
        state = cls((x, False))

        def body(s):
            y, _ = s.inner_state
            return cls((y + 1, y + 1 > 2))

        return jax.lax.while_loop(lambda s: s.inner_state[0] < 3, body, state)

    out = jax.jit(f)(jnp.zeros(()))
    assert keystrs(out) == [".inner_state[0]", ".inner_state[1]"]
    assert bool(out.inner_state[1])


@pytest.mark.parametrize("pool", [eqx.nn.MaxPool2d, eqx.nn.AvgPool2d])
def test_a_number_in_a_held_layer_is_static_whatever_its_annotation(pool):
    # `eqx.nn.Pool.init: int | float | Array` holds `-inf` or `0`: a constant, which
    # plain `jax.grad` must not differentiate nor `jax.vmap` batch.
    def build(base, key):
        class Net(base):
            conv: eqx.nn.Conv2d
            pool: Any

            def __call__(self, x):
                return self.pool(self.conv(x)).sum()

        return Net(eqx.nn.Conv2d(1, 2, 3, padding=1, key=key), pool(2, 2))

    x = jnp.arange(16.0).reshape(1, 4, 4)
    ours = build(asx.AutoModule, jax.random.key(0))
    twin = build(eqx.Module, jax.random.key(0))
    grads = jax.jit(jax.grad(lambda m: m(x)))(ours)
    expected = eqx.filter_jit(eqx.filter_grad(lambda m: m(x)))(twin)
    np.testing.assert_allclose(grads.conv.weight, expected.conv.weight, rtol=1e-6)
    assert len(jax.tree_util.tree_leaves(grads)) == 2
    keys = jax.random.split(jax.random.key(1), 3)
    ensemble = jax.vmap(lambda k: build(asx.AutoModule, k))(keys)
    assert jax.vmap(lambda m: m(x))(ensemble).shape == (3,)


class _Result(asx.AutoModule):
    value: Array
    stats: dict
    state: PyTree
    infos: PyTree | None


class _EqxResult(eqx.Module):
    value: Array
    stats: dict
    state: PyTree
    infos: PyTree | None


@pytest.mark.parametrize("cls", [_Result, _EqxResult], ids=["AutoModule", "eqx.Module"])
def test_a_library_axis_tree_in_pytree_fields_batches_as_in_eqx_module(cls):
    # A library builds its `out_axes` as `Result(0, {}, 0, 0)`: in fields annotated
    # `PyTree` the `0`s are leaves, so the axis tree matches the output's structure.
    def solve(x):
        return cls(x * 2, {}, x + 1, {"steps": x - 1})

    out = jax.vmap(solve, out_axes=cls(0, {}, 0, 0))(jnp.arange(3.0))
    assert out.state.tolist() == [1.0, 2.0, 3.0]
    assert out.infos["steps"].tolist() == [-1.0, 0.0, 1.0]


class _Counted(asx.AutoModule):
    value: Array
    count: int  # static: a Python number here is a size


def test_an_axis_tree_that_does_not_match_is_reported_naming_the_field():
    # JAX's report of the mismatch reads a `key` of every key in the key paths; with
    # Equinox's `GetAttrKey` it raised AttributeError instead of the report.
    def solve(x):
        return _Counted(x, jnp.round(x).astype(int))  # a traced count: a child

    with pytest.raises(ValueError, match=r"(?s)different numbers of pytree.*\bcount\b"):
        jax.vmap(solve, out_axes=_Counted(0, 0))(jnp.arange(3.0))
