"""Property tests over random nests of arrays, non-arrays, containers and modules."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, HealthCheck, settings, strategies as st

import autostatic as asx

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


class _Scaled(asx.AutoModule):
    w: jax.Array
    config: object  # a number in a container, or alone: static unless numpy


def _number(config):
    return (
        jax.tree_util.tree_leaves(config)[-1] if type(config) is not float else config
    )


# One jitted function for every example: a trace wrongly reused across static
# values of different types or bits gives a result that differs from eager.
@jax.jit
def _scaled(m):
    return m.w * _number(m.config)


numbers = st.one_of(
    st.integers(-3, 3),
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.sampled_from([0.0, -0.0, float("nan"), True, False, 1, 1.0, 1 + 0j, -0j]),
    st.complex_numbers(max_magnitude=4, allow_nan=False, width=64),
    st.sampled_from([np.float32(-0.0), np.int8(2), np.bool_(True), np.float16(0.5)]),
)
wrappers = st.sampled_from(
    [lambda x: x, lambda x: (x,), lambda x: [0, x], lambda x: {"k": x}]
)


@pytest.mark.filterwarnings("ignore::autostatic.RetraceWarning")  # retraced on purpose
@property_settings
@given(numbers, wrappers)
def test_static_numbers_give_the_eager_result_under_jit(number, wrap):
    model = _Scaled(jnp.ones(2, jnp.float32), wrap(number))
    eager, jitted = model.w * _number(model.config), _scaled(model)
    assert jitted.dtype == eager.dtype
    np.testing.assert_array_equal(jitted, eager)
    np.testing.assert_array_equal(
        np.signbit(np.real(jitted)), np.signbit(np.real(eager))
    )


_FLAT_ITEMS = st.sampled_from(
    [
        "array",
        "linear",
        "dropout",
        "relu",
        "str",
        "int",
        "half",
        "zero",
        "none",
        "lambda",
    ]
)


def _flat_item(name: str):
    return {
        "array": lambda: jnp.ones(2),
        "linear": lambda: eqx.nn.Linear(2, 2, key=jax.random.key(0)),
        "dropout": lambda: eqx.nn.Dropout(0.1),
        "relu": lambda: jax.nn.relu,
        "str": lambda: "gelu",
        "int": lambda: 3,
        "half": lambda: 0.5,
        "zero": lambda: -0.0,
        "none": lambda: None,
        "lambda": lambda: lambda x: x,
    }[name]()


_LEAVES = st.sampled_from(
    [1, 2.5, "relu", None, b"x", jnp.ones(2), np.ones(2), jax.nn.relu, Box(1, 2)]
)
_KEYS = st.one_of(st.text(max_size=2), st.integers(0, 3), st.tuples(st.integers(0, 3)))
_NESTS = st.recursive(
    _LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(_KEYS, inner, max_size=4),
    ),
    max_leaves=12,
)


def _types_below(value):
    if type(value) not in (list, tuple, dict):
        return {type(value)}
    items = value.values() if type(value) is dict else value
    found = set()
    for item in items:
        found |= (
            _types_below(item) if type(item) in (list, tuple, dict) else {type(item)}
        )
    return found


@property_settings
@given(_NESTS)
def test_leaf_types_are_the_types_below_every_list_tuple_and_dict(value):
    # Found level by level in C calls: a dict's values, never its keys.
    from autostatic.core._leaves import leaf_types

    assert leaf_types(value) == _types_below(value)


@property_settings
@given(st.lists(_FLAT_ITEMS, max_size=6), st.booleans())
def test_a_flat_sequence_is_split_as_the_walk_splits_it(names, as_tuple):
    # A flat list or tuple is split item by item (`FlatHoles`), any other value
    # through its treedef (`Holes`): both must give the same kind, child and
    # attribute value.
    from autostatic.core import _node, _split

    value = [_flat_item(name) for name in names]
    value = tuple(value) if as_tuple else value
    flat = _split.split(value, False, _node.to_carrier)
    walked = _split._split_tree(value, False, _node.to_carrier)
    assert flat[0] == walked[0]
    flat_child, walked_child = flat[1], walked[1]
    assert jax.tree_util.tree_structure(flat_child) == jax.tree_util.tree_structure(
        walked_child
    )
    flat_leaves = jax.tree_util.tree_leaves(flat_child)
    walked_leaves = jax.tree_util.tree_leaves(walked_child)
    assert len(flat_leaves) == len(walked_leaves)
    assert all(a is b for a, b in zip(flat_leaves, walked_leaves))
    from autostatic.core._leaves import stops

    again = [
        jax.tree_util.tree_map(_node.layer_of, _split.value_of(*parts), is_leaf=stops)
        for parts in (flat, walked)
    ]
    assert type(again[0]) is type(again[1]) is type(value)
    for a, b, v in zip(again[0], again[1], value):
        assert type(a) is type(b) is type(v)
        assert a is b or eqx.tree_equal(a, b)


@property_settings
@given(
    st.lists(st.lists(_FLAT_ITEMS, min_size=1, max_size=2), max_size=4),
    st.lists(st.integers(0, 7), min_size=1, max_size=5),
    st.booleans(),
    st.booleans(),
)
def test_records_are_split_by_column_as_the_walk_splits_them(
    columns, picks, as_tuple, array_field
):
    # A list or tuple of tuples of one length is split column by column where each
    # column is all dynamic or all static: the same part, child and entry as the
    # walk of its leaves gives.
    from autostatic.core import _node, _split

    rows = [
        tuple(_flat_item(names[pick % len(names)]) for names in columns)
        for pick in picks
    ]
    value = tuple(rows) if as_tuple else rows
    _split._split_tree(value, array_field, _node.to_carrier)  # every type met once
    by_column = _split.split(value, array_field, _node.to_carrier)
    walked = _split._split_tree(value, array_field, _node.to_carrier)
    assert by_column[0] == walked[0]
    assert type(by_column[2]) is type(walked[2]) and by_column[2] == walked[2]
    is_none = lambda x: x is None
    structures = [
        jax.tree_util.tree_structure(parts[1], is_leaf=is_none)
        for parts in (by_column, walked)
    ]
    assert structures[0] == structures[1]
    leaves = [
        jax.tree_util.tree_leaves(parts[1], is_leaf=is_none)
        for parts in (by_column, walked)
    ]
    assert len(leaves[0]) == len(leaves[1])
    assert all(a is b for a, b in zip(*leaves))


@pytest.mark.parametrize(
    "names",
    [
        ("array", "relu", "int"),
        ("relu", "array", "str", "none"),
        ("str", "int"),
        ("half", "array", "zero"),
    ],
)
@pytest.mark.parametrize("array_field", [False, True])
def test_records_take_the_column_split(names, array_field):
    # Records of static and dynamic columns take the column split (the property
    # above compares the two paths only where it is taken), and give the walk's
    # entry: the static leaves in leaf order, at their places.
    from autostatic.core import _node, _split

    rows = [tuple(_flat_item(name) for name in names) for _ in range(3)]
    _split._split_tree(rows, array_field, _node.to_carrier)
    found = _split._split_rows(rows, tuple(rows), array_field)
    assert found is not None
    walked = _split._split_tree(rows, array_field, _node.to_carrier)
    assert found[0] == walked[0] and found[2] == walked[2]


def test_records_of_different_lengths_are_walked():
    # The column split needs rows of one length: others take the walk, whose
    # entry holds each static leaf at its place.
    from autostatic.core import _node, _split

    rows = [(jnp.ones(2), jax.nn.relu), (jnp.ones(2), jax.nn.relu, 3)]
    assert _split._split_rows(rows, tuple(rows), False) is None
    part, child, entry = _split.split(rows, False, _node.to_carrier)
    assert part == _split.BOTH
    assert jax.tree.structure(child) == jax.tree.structure([(0, None), (0, None, None)])
    assert list(entry[3:]) == [jax.nn.relu, jax.nn.relu, 3]


def _field_value(name):
    """One of the values whose types choose a field's generated mode."""
    key = jax.random.key(0)
    return {
        "array": lambda: jnp.ones(2),
        "none": lambda: None,
        "relu": lambda: jax.nn.relu,  # a `custom_jvp`
        "function": lambda: _halve,
        "int": lambda: 3,
        "zero": lambda: 0.0,
        "float": lambda: 0.5,
        "ints": lambda: [8, 8],
        "empty": lambda: [],
        "modules": lambda: [Box(jnp.ones(1), 1), None],
        "mixed": lambda: [eqx.nn.Linear(2, 2, key=key), jax.nn.relu],
        "layer": lambda: eqx.nn.Linear(2, 2, use_bias=False, key=key),
        "layers": lambda: (eqx.nn.Linear(2, 2, key=key), eqx.nn.Identity()),
        "numbers": lambda: [jnp.ones(2), 3, 0.5, "tag"],
        "records": lambda: [(jnp.ones(2), jax.nn.relu, 1), (jnp.ones(2), _halve, 2)],
        "names": lambda: [(1, "a"), (2, "b")],
        "ragged": lambda: [(jnp.ones(2), "a"), (jnp.ones(2),)],
    }[name]()


def _halve(x):
    return x / 2


_VALUE_NAMES = st.sampled_from(
    [
        "array",
        "none",
        "relu",
        "function",
        "int",
        "zero",
        "float",
        "ints",
        "empty",
        "modules",
        "mixed",
        "layer",
        "layers",
        "records",
        "names",
        "ragged",
    ]
)


@property_settings
@given(
    st.lists(
        st.tuples(
            _VALUE_NAMES,
            st.sampled_from(["int", "array", "none"]),
            st.sampled_from(
                ["int", "float", "array", "none", "ints", "numbers", "records"]
            ),
        ),
        min_size=1,
        max_size=10,
    )
)
def test_instances_of_any_field_types_flatten_as_the_general_flatten(rows):
    # A class's flatten is generated for the first field types met; each instance,
    # whatever its types and in whatever order they come (a list of modules, then
    # one of ints; an array, then `None`), must flatten as the general flatten
    # (which the fuzz checks against Equinox). In a field annotated to hold arrays,
    # numbers are children, alone or as items.
    from autostatic.core._fields import fields_of

    class Triple(asx.AutoModule):
        a: object
        b: object
        c: jax.Array | list

    models = [Triple(*map(_field_value, row)) for row in rows]
    for model in models * 2:  # the second time, every flatten generated is met
        jax.tree_util.tree_flatten(model)
    spec = fields_of(Triple)
    for model in models:
        fast, general = spec.flatten(model), spec.general_flatten(model)
        fast_leaves, fast_def = jax.tree_util.tree_flatten(fast[0])
        general_leaves, general_def = jax.tree_util.tree_flatten(general[0])
        assert fast_def == general_def
        assert all(map(lambda x, y: x is y, fast_leaves, general_leaves))
        assert fast[1] == general[1] and fast[1][0] is general[1][0]
