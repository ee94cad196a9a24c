"""Semantics 2-4: the per-leaf partition, frozen at the end of __init__, natural paths."""

import math
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import autostatic as asx

from .helpers import (
    array_keystrs,
    AutoMixed,
    AutoMLP,
    EqxMixed,
    EqxMLP,
    keystrs,
)

KEY = jax.random.key(0)


def test_leaves_are_arrays_only():
    for model in (AutoMLP(3, 4, KEY), AutoMixed(KEY)):
        leaves = jax.tree_util.tree_leaves(model)
        assert leaves and all(eqx.is_array(x) for x in leaves)


@pytest.mark.parametrize(
    "auto_cls, eqx_cls", [(AutoMLP, EqxMLP), (AutoMixed, EqxMixed)]
)
def test_key_paths_and_leaves_match_eqx(auto_cls, eqx_cls):
    args = (3, 4, KEY) if auto_cls is AutoMLP else (KEY,)
    auto, ref = auto_cls(*args), eqx_cls(*args)
    assert keystrs(auto) == array_keystrs(ref)
    auto_paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(auto)[0]]
    ref_paths = [
        p for p, x in jax.tree_util.tree_flatten_with_path(ref)[0] if eqx.is_array(x)
    ]
    assert auto_paths == ref_paths
    ref_arrays = jax.tree_util.tree_leaves(eqx.filter(ref, eqx.is_array))
    assert len(jax.tree_util.tree_leaves(auto)) == len(ref_arrays)
    for a, b in zip(jax.tree_util.tree_leaves(auto), ref_arrays):
        np.testing.assert_array_equal(a, b)


def test_mixed_container_split_per_leaf():
    model = AutoMixed(KEY)
    assert keystrs(model) == [
        ".stuff[0].weight",
        ".stuff[0].bias",
        ".stuff[3]['w']",
        ".seq.layers[0].weight",
        ".seq.layers[0].bias",
        ".blocks['a'][0]",
        ".blocks['b']",
    ]
    # Attribute access gives the real values back, not wrappers.
    assert model.stuff[1] is jax.nn.relu
    assert (
        model.stuff[2] == 3 and model.stuff[3]["tag"] == "x" and model.stuff[4] is None
    )
    assert model.seq.layers[1].fn is jax.nn.gelu
    assert model.blocks["a"][1] == "name"


def test_tree_map_keeps_static_values_identical():
    model = AutoMixed(KEY)
    doubled = jax.tree_util.tree_map(lambda x: 2 * x, model)
    assert type(doubled) is AutoMixed
    assert doubled.stuff[1] is model.stuff[1]
    assert doubled.seq.layers[1].fn is model.seq.layers[1].fn
    np.testing.assert_array_equal(doubled.stuff[3]["w"], 2 * model.stuff[3]["w"])
    mlp = AutoMLP(2, 3, KEY, scale=0.5)
    mlp2 = jax.tree_util.tree_map(lambda x: x + 1, mlp)
    assert mlp2.layers[0].activation is mlp.layers[0].activation
    # A static container is rebuilt from the aux: equal, of its type, its own copy
    # (so changing it cannot change the original's treedef).
    sizes = mlp2.layers[1].sizes
    assert type(sizes) is list and sizes == mlp.layers[1].sizes
    assert sizes is not mlp.layers[1].sizes
    assert mlp2.scale == 0.5


@pytest.mark.parametrize(
    "make_leaf",
    [
        lambda x: None,
        lambda x: 0,
        lambda x: object(),
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
        lambda x: jax.sharding.SingleDeviceSharding(jax.devices()[0]),
        lambda x: "a string",
    ],
    ids=["None", "int", "object", "ShapeDtypeStruct", "sharding", "str"],
)
def test_unflatten_with_arbitrary_leaves_keeps_structure(make_leaf):
    model = AutoMixed(KEY)
    leaves, treedef = jax.tree_util.tree_flatten(model)
    other = jax.tree_util.tree_map(make_leaf, model)
    if make_leaf(leaves[0]) is None:  # None is an empty subtree, not a leaf
        assert jax.tree_util.tree_leaves(other) == []
        assert keystrs(eqx.combine(other, model)) == keystrs(model)
    else:
        assert jax.tree_util.tree_structure(other) == treedef
        assert len(jax.tree_util.tree_leaves(other)) == len(leaves)
    # Static values are untouched whatever the leaves are.
    assert other.stuff[1] is jax.nn.relu and other.blocks["a"][1] == "name"


def test_eqx_partition_combine_roundtrip():
    model, ref = AutoMixed(KEY), EqxMixed(KEY)
    params, rest = eqx.partition(model, eqx.is_inexact_array)
    ref_rest = eqx.filter(ref, eqx.is_inexact_array, inverse=True)
    # The static half holds the non-array values as leaves, as eqx.Module's does.
    assert keystrs(rest) == keystrs(ref_rest)
    assert jax.tree_util.tree_leaves(rest) == jax.tree_util.tree_leaves(ref_rest)
    # The array half has the model's own treedef (that of its gradients).
    assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(model)
    again = eqx.combine(params, rest)
    assert eqx.tree_equal(again, model)
    assert again.stuff[1] is jax.nn.relu
    assert jax.tree_util.tree_structure(again) == jax.tree_util.tree_structure(model)


class _Marked(eqx.Module):
    leaves: list
    treedef: Any = eqx.field(static=True)


class _Solution(asx.AutoModule):
    value: jax.Array
    state: Any


def _states(x: jax.Array) -> list[Any]:
    marked = _Marked([True], jax.tree_util.tree_structure(0))
    return [
        (x, marked),
        (x, "name"),
        [x, None, jax.nn.relu],
        {"w": x, "act": "relu", "extra": None},
    ]


@pytest.mark.parametrize("at", range(4))
def test_a_static_half_splits_as_the_model_did(at):
    # Equinox's own `filter_jit` partitions its output with `tree_map` inside and
    # combines outside, a `None` taken for a leaf: the static half, holding `None`
    # where the arrays were, must flatten to the model's structure (a `None` is an
    # empty child, as in an `eqx.Module`).
    def is_none(x):
        return x is None

    model = _Solution(jnp.ones(3), _states(jnp.arange(2.0))[at])
    static = jax.tree_util.tree_map(lambda x: None, model)
    dynamic = jax.tree_util.tree_map(lambda x: x, model)
    structure = jax.tree_util.tree_structure(model, is_leaf=is_none)
    assert jax.tree_util.tree_structure(static, is_leaf=is_none) == structure
    assert jax.tree_util.tree_structure(dynamic, is_leaf=is_none) == structure
    assert eqx.tree_equal(eqx.combine(dynamic, static), model)

    @eqx.filter_jit
    def solve(x):
        return _Solution(x, _states(x[:2] * 2)[at])

    out = jax.vmap(solve)(jnp.ones((5, 3)))
    assert out.value.shape == (5, 3)
    assert jax.tree_util.tree_leaves(eqx.filter(out.state, eqx.is_array))[0].shape == (
        5,
        2,
    )


def test_vmap_in_axes_spec_from_tree_map():
    model = AutoMLP(2, 3, KEY)
    stacked = jax.tree_util.tree_map(lambda x: jnp.stack([x, x + 1]), model)
    in_axes = jax.tree_util.tree_map(lambda _: 0, model)
    out = jax.vmap(lambda m, x: m(x), in_axes=(in_axes, None))(stacked, jnp.ones(3))
    assert out.shape == (2, 3)


def test_attribute_containers_are_the_built_ins_assigned():
    model = AutoMLP(3, 2, KEY)
    assert type(model.layers) is list and len(model.layers) == 3
    assert type(model.layers[0].sizes) is list
    mixed = AutoMixed(KEY)
    assert type(mixed.stuff) is list and type(mixed.stuff[3]) is dict
    assert type(mixed.blocks) is dict
    assert model.layers[0].sizes == [2, 2] and model.layers[0].sizes + [1] == [2, 2, 1]
    assert len(jax.tree_util.tree_leaves(model)) == 6


def test_partition_is_not_recomputed_on_flatten():
    model = AutoMLP(2, 3, KEY)
    _, treedef = jax.tree_util.tree_flatten(model)
    # Unflatten with non-array leaves, then flatten again: same structure.
    odd = jax.tree_util.tree_unflatten(treedef, ["x"] * treedef.num_leaves)
    assert jax.tree_util.tree_structure(odd) == treedef
    assert jax.tree_util.tree_leaves(odd) == ["x"] * treedef.num_leaves


def test_shape_dtype_struct_templates_match_real_instances():
    model = AutoMLP(2, 3, KEY)
    abstract = eqx.filter_eval_shape(AutoMLP, 2, 3, KEY)
    assert jax.tree_util.tree_structure(abstract) == jax.tree_util.tree_structure(model)
    assert all(
        isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree_util.tree_leaves(abstract)
    )
    by_jax = jax.eval_shape(lambda: AutoMLP(2, 3, KEY))
    assert jax.tree_util.tree_structure(by_jax) == jax.tree_util.tree_structure(model)

    class Holder(asx.AutoModule):
        w: jax.Array  # a ShapeDtypeStruct stands for an array only where one goes
        n: int

    real = Holder(jnp.zeros(2), 3)
    hand_built = Holder(jax.ShapeDtypeStruct((2,), jnp.float32), 3)
    assert jax.tree_util.tree_structure(real) == jax.tree_util.tree_structure(
        hand_built
    )


def test_numpy_arrays_and_scalars_are_dynamic_python_scalars_static():
    class M(asx.AutoModule):
        a: object
        b: object
        c: object
        d: object

    m = M(np.ones(2), np.float32(1.0), 1.0, True)
    assert keystrs(m) == [".a", ".b"]


def test_construct_inside_jit_from_tracers():
    @jax.jit
    def build(w):
        layer = asx.tree_at(lambda m: m.weight, AutoMLP(1, 2, KEY).layers[0], w)
        return layer(jnp.ones(2)), AutoMLP(1, 2, KEY).layers[0].weight * w

    out, _ = build(jnp.eye(2))
    assert out.shape == (2,)

    class Affine(asx.AutoModule):
        w: jax.Array
        name: str

    @jax.jit
    def make(w):
        return Affine(w * 2, "aff")

    made = make(jnp.ones(2))
    assert made.name == "aff" and keystrs(made) == [".w"]


def test_ordered_and_default_dicts_keep_their_types_and_eqx_key_order():
    import collections

    class Dicts(asx.AutoModule):
        ordered: object
        counts: object

        def __init__(self):
            self.ordered = collections.OrderedDict(w=jnp.ones(2), k=3, a=jnp.zeros(1))
            self.counts = collections.defaultdict(int, a=1)

    class EqxDicts(eqx.Module):
        ordered: object
        counts: object
        __init__ = Dicts.__init__

    m = Dicts()
    assert keystrs(m) == array_keystrs(EqxDicts()) == [".ordered['w']", ".ordered['a']"]
    assert isinstance(m.ordered, collections.OrderedDict) and list(m.ordered) == [
        "w",
        "k",
        "a",
    ]
    assert type(m.counts) is collections.defaultdict and m.counts["a"] == 1
    again = jax.tree_util.tree_map(lambda x: x + 1, m)
    assert list(again.ordered) == ["w", "k", "a"] and again.counts == {"a": 1}
    assert type(again.ordered) is collections.OrderedDict
    assert type(again.counts) is collections.defaultdict
    assert again.counts.default_factory is int


def test_copies_and_unions_of_frozen_containers_are_plain_builtins():
    import collections

    class Holder(asx.AutoModule):
        ordered: object
        counts: object
        table: object

        def __init__(self):
            self.ordered = collections.OrderedDict(a=1, b=jnp.ones(1))
            self.counts = collections.defaultdict(list, x=jnp.ones(3))
            self.table = {"q": 1}

    m = Holder()
    merged = m.counts | {"y": jnp.full(2, 7.0)}
    assert type(merged) is collections.defaultdict and sorted(merged) == ["x", "y"]
    np.testing.assert_allclose(jax.jit(lambda d: d["y"])(merged), [7.0, 7.0])
    assert list(m.ordered | {"c": 1}) == ["a", "b", "c"] and list(
        {"c": 1} | m.ordered
    ) == ["c", "a", "b"]
    copied = m.ordered.copy()
    copied["z"] = 0  # a plain, mutable OrderedDict
    assert type(copied) is collections.OrderedDict and "z" not in m.ordered
    assert type(m.table | {"r": 2}) is dict and type(m.table.copy()) is dict


class Holds(asx.AutoModule):
    value: Any


class CustomInit(asx.AutoModule):
    value: Any

    def __init__(self, value):
        self.value = value


def test_numpy_object_arrays_are_refused_by_attribute_path():
    objects = np.array([1, "a"], dtype=object)
    with pytest.raises(
        TypeError, match=r"Holds\.value\[1\]\['x'\] is a numpy array of dtype object"
    ):
        Holds([jnp.ones(1), {"x": objects}])
    with pytest.raises(
        TypeError, match=r"Holds\.value is a numpy array of dtype object"
    ):
        Holds(objects)


@pytest.mark.parametrize("cls", [Holds, CustomInit], ids=["generated", "custom"])
def test_containers_that_contain_themselves_are_a_clear_error(cls):
    cyclic_list: list = [jnp.ones(1)]
    cyclic_list.append(cyclic_list)
    with pytest.raises(
        TypeError, match=r"\.value\[1\] is a container that contains itself"
    ):
        cls(cyclic_list)
    cyclic_dict: dict = {"a": 1}
    cyclic_dict["b"] = [cyclic_dict]
    with pytest.raises(
        TypeError, match=r"\.value\['b'\]\[0\] is a container that contains"
    ):
        cls(cyclic_dict)
    shared = [jnp.ones(1)]
    assert len(jax.tree_util.tree_leaves(cls([shared, shared]))) == 2  # not a cycle


@pytest.mark.parametrize("bottom", ["array", "int", "mixed"])
def test_nesting_as_deep_as_equinox_builds_and_jits(bottom):
    # Equinox builds and jits 900 nested lists; Python's recursion limit is 1000.
    value = {"array": jnp.ones(1), "int": 3, "mixed": [jnp.ones(1), "s"]}[bottom]
    for _ in range(900):
        value = [value]
    model = Holds(value)
    leaves = jax.jit(jax.tree_util.tree_leaves)(model)
    assert len(leaves) == (0 if bottom == "int" else 1)
    again = jax.tree_util.tree_map(lambda x: x + 1, model)
    inner = again.value
    for _ in range(900):
        inner = inner[0]
    expected = {"array": lambda x: x == 2, "int": lambda x: x == 3}
    assert expected.get(bottom, lambda x: x[0] == 2 and x[1] == "s")(inner)


def test_a_module_nested_in_a_mixed_field_keeps_its_own_static_leaves():
    class Inner(asx.AutoModule):
        xs: list

    class Outer(asx.AutoModule):
        items: list

    outer = Outer([Inner([jnp.ones(1), jax.nn.relu]), "tag", jnp.ones(1)])
    rebuilt = jax.tree_util.tree_map(lambda x: x, outer)  # filled in lazily
    inner = rebuilt.items[0]
    assert inner.xs[1] is jax.nn.relu and rebuilt.items[1] == "tag"
    assert len(jax.tree_util.tree_leaves(inner)) == 1  # relu is still static
    assert jax.jit(lambda m: m.xs[0] + 1)(inner) == 2


def test_flat_mixed_lists_split_like_nested_ones():
    """A list of layers, arrays and plain values is wrapped item by item (the fast
    path); one with a nested container takes the general walk. Both give the same
    structure for the same items, and the same values back."""

    class Net(asx.AutoModule):
        items: list

    linear = eqx.nn.Linear(2, 2, key=KEY)
    flat = [linear, jax.nn.relu, jnp.ones(2), 3, "x", 1.5, eqx.nn.Dropout(0.1)]
    fast, general = Net(flat), Net([*flat, (jnp.ones(1),)])
    fast_paths = [jax.tree_util.keystr(p) for p, _ in jtu_paths(fast)]
    assert (
        fast_paths
        == [jax.tree_util.keystr(p) for p, _ in jtu_paths(general)][: len(fast_paths)]
    )
    assert fast_paths == [".items[0].weight", ".items[0].bias", ".items[2]"]
    rebuilt = jax.tree_util.tree_map(lambda x: x, fast)
    assert rebuilt.items[1] is jax.nn.relu and rebuilt.items[3:6] == [3, "x", 1.5]
    # 1 and 1.0 (equal under ==) must not share a treedef.
    assert jax.tree_util.tree_structure(Net([jnp.ones(1), 1])) != (
        jax.tree_util.tree_structure(Net([jnp.ones(1), 1.0]))
    )
    assert jax.tree_util.tree_structure(Net(list(flat))) == (
        jax.tree_util.tree_structure(fast)
    )
    assert jax.jit(lambda m: m.items[1](m.items[2]))(fast).shape == (2,)


def jtu_paths(tree: Any) -> list[Any]:
    return jax.tree_util.tree_flatten_with_path(tree)[0]


class RaisingEq:  # == in Python, raising
    def __eq__(self, other):
        raise ValueError("no")

    __hash__ = object.__hash__


class Stack(asx.AutoModule):
    layers: list


def double(x):
    return 2 * x


def _dynamic_half(value: Any) -> Any:
    """What eqx.partition(value, eqx.is_array) keeps: None for every other leaf."""
    return eqx.filter(value, eqx.is_array)


def test_a_mixed_list_is_a_list_and_its_child_the_dynamic_half():
    """A stack of layers and activations: the attribute is the very list assigned;
    the pytree child is that list with None for each non-array leaf, exactly the
    dynamic half eqx.partition gives, and the aux puts the leaves back."""
    import pickle

    linear = eqx.nn.Linear(2, 2, key=KEY)
    layers = [linear, jax.nn.relu, eqx.nn.Dropout(0.1), 2]
    net = Stack(layers)
    assert net.layers is layers and net.layers[0] is linear
    # Layers are fast carriers in the pytree only: the paths of the dynamic half.
    assert [jax.tree_util.keystr(p)[len(".layers") :] for p, _ in jtu_paths(net)] == [
        jax.tree_util.keystr(p) for p, _ in jtu_paths(_dynamic_half(layers))
    ]
    plain = [jnp.ones(2), jax.nn.relu, {"w": jnp.ones(1), "n": 3}, (2.0, jnp.ones(1))]
    (child,) = jax.tree_util.tree_structure(Stack(plain)).children()
    assert child == jax.tree_util.tree_structure(_dynamic_half(plain))
    rebuilt = jax.tree_util.tree_map(lambda x: x + 1, net)
    assert type(rebuilt.layers) is list and type(rebuilt.layers[0]) is eqx.nn.Linear
    assert rebuilt.layers[1] is jax.nn.relu and rebuilt.layers[3] == 2
    assert type(rebuilt.layers[3]) is int and rebuilt.layers[2].p == 0.1
    assert jax.tree_util.tree_structure(rebuilt) == jax.tree_util.tree_structure(net)
    picklable = Stack([linear, double, 2])  # jax.nn.relu itself cannot be pickled
    again = pickle.loads(pickle.dumps(picklable))
    assert jax.tree_util.tree_structure(again) == jax.tree_util.tree_structure(
        picklable
    )
    assert again.layers[1] is double and type(again.layers) is list
    # Static items that differ, or equal ones of another type, give another treedef.
    other = [Stack([linear, f, 2]) for f in (jax.nn.gelu, jax.nn.relu)]
    assert len({jax.tree_util.tree_structure(m) for m in other}) == 2
    assert jax.tree_util.tree_structure(
        Stack([linear, jax.nn.relu, 1])
    ) != jax.tree_util.tree_structure(Stack([linear, jax.nn.relu, 1.0]))
    # A static item whose == raises is reported with its type when compared.
    a, b = Stack([linear, RaisingEq()]), Stack([linear, RaisingEq()])
    with pytest.raises(Exception) as info:  # JAX wraps the error in its own
        _ = jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    chain, err = [], info.value
    while err is not None:
        chain.append(str(err))
        err = err.__cause__ or err.__context__
    assert any("of type RaisingEq cannot be compared" in m for m in chain)
    # Surgery on a static item.
    swapped = asx.tree_at(lambda m: m.layers[1], net, jax.nn.gelu)
    assert swapped.layers[1] is jax.nn.gelu
    assert jax.tree_util.keystr(jtu_paths(swapped)[0][0]) == ".layers[0].weight"


def test_nested_containers_and_tuples_split_per_leaf():
    """Lists, dicts and tuples inside a mixed field, at any depth: eqx.Module's array
    paths, the plain values back, the dynamic half as the child."""
    import pickle

    linear = eqx.nn.Linear(2, 2, key=KEY)
    value = [linear, {"w": jnp.ones(2), "tag": "x", "f": double}, [jnp.ones(1), 3]]
    net = Stack(value)
    assert type(net.layers[1]) is dict
    assert list(net.layers[1]) == ["w", "tag", "f"]  # the user's key order
    paths = [jax.tree_util.keystr(p) for p, _ in jtu_paths(net)]
    assert paths == [
        ".layers[0].weight",
        ".layers[0].bias",
        ".layers[1]['w']",
        ".layers[2][0]",
    ]
    structure = jax.tree_util.tree_structure(net)
    again = pickle.loads(pickle.dumps(net))
    assert jax.tree_util.tree_structure(again) == structure
    assert again.layers[1]["f"] is double and again.layers[2][1] == 3
    rebuilt = jax.tree_util.tree_map(lambda x: x * 2, net)
    assert rebuilt.layers[1]["tag"] == "x" and rebuilt.layers[2][1] == 3
    assert asx.tree_at(lambda m: m.layers[1]["tag"], net, "y").layers[1]["tag"] == "y"
    assert jax.tree_util.tree_structure(Stack(list(value))) == structure

    for deep in (
        [jnp.ones(1), (jnp.ones(1), "t")],
        nested_lists(20, [jnp.ones(1), "deep"]),
    ):
        model = Stack(deep)
        (child,) = jax.tree_util.tree_structure(model).children()
        assert child == jax.tree_util.tree_structure(_dynamic_half(deep))
        rebuilt = jax.tree_util.tree_map(lambda x: x + 1, model)
        assert jax.tree_util.tree_structure(rebuilt) == (
            jax.tree_util.tree_structure(model)
        )
        assert jax.tree_util.tree_structure(rebuilt.layers) == (
            jax.tree_util.tree_structure(deep)
        )
        assert jax.jit(lambda m: jax.tree_util.tree_leaves(m)[0] + 1)(model).shape


def nested_lists(depth: int, bottom: list) -> list:
    nest = bottom
    for _ in range(depth):
        nest = [nest]
    return nest


class _UnportedBlock(eqx.Module):
    """A user's eqx.Module kept during a migration: state and a function inside."""

    norm: eqx.nn.BatchNorm
    activation: Any

    def __init__(self):
        self.norm = eqx.nn.BatchNorm(3, "batch", mode="batch")
        self.activation = jax.nn.relu


class _WithUnported(asx.AutoModule):
    layers: list

    def __init__(self, key):
        self.layers = [eqx.nn.Linear(3, 3, key=key), jax.nn.gelu, _UnportedBlock()]


class _EqxWithUnported(eqx.Module):
    layers: list
    __init__ = _WithUnported.__init__


def test_static_leaves_survive_make_with_state_rewriting_a_module_inside():
    """make_with_state changes the structure inside the unported block (its
    StateIndex); the function beside it and the one inside it stay in place."""

    def run(m, xs, state):
        def one(x, s):
            x = m.layers[1](m.layers[0](x))
            y, s = m.layers[2].norm(x, s)
            return m.layers[2].activation(y), s

        return jax.vmap(one, (0, None), (0, None), axis_name="batch")(xs, state)

    xs = jax.random.normal(KEY, (4, 3))
    model, state = eqx.nn.make_with_state(_WithUnported)(KEY)
    ref, ref_state = eqx.nn.make_with_state(_EqxWithUnported)(KEY)
    assert model.layers[1] is jax.nn.gelu
    assert model.layers[2].activation is jax.nn.relu
    out, _ = jax.jit(run)(model, xs, state)
    expected, _ = eqx.filter_jit(run)(ref, xs, ref_state)
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    again = jax.tree_util.tree_map(lambda x: x, model)
    assert again.layers[1] is jax.nn.gelu and again.layers[2].activation is jax.nn.relu


class _CounterBlock(eqx.Module):
    """A user's stateful layer written as Equinox documents: a bare StateIndex."""

    index: eqx.nn.StateIndex

    def __init__(self):
        self.index = eqx.nn.StateIndex(jnp.zeros(3))


def _counter_items():
    return [eqx.nn.StateIndex(jnp.zeros(3)), "relu", 3]


def _counter_block_items():
    return [_CounterBlock(), jax.nn.relu, 3]


@pytest.mark.parametrize("items", [_counter_items, _counter_block_items])
def test_static_items_beside_a_state_index_survive_make_with_state(items):
    """make_with_state gives each StateIndex a new marker (a static field of a node
    the list holds), then unflattens: the static items beside it stay."""

    def run(m, x, state):
        index = (
            m.items[0] if type(m.items[0]) is eqx.nn.StateIndex else m.items[0].index
        )
        count = state.get(index)
        return x * m.items[2] + count, state.set(index, count + 1)

    def make(base):
        class Net(base):
            items: list

            def __init__(self):
                self.items = items()

        return eqx.nn.make_with_state(Net)()

    model, state = make(asx.AutoModule)
    ref, ref_state = make(eqx.Module)
    assert model.items[1:] == ref.items[1:]
    out, state = jax.jit(run)(model, jnp.ones(3), state)
    expected, ref_state = eqx.filter_jit(run)(ref, jnp.ones(3), ref_state)
    np.testing.assert_array_equal(out, expected)
    assert array_keystrs(model) == array_keystrs(ref)


@pytest.mark.parametrize("put", [0, "s", None], ids=["zero", "string", "none"])
def test_a_node_mapped_to_a_leaf_keeps_the_static_items_beside_it(put):
    """An `is_leaf` tree_map stopping at a user's eqx.Module in a list (an in_axes
    prefix): the static items beside it still read back, as in the eqx.Module."""

    def mapped(base):
        class Net(base):
            items: list

        model = Net(_counter_block_items())
        return jax.tree_util.tree_map(
            lambda x: put if isinstance(x, _CounterBlock) else x,
            model,
            is_leaf=lambda x: isinstance(x, _CounterBlock),
        )

    assert mapped(asx.AutoModule).items == mapped(eqx.Module).items


@pytest.mark.parametrize(
    "wrap",
    [lambda z: z, lambda z: (z,), lambda z: [1, z], lambda z: {"z": z}],
    ids=["scalar", "tuple", "list", "dict"],
)
def test_static_floats_compare_bit_for_bit(wrap):
    class Scaled(asx.AutoModule):
        w: jax.Array
        z: object

    def first(z):
        return z if isinstance(z, float) else jax.tree_util.tree_leaves(z)[-1]

    traces = []

    @jax.jit
    def f(m):
        traces.append(None)
        return m.w / first(m.z)

    w = jnp.ones(1)
    assert f(Scaled(w, wrap(0.0))).tolist() == [float("inf")]
    assert f(Scaled(w, wrap(-0.0))).tolist() == [float("-inf")]  # not reused
    assert len(traces) == 2
    nan = float("nan")
    f(Scaled(w, wrap(nan)))
    f(Scaled(w, wrap(nan)))  # a NaN reuses its own program
    assert len(traces) == 3
    assert math.copysign(1.0, first(Scaled(w, wrap(-0.0)).z)) == -1.0


def test_a_tuple_field_is_static_when_it_holds_scalars_only():
    # Tuples of scalars (a shape, a kernel size) are decided from their types by
    # the split cached per class; a tuple of other values takes the general path.
    class Shaped(asx.AutoModule):
        w: jax.Array
        shape: tuple

    class Loose(asx.AutoModule):
        w: jax.Array
        shape: tuple[float | jax.Array, ...]  # numbers here are leaves

    w = jnp.ones(2)
    first = Shaped(w, (2, 3))
    assert jax.tree_util.tree_leaves(first) == [w]
    held = Shaped(w, (jnp.zeros(1), 3))
    assert keystrs(held) == [".w", ".shape[0]"]
    again = Shaped(w, (2, 3))
    assert jax.tree_util.tree_structure(again) == jax.tree_util.tree_structure(first)
    assert jax.tree_util.tree_structure(Shaped(w, (2.0, 3))) != (
        jax.tree_util.tree_structure(first)
    )
    assert jax.tree_util.tree_structure(Shaped(w, (-0.0,))) != (
        jax.tree_util.tree_structure(Shaped(w, (0.0,)))
    )
    assert keystrs(Loose(w, (1.0, 2.0))) == [".w", ".shape[0]", ".shape[1]"]
    assert jax.jit(lambda m: m.w * m.shape[1])(again).tolist() == [3.0, 3.0]


def test_a_held_layer_with_a_zero_float_is_held_exactly():
    class Net(asx.AutoModule):
        dropout: eqx.nn.Dropout

    zero, minus_zero = Net(eqx.nn.Dropout(0.0)), Net(eqx.nn.Dropout(-0.0))
    structure = jax.tree_util.tree_structure
    assert structure(zero) != structure(minus_zero)
    assert structure(zero) == structure(Net(eqx.nn.Dropout(0.0)))
    assert structure(zero) == structure(jax.tree_util.tree_map(lambda x: x, zero))
    assert structure(Net(eqx.nn.Dropout(0.5))) != structure(zero)


class WithFunctions(asx.AutoModule):
    w: jax.Array
    activation: Any
    layers: tuple
    shape: tuple
    name: str


class MixedLists(asx.AutoModule):
    layers: list
    sizes: list
    name: str
    scale: float


class LayerList(asx.AutoModule):
    layers: list
    sizes: list


class Arrays(asx.AutoModule):
    in_list: list
    in_tuple: tuple
    sizes: list


def test_a_tuple_taken_for_layers_holding_scalars_takes_the_general_path():
    key = jax.random.key(0)
    first = WithFunctions(
        jnp.ones(2), jax.nn.gelu, (eqx.nn.Linear(2, 2, key=key),), (2,), "a"
    )
    other = WithFunctions(jnp.ones(2), jax.nn.gelu, (1, 2), (2,), "b")
    assert other.layers == (1, 2)
    leaves = jax.tree_util.tree_leaves(other)
    assert len(leaves) == 1 and len(jax.tree_util.tree_leaves(first)) == 3


def test_a_list_taken_for_arrays_holding_other_values_takes_the_general_path():
    first = Arrays([jnp.ones(2), jnp.zeros(3)], (jnp.ones(()),), [1])
    linear = eqx.nn.Linear(2, 2, key=jax.random.key(0))
    other = Arrays([jnp.ones(2), "relu", linear], (1, 2), [1])
    assert other.in_list[1] == "relu" and type(other.in_list[2]) is eqx.nn.Linear
    assert other.in_tuple == (1, 2)
    assert len(jax.tree_util.tree_leaves(first)) == 3
    assert len(jax.tree_util.tree_leaves(other)) == 3  # the string and ints static
    with pytest.raises(TypeError, match=r"Marked\.xs is marked"):
        Marked((jnp.ones(2),))


class Marked(asx.AutoModule):
    xs: tuple = eqx.field(static=True)


class Activation(asx.AutoModule):
    w: jax.Array
    activation: Any


def test_a_function_hiding_an_array_warns_once_its_type_is_known():
    w = jnp.ones(3)
    for _ in range(2):  # a lambda's type is met: later ones are still checked
        Activation(jnp.ones(2), lambda x: x)
    with pytest.warns(UserWarning, match=r"Activation\.activation holds"):
        Activation(jnp.ones(2), lambda x: x * w)
