"""Property tests over random nests of arrays, non-arrays, containers and modules."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, HealthCheck, settings, strategies as st

import autostatic as asx
from models import array_keystrs, keystrs, TraceCounter


class Box(asx.AutoModule):
    value: Any
    other: Any


class EqxBox(eqx.Module):
    value: Any
    other: Any


_FUNCTIONS = [jax.nn.relu, jnp.tanh, len, None]

leaf_descs = st.one_of(
    st.tuples(st.just("jax"), st.integers(0, 2), st.integers(-3, 3)),
    st.tuples(st.just("numpy"), st.integers(0, 2), st.integers(-3, 3)),
    st.tuples(st.just("lit"), st.one_of(
        st.integers(-5, 5),
        st.floats(-2, 2, allow_nan=False),
        st.text("abc", max_size=3),
        st.booleans(),
        st.sampled_from(_FUNCTIONS),
    )),
)
descs = st.recursive(
    leaf_descs,
    lambda children: st.one_of(
        st.tuples(st.just("list"), st.lists(children, max_size=3)),
        st.tuples(st.just("tuple"), st.lists(children, max_size=3)),
        st.tuples(st.just("dict"), st.dictionaries(st.text("xyz", min_size=1, max_size=2), children, max_size=3)),
        st.tuples(st.just("module"), children, children),
    ),
    max_leaves=10,
)


def build(desc: tuple, auto: bool) -> Any:
    kind = desc[0]
    if kind == "jax":
        return jnp.full((2,) * desc[1], desc[2], jnp.float32)
    if kind == "numpy":
        return np.full((3,) * desc[1], desc[2], np.int32)
    if kind == "lit":
        return desc[1]
    if kind == "list":
        return [build(d, auto) for d in desc[1]]
    if kind == "tuple":
        return tuple(build(d, auto) for d in desc[1])
    if kind == "dict":
        return {k: build(d, auto) for k, d in desc[1].items()}
    box = Box if auto else EqxBox
    return box(build(desc[1], auto), build(desc[2], auto))


def _pair(desc_a, desc_b):
    return Box(build(desc_a, True), build(desc_b, True)), EqxBox(build(desc_a, False), build(desc_b, False))


property_settings = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@property_settings
@given(descs, descs)
def test_leaves_are_the_arrays_with_eqx_key_paths(desc_a, desc_b):
    auto, ref = _pair(desc_a, desc_b)
    leaves = jax.tree_util.tree_leaves(auto)
    assert all(eqx.is_array(x) for x in leaves)
    assert keystrs(auto) == array_keystrs(ref)


@property_settings
@given(descs, descs)
def test_flatten_unflatten_roundtrip(desc_a, desc_b):
    auto, _ = _pair(desc_a, desc_b)
    leaves, treedef = jax.tree_util.tree_flatten(auto)
    again = jax.tree_util.tree_unflatten(treedef, leaves)
    assert type(again) is Box and jax.tree_util.tree_structure(again) == treedef
    assert eqx.tree_equal(again, auto)
    # Replacing every leaf by a non-array keeps the structure (no re-decision).
    marks = jax.tree_util.tree_unflatten(treedef, [object() for _ in leaves])
    assert jax.tree_util.tree_structure(marks) == treedef
    # With key paths too.
    paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(auto)[0]]
    assert len(paths) == len(leaves)


@property_settings
@given(descs, descs)
def test_jit_identity_returns_an_equal_module_and_no_retrace(desc_a, desc_b):
    counter = TraceCounter(lambda m: m)
    identity = jax.jit(counter)
    first = Box(build(desc_a, True), build(desc_b, True))
    out = identity(first)
    assert type(out) is Box
    assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(first)
    for a, b in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(first)):
        np.testing.assert_array_equal(a, b)
    rebuilt = Box(build(desc_a, True), build(desc_b, True))
    identity(rebuilt)
    identity(jax.tree_util.tree_map(lambda x: x + 1, first))
    assert counter.count == 1
