"""The node format (`_plan`): the Aux tuple, static records that carry no field
names, values made at each unflatten."""

import contextlib
import dataclasses
import gc
import pickle
import weakref

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import autostatic as asx
from autostatic.core import _leaves, _plan, _static
from autostatic.core._fields import fields_of
from autostatic.core._split import StaticSeq
from autostatic.core._static import Compared, hold


class Pair(asx.AutoModule):
    w: jax.Array
    scale: float
    name: str


def _aux(model):
    return jax.tree_util.tree_structure(model).node_data()[1]


def test_aux_is_a_flat_tuple_of_the_plan_and_the_entries():
    aux = _aux(Pair(jnp.ones(2), 0.5, "p"))
    assert type(aux) is tuple
    plan = aux[0]
    assert [k.name for k in plan.child_keys] == ["w"]
    assert plan.entry_names == ("scale", "name")
    assert aux == (plan, 0.5, "p")
    assert repr(aux).startswith("(Pair[static scale, name; Pair.scale: a Python number")
    assert repr(aux).endswith("], 0.5, 'p')")


def test_one_plan_object_per_types_and_1_1_0_true_differ():
    a, b = _aux(Pair(jnp.ones(2), 0.5, "p")), _aux(Pair(jnp.zeros(2), 1.5, "q"))
    assert a[0] is b[0]  # compared by identity in treedef ==
    one, one_f, true = (_aux(Pair(jnp.ones(2), v, "p")) for v in (1, 1.0, True))
    assert one != one_f and one != true and one_f != true
    assert one[0] is not one_f[0]
    numpy_children = _aux(Pair(jnp.ones(2).__array__(), 1, "p"))
    assert numpy_children[0] is one[0]  # the plan holds no child's type


def test_aux_pickles_with_function_types():
    aux = _aux(Pair(jnp.ones(2), len, "x"))
    again = pickle.loads(pickle.dumps(aux))
    assert again == aux and again[0] is aux[0]


class Held(asx.AutoModule):
    tags: frozenset
    zero: complex
    nan: float
    dtype: type
    w: jax.Array


@pytest.mark.parametrize("tags", [frozenset({1, 2}), {1, 2}])
def test_a_treedef_of_held_static_values_pickles_equal_and_unflattens_them(tags):
    # Each held form (a set's frozen copy, an exact zero or NaN, a dtype) pickles,
    # hashes and compares as the value it stands for; the unflatten gives the value.
    model = Held(tags, complex(-0.0, 1), float("nan"), np.float32, jnp.ones(2))
    treedef = jax.tree_util.tree_structure(model)
    again = pickle.loads(pickle.dumps(treedef))
    assert again == treedef and hash(again) == hash(treedef)
    back = jax.tree_util.tree_unflatten(again, [jnp.zeros(2)])
    assert type(back.tags) is type(tags) and back.tags == tags
    assert str(back.zero) == "(-0+1j)" and back.nan != back.nan
    assert back.dtype is np.float32
    entries = set(map(repr, _aux(model)[1:]))
    assert {
        "ExactFloat((-0+1j))",
        "ExactFloat(nan)",
        "SameDtype(<class 'numpy.float32'>)",
    } <= entries
    # Another zero's sign, or another set, is another treedef.
    signed = Held(tags, complex(0.0, 1), float("nan"), np.float32, jnp.ones(2))
    assert jax.tree_util.tree_structure(signed) != treedef
    other = Held(
        frozenset({1}), complex(-0.0, 1), float("nan"), np.float32, jnp.ones(2)
    )
    assert jax.tree_util.tree_structure(other) != treedef


class Kept(asx.AutoModule):
    value: object
    w: jax.Array


def test_the_types_of_dropped_static_values_are_let_go_past_the_bounds(
    monkeypatch: pytest.MonkeyPatch,
):
    # Every table keyed by type is bounded (a leaf category per type, plans and
    # signatures per class): a model per new class of static value, dropped, leaves
    # nothing of those classes alive once the bounds are passed. (The first four
    # types met stay: the class's generated code was made for them.) The bounds are made
    # small here: each new class costs a look at every ABC's subclasses, which in a
    # process holding the suite's classes is slow.
    for module, name in [(_leaves, "_MOST_TYPES"), (_static, "_MOST_TYPES")]:
        monkeypatch.setattr(module, name, 100)
    monkeypatch.setattr(_plan, "_MOST_PLANS", 50)
    w = jnp.ones(2)
    refs = []
    for i in range(150):
        kind = type(f"Kind{i}", (), {})
        if i < 8:
            refs.append(weakref.ref(kind))
        jax.tree_util.tree_flatten(Kept(kind(), w))
    del kind
    gc.collect()
    assert [r() is None for r in refs] == [False] * 4 + [True] * 4


def test_static_leaves_compare_in_c_unless_eq_is_python():
    assert hold(len) is len and hold(3) == 3

    class Weird:
        def __eq__(self, other):
            raise ValueError("no")

        __hash__ = object.__hash__

    weird = hold(Weird())
    assert type(weird) is Compared  # so a failing comparison says what to do
    assert type(hold({1, 2})) is not set  # a frozen copy of a set


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
    assert _aux(left)[1:] == _aux(right)[1:]
    assert type(_aux(left)[2]) is StaticSeq
    for entry in _aux(left)[1:]:
        assert "Left" not in repr(entry) and "sizes" not in repr(entry)


class HoldsStatic(asx.AutoModule):
    w: jax.Array
    config: tuple
    sizes: list


def test_static_values_are_made_anew_at_each_unflatten():
    # A list is made anew for every unflatten, so changing one model's list changes
    # no other's; a layer without arrays is a node of its own, made by its unflatten.
    model = HoldsStatic(jnp.ones(2), (eqx.nn.Dropout(0.1), (2, 3)), [[1, 2], [3]])
    leaves, treedef = jax.tree_util.tree_flatten(model)
    a, b = (jax.tree_util.tree_unflatten(treedef, leaves) for _ in range(2))
    assert type(a.config[0]) is eqx.nn.Dropout and a.config[0].p == 0.1
    assert a.config == (eqx.nn.Dropout(0.1), (2, 3))
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


def test_unflattened_modules_see_changes_in_place():
    # A module a jitted function returned is flattened from what it holds now, as
    # every module is: a change in place below it is seen by jax.jit.
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


def test_an_unflattened_mixed_list_or_tuple_holds_what_the_twin_s_does():
    # Layers and static leaves put back into a fresh copy of the child's items, or
    # the child kept where a tree_map with `is_leaf` changed it.
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


def test_a_change_in_place_to_any_list_of_an_unflattened_model_is_seen():
    # In every unflattened model the values are the natural ones, and a change in
    # place to each list is seen by flatten and jax.jit as by a model built afresh
    # from the same values.
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
            assert all("xs" in vars(i) for i in fresh.inners)
            change(fresh)
            afresh = Lists(*(getattr(fresh, f.name) for f in dataclasses.fields(Lists)))
            assert jax.tree_util.tree_structure(fresh) == jax.tree_util.tree_structure(
                afresh
            )
            assert float(total(fresh)) == float(total(afresh))


class StaticCounter(asx.AutoModule):
    lin: eqx.nn.Linear
    step: int = 0


def test_a_bumped_static_counter_s_structure_error_names_the_field_and_the_fix():
    # optax's state is made once from the model; a counter that is static makes each
    # step's model another pytree, and the error is JAX's, printing our aux data.
    import optax

    model = StaticCounter(eqx.nn.Linear(2, 2, key=jax.random.key(0)))
    opt = optax.adam(1e-3)
    state = opt.init(eqx.filter(model, eqx.is_array))
    model = asx.tree_at(lambda m: m.step, model, 1)
    grads = jax.tree.map(jnp.zeros_like, eqx.filter(model, eqx.is_array))
    with pytest.raises(ValueError, match="different pytree metadata") as info:
        opt.update(grads, state, model)
    message = str(info.value)
    assert "StaticCounter.step: a Python number, static" in message
    assert 'annotate it as an array (`Int[ArrayLike, ""]`' in message
    assert "], 1)" in message and "], 0)" in message  # both values


class LoopState(asx.AutoModule):
    x: jax.Array
    save_index: int


def test_a_static_counter_in_while_loop_state_names_the_field_and_the_fix():
    def body(s):
        return LoopState(s.x + 1, s.save_index + 1)

    with pytest.raises(TypeError, match="carry") as info:
        jax.lax.while_loop(lambda s: s.x[0] < 3, body, LoopState(jnp.zeros(2), 0))
    message = str(info.value)
    assert "LoopState.save_index: a Python number, static" in message
    assert "Int[ArrayLike" in message


class CountedInADict(asx.AutoModule):
    state: dict


def test_a_static_counter_in_a_container_names_its_key_path_and_the_fix():
    def body(m, _):
        return CountedInADict(
            {"x": m.state["x"] + 1, "step": m.state["step"] + 1}
        ), None

    model = CountedInADict({"x": jnp.zeros(2), "step": 0})
    with pytest.raises(TypeError, match="carry") as info:
        jax.lax.scan(body, model, length=2)
    message = str(info.value)
    assert "Holes(['step']=0; a Python number, static" in message
    assert "Holes(['step']=1; a Python number, static" in message
    assert "annotate the field `PyTree`" in message


@contextlib.contextmanager
def _general_flatten_refused(cls):
    """While open, what the generated flattens of `cls` would hand to the general
    flatten raises instead: an instance flattened then took generated code."""
    last = fields_of(cls).generated[-1]
    general = last["general"]

    def refuse(obj):
        raise AssertionError(f"{type(obj).__name__} took the general flatten")

    last["general"] = refuse
    try:
        yield
    finally:
        last["general"] = general


def _identity(x):
    return x


def test_instances_of_other_field_types_take_code_generated_for_them():
    # A class whose instances hold activations of five types (a `custom_jvp`, a
    # function, a jitted function, a string, an int): each of the first four met
    # gets code generated for it, flattening as the general flatten does; the
    # fifth takes the general flatten.
    class Dense(asx.AutoModule):
        w: jax.Array
        activation: object

    kinds = [jax.nn.relu, _identity, jax.jit(jnp.tanh), "gelu", 2]
    models = [Dense(jnp.ones(2), kind) for kind in kinds]
    for model in models:
        jax.tree_util.tree_flatten(model)
    spec = fields_of(Dense)
    with _general_flatten_refused(Dense):
        for model in models[:4]:
            (leaves, treedef), (children, aux) = (
                jax.tree_util.tree_flatten(model),
                spec.general_flatten(model),
            )
            assert treedef.node_data()[1] == aux and aux[0] is treedef.node_data()[1][0]
            assert len(leaves) == len(children) == 1 and leaves[0] is children[0]
        with pytest.raises(AssertionError, match="Dense took the general flatten"):
            jax.tree_util.tree_flatten(models[4])


def test_a_flatten_in_init_leaves_the_generated_code_to_finished_instances():
    # A flatten inside `__init__` sees a field unset; code generated for that would
    # fit no finished instance, and every one would take the general flatten.
    class Built(asx.AutoModule):
        w: jax.Array
        n: int

        def __init__(self):
            self.w = jnp.ones(2)
            jax.tree_util.tree_flatten(self)
            self.n = 3

    model = Built()
    jax.tree_util.tree_flatten(model)
    with _general_flatten_refused(Built):
        treedef = jax.tree_util.tree_structure(model)
    assert treedef.node_data()[1][1:] == (3,)
    assert len(fields_of(Built).generated) == 1  # none for the unset field
