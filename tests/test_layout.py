"""The node format (`_layout`): the Aux tuple, static records that carry no field
names, lazy fill-in."""

import dataclasses
import pickle
import sys
import threading

import equinox as eqx
import jax
import jax.numpy as jnp

import autostatic as asx
from autostatic.core._layout import Aux, make_aux, StaticSequence
from autostatic.core._static_values import Compared, snapshot_leaf


class Pair(asx.AutoModule):
    w: jax.Array
    scale: float
    name: str


def _aux(model):
    return jax.tree_util.tree_structure(model).node_data()[1]


def test_aux_is_a_flat_tuple_with_named_accessors():
    aux = _aux(Pair(jnp.ones(2), 0.5, "p"))
    assert type(aux) is Aux and isinstance(aux, tuple)
    assert aux.layout.child_names == ("w",)
    assert aux.layout.entry_names == ("scale", "name")
    assert aux.layout.static_types == (float, str)
    assert aux.entries == (0.5, "p")
    assert tuple(aux) == (aux.layout, 0.5, "p")


def test_one_layout_object_per_types_and_1_1_0_true_differ():
    a, b = _aux(Pair(jnp.ones(2), 0.5, "p")), _aux(Pair(jnp.zeros(2), 1.5, "q"))
    assert a.layout is b.layout  # compared by identity in treedef ==
    one, one_f, true = (_aux(Pair(jnp.ones(2), v, "p")) for v in (1, 1.0, True))
    assert one != one_f and one != true and one_f != true
    assert one.layout is not one_f.layout and one.layout.untyped is one_f.layout.untyped
    assert make_aux(one_f.layout, (1, "p")) == one  # re-typed from any layout


def test_aux_pickles_with_function_types():
    aux = make_aux(_aux(Pair(jnp.ones(2), 0.5, "p")).layout, (len, "x"))
    again = pickle.loads(pickle.dumps(aux))
    assert again == aux and again.layout.static_types == (type(len), str)
    assert again.layout is aux.layout


def test_static_leaves_compare_in_c_unless_eq_is_python():
    assert snapshot_leaf(len) is len and snapshot_leaf(3) == 3

    class Weird:
        def __eq__(self, other):
            raise ValueError("no")

        __hash__ = object.__hash__

    weird = snapshot_leaf(Weird())
    assert type(weird) is Compared  # so a failing comparison says what to do
    assert type(snapshot_leaf({1, 2})) is not set  # a frozen copy of a set


class Left(asx.AutoModule):
    a: list
    sizes: list


class Right(asx.AutoModule):
    b: list
    dims: list


def test_no_record_holds_a_field_name_or_path():
    """Equal values in different fields and classes give equal records: the aux
    entries and the children's treedefs."""
    value = [jnp.ones(2), jax.nn.relu, {"k": 3, "w": jnp.ones(1)}]
    left, right = Left(value, [8, 8]), Right(list(value), [8, 8])
    (left_child,) = jax.tree_util.tree_structure(left).children()
    (right_child,) = jax.tree_util.tree_structure(right).children()
    assert left_child == right_child
    assert _aux(left).entries == _aux(right).entries
    assert type(_aux(left).entries[1]) is StaticSequence
    for entry in _aux(left).entries:
        assert "Left" not in repr(entry) and "sizes" not in repr(entry)


class StaticFirst(asx.AutoModule):
    name: str
    xs: list
    tags: list


def test_lazy_fill_in_is_never_seen_half_done_by_other_threads():
    # Reads race on a freshly unflattened instance: a thread must never see a
    # missing field or a half-made value while another fills the fields in.
    model = StaticFirst("m", [jnp.ones(2), "tag", 3], ["a", "b"])
    leaves, treedef = jax.tree_util.tree_flatten(model)
    n_threads, rounds = 8, 250
    problems: list[str] = []
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(rounds):
            fresh = jax.tree_util.tree_unflatten(treedef, leaves)
            barrier = threading.Barrier(n_threads)

            def read(fresh: StaticFirst = fresh, barrier: threading.Barrier = barrier):
                barrier.wait()
                try:
                    xs, tags = fresh.xs, fresh.tags
                    if xs[1] != "tag" or xs[2] != 3 or list(tags) != ["a", "b"]:
                        problems.append(repr((xs, tags)))
                except Exception as err:
                    problems.append(repr(err))

            threads = [threading.Thread(target=read) for _ in range(n_threads)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    finally:
        sys.setswitchinterval(old_interval)
    assert problems == [], problems[:5]


class HoldsStatic(asx.AutoModule):
    w: jax.Array
    config: tuple
    sizes: list


def test_an_immutable_static_value_is_shared_and_a_mutable_one_is_not():
    # As Equinox shares a static field's value: a layer without arrays (a tree of
    # modules and tuples) is made once; a list is made anew for every read, so
    # changing one model's list changes no other's.
    model = HoldsStatic(jnp.ones(2), (eqx.nn.Dropout(0.1), (2, 3)), [[1, 2], [3]])
    leaves, treedef = jax.tree_util.tree_flatten(model)
    a, b = (jax.tree_util.tree_unflatten(treedef, leaves) for _ in range(2))
    assert type(a.config[0]) is eqx.nn.Dropout and a.config[0].p == 0.1
    assert a.config == (eqx.nn.Dropout(0.1), (2, 3))
    assert a.config is b.config
    assert a.sizes == b.sizes == [[1, 2], [3]] and a.sizes is not b.sizes
    assert a.sizes[0] is not b.sizes[0]
    a.sizes[0].append(9)
    assert b.sizes == [[1, 2], [3]]
    assert jax.tree_util.tree_structure(a) != treedef  # the change is seen
    assert jax.tree_util.tree_structure(b) == treedef


class Inner(asx.AutoModule):
    xs: list
    n: int


class Outer(asx.AutoModule):
    inners: list
    single: Inner


def test_modules_filled_in_with_their_parent_still_see_changes_in_place():
    # Reading a lazily unflattened module fills in the modules below it too; each
    # records its own lists then, so a later change in place is seen by jax.jit.
    model = Outer([Inner([jnp.ones(2)], 1), Inner([jnp.ones(2)], 2)], Inner([], 3))
    leaves, treedef = jax.tree_util.tree_flatten(model)
    fresh = jax.tree_util.tree_unflatten(treedef, leaves)
    first, single = fresh.inners[0], fresh.single
    first.xs.append(jnp.zeros(3))
    single.xs.append(jnp.zeros(1))
    total = jax.jit(lambda m: sum(x.sum() for i in m.inners for x in i.xs))
    assert len(jax.tree_util.tree_leaves(fresh)) == 4
    assert float(total(fresh)) == 4.0
    assert [i.n for i in fresh.inners] == [1, 2] and single.n == 3


class Config(asx.AutoModule):
    sizes: list
    name: str


def test_a_static_module_holding_a_list_is_made_anew_for_each_read():
    model = HoldsStatic(jnp.ones(2), (Config([1, 2], "c"), "tag"), [])
    leaves, treedef = jax.tree_util.tree_flatten(model)
    a, b = (jax.tree_util.tree_unflatten(treedef, leaves) for _ in range(2))
    assert a.config[0].sizes == [1, 2] and a.config[0] is not b.config[0]
    a.config[0].sizes.append(3)
    assert b.config[0].sizes == [1, 2]


class MixedItems(asx.AutoModule):
    as_list: list
    as_tuple: tuple
    no_layers: list


class MixedItemsTwin(eqx.Module):
    as_list: list
    as_tuple: tuple
    no_layers: list


def _mixed_items(cls):
    linear = eqx.nn.Linear(2, 2, key=jax.random.key(0))
    return cls(
        [linear, jax.nn.relu, eqx.nn.Dropout(0.1)],
        (jax.nn.gelu, linear, "x"),
        [jnp.ones(2), jnp.tanh],
    )


def _same_items(value, twin_value):
    assert type(value) is type(twin_value) and len(value) == len(twin_value)
    for a, b in zip(value, twin_value):
        assert type(a) is type(b)
        assert (
            a is b
            if not isinstance(a, (eqx.Module, jax.Array))
            else eqx.tree_equal(a, b)
        )


def test_a_lazily_filled_mixed_list_or_tuple_holds_what_the_twin_s_does():
    # Layers and static leaves put back into a fresh copy of the child's items. The
    # first fill-in meets the item types; later ones make the items of each shape
    # by its generated code, or fall back where a tree_map changed the child.
    model, twin = _mixed_items(MixedItems), _mixed_items(MixedItemsTwin)
    leaves, treedef = jax.tree_util.tree_flatten(model)

    def drop_linear(x):
        return jnp.zeros(1) if isinstance(x, eqx.nn.Linear) else x

    def is_linear(x):
        return isinstance(x, eqx.nn.Linear)

    mapped_twin = jax.tree_util.tree_map(drop_linear, twin, is_leaf=is_linear)
    for _ in range(3):
        fresh = jax.tree_util.tree_unflatten(treedef, leaves)
        for name in ("as_list", "as_tuple", "no_layers"):
            _same_items(getattr(fresh, name), getattr(twin, name))
        fresh.as_list.append(jnp.zeros(3))  # the fresh list is the one watched
        assert len(jax.tree_util.tree_leaves(fresh)) == len(leaves) + 1
        assert len(model.as_list) == 3
        mapped = jax.tree_util.tree_map(drop_linear, model, is_leaf=is_linear)
        for name in ("as_list", "as_tuple", "no_layers"):
            _same_items(getattr(mapped, name), getattr(mapped_twin, name))


class Lists(asx.AutoModule):
    sizes: list
    layers: list
    inners: list
    stack: list
    stack_tuple: tuple


def _lists_model():
    linear = eqx.nn.Linear(2, 2, key=jax.random.key(0))
    return Lists(
        [2, 0.0],
        [linear, jax.nn.relu],
        [Inner([jnp.ones(2)], 1), Inner([jnp.ones(1)], 2)],
        [linear, linear],
        (linear, linear),
    )


# A change in place to each list a `Lists` holds, one per fresh fill-in.
_CHANGES_IN_PLACE = {
    "sizes": lambda m: m.sizes.append(3),
    "layers": lambda m: m.layers.append(jnp.zeros(3)),
    "inners": lambda m: m.inners.append(jax.nn.relu),
    "an inner's xs": lambda m: m.inners[0].xs.append(jnp.ones(3)),
    "stack": lambda m: m.stack.append(jnp.zeros(4)),
}


def test_every_fill_in_records_its_lists_however_their_item_types_were_met():
    # The first fill-in meets the item types; later ones take them as known (a
    # mixed list's items made by code for its shape, a stack of layers mapped at
    # once, AutoModules filled in without a look at each). In every one, the values
    # are the natural ones, the AutoModules a list holds are filled in with their
    # parent, and a change in place to each list is seen by flatten and jax.jit as
    # by a model built afresh from the same values.
    model = _lists_model()
    leaves, treedef = jax.tree_util.tree_flatten(model)
    total = jax.jit(lambda m: sum(x.sum() for x in jax.tree_util.tree_leaves(m)))
    for _ in range(3):
        for change in _CHANGES_IN_PLACE.values():
            fresh = jax.tree_util.tree_unflatten(treedef, leaves)
            assert fresh.sizes == [2, 0.0] and type(fresh.sizes[1]) is float
            assert fresh.layers[1] is jax.nn.relu
            assert type(fresh.layers[0]) is eqx.nn.Linear
            assert type(fresh.stack) is list and type(fresh.stack_tuple) is tuple
            for stack in (fresh.stack, fresh.stack_tuple):
                assert [type(x) for x in stack] == [eqx.nn.Linear] * 2
                assert eqx.tree_equal(list(stack), model.stack)
            assert all("xs" in vars(i) for i in fresh.inners)  # filled in with it
            change(fresh)
            afresh = Lists(*(getattr(fresh, f.name) for f in dataclasses.fields(Lists)))
            assert jax.tree_util.tree_structure(fresh) == jax.tree_util.tree_structure(
                afresh
            )
            assert float(total(fresh)) == float(total(afresh))
