"""Property tests over random nests of arrays, non-arrays, containers and modules."""

import equinox as eqx
import jax
import numpy as np
from hypothesis import given, HealthCheck, settings

from .helpers import array_keystrs, Box, build, descs, EqxBox, keystrs, TraceCounter


def _pair(desc_a, desc_b):
    return Box(build(desc_a, True), build(desc_b, True)), EqxBox(
        build(desc_a, False), build(desc_b, False)
    )


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
