"""An AutoModule's containers are the built-ins assigned: they print, compare and
flatten as the `eqx.Module` twin's do, and a change made to one in place (however it
is made) is seen by eager code and by `jax.jit` alike."""

import heapq
from collections import defaultdict, OrderedDict
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import autostatic as asx


def make_model(base):
    class Model(base):
        layers: list
        table: dict
        tags: set
        empty: set
        ordered: OrderedDict
        counts: defaultdict
        pair: tuple

    return Model


def fields():
    weights = jnp.arange(3.0)
    return dict(
        layers=[1, weights, {"w": weights + 1, "act": jax.nn.relu, "ids": {3, 1}}],
        table={"b": [1, 2], "a": "x", "long": list(range(30))},
        tags={"x", "y"},
        empty=set(),
        ordered=OrderedDict([("z", 1), ("a", [jnp.ones(2)]), ("m", OrderedDict())]),
        counts=defaultdict(int, {"k": 1, "j": defaultdict(list)}),
        pair=([1], {"q": {2}}),
    )


@pytest.fixture(scope="module", params=["built", "unflattened"])
def twins(request):
    """The same values in an AutoModule and in an eqx.Module; the AutoModule as
    built, or as a tree_map gives it back (its attributes made from the aux)."""
    values = fields()
    auto = make_model(asx.AutoModule)(**values)
    plain = make_model(eqx.Module)(**values)
    if request.param == "unflattened":  # dict keys come back sorted, as in Equinox
        auto = jax.tree_util.tree_map(lambda x: x, auto)
        plain = jax.tree_util.tree_map(lambda x: x, plain)
    assert type(auto.layers) is list and type(auto.counts) is defaultdict
    assert type(auto.layers[2]["ids"]) is set and type(auto.ordered) is OrderedDict
    return auto, plain


def test_attribute_treedefs_are_the_values_own(twins):
    auto, plain = twins
    for name in fields():
        assert jax.tree_util.tree_structure(getattr(auto, name)) == (
            jax.tree_util.tree_structure(getattr(plain, name))
        ), name


def test_model_attributes_print_as_builtins(twins):
    auto, plain = twins
    for name in fields():
        assert repr(getattr(auto, name)) == repr(getattr(plain, name)), name
    assert repr(auto.ordered).startswith("OrderedDict(")
    assert repr(auto.counts).startswith("defaultdict(<class 'int'>")


@pytest.mark.parametrize("options", [{}, {"short_arrays": False}, {"width": 40}])
def test_tree_pformat_is_the_eqx_module_twins(twins, options):
    auto, plain = twins
    text = eqx.tree_pformat(auto, **options)
    assert text == eqx.tree_pformat(plain, **options)


def test_ipython_pretty_is_the_builtins(twins):
    pretty = pytest.importorskip("IPython.lib.pretty")
    auto, plain = twins
    for name in fields():
        assert pretty.pretty(getattr(auto, name), max_width=30) == pretty.pretty(
            getattr(plain, name), max_width=30
        ), name


def test_treescope_renders_the_eqx_module_twin(twins):
    treescope = pytest.importorskip("treescope")
    auto, plain = twins
    for options in ({}, {"roundtrip_mode": True}):
        text = treescope.render_to_text(auto, **options)
        assert text == treescope.render_to_text(plain, **options)
    for name in fields():
        value = getattr(auto, name)
        assert treescope.render_to_text(value) == treescope.render_to_text(
            getattr(plain, name)
        ), name


class Knobs(asx.AutoModule):
    """Every kind of container an in-place change can reach."""

    w: jax.Array
    queue: list
    weights: list
    table: dict
    tags: set
    counts: defaultdict
    scale: float

    def __init__(self):
        self.w = jnp.ones(2)
        self.queue = [3.0, 5.0]
        self.weights = [jnp.ones(2)]
        self.table = {"bias": 1.0}
        self.tags = {"a"}
        self.counts = defaultdict(list, {"k": [1.0]})
        self.scale = 0.1

    def __call__(self):
        total = self.w * self.scale * sum(self.queue) + sum(self.table.values())
        total = total + sum(self.weights) + len(self.tags)
        return total + sum(sum(v) for v in self.counts.values())


def _factory_of_twos():
    return [2.0]


@pytest.mark.parametrize(
    "change",
    [
        lambda m: m.queue.append(9.0),
        lambda m: heapq.heappush(m.queue, 0.5),
        lambda m: list.append(m.queue, 9.0),
        lambda m: m.queue.__setitem__(0, 7.0),
        lambda m: m.weights.append(jnp.full(2, 4.0)),
        lambda m: m.weights.append(jax.nn.relu),  # a non-array into an array list
        lambda m: dict.__setitem__(m.table, "bias", 3.0),
        lambda m: m.table.update(extra=jnp.ones(1)),
        lambda m: set.add(m.tags, "b"),
        lambda m: m.counts["new"].append(4.0),
        lambda m: setattr(m.counts, "default_factory", _factory_of_twos),
        lambda m: object.__setattr__(m, "scale", 0.01),
    ],
    ids=[
        "append",
        "heappush",
        "list.append",
        "setitem",
        "array-append",
        "function-append",
        "dict.__setitem__",
        "dict.update",
        "set.add",
        "defaultdict-entry",
        "default_factory",
        "object.__setattr__",
    ],
)
@pytest.mark.parametrize("made", ["built", "unflattened"])
def test_an_in_place_change_is_seen_by_eager_and_jit_alike(change, made):
    # An unflattened model records its containers when first read, not when built.
    model = Knobs() if made == "built" else jax.tree.map(lambda x: x, Knobs())
    f = jax.jit(lambda m: m() if callable(m.weights[-1]) is False else m.w)
    run = jax.jit(lambda m: m())
    before = run(model)
    change(model)
    # The change is noticed: the treedef is the one the new values give.
    assert jax.tree_util.tree_structure(model) != jax.tree_util.tree_structure(Knobs())
    if callable(model.weights[-1]):  # not summable: the structure changed all the same
        leaves = jax.tree_util.tree_leaves(model)
        assert all(eqx.is_array(x) for x in leaves)
        assert f(model).shape == (2,)
        return
    np.testing.assert_allclose(run(model), model())
    np.testing.assert_allclose(run(Knobs()), before)  # a fresh model is unaffected
    if "default_factory" not in change.__code__.co_consts:  # changes no value
        assert not np.allclose(run(model), before)


class Holds(asx.AutoModule):
    items: Any


def _replace(container, key, value):
    if type(container) is set:
        container.clear()
        container.add(value)
    else:
        container[key] = value


# A container, an item's key in it, and a replacement that `==` calls equal to the
# item: 0.0 == -0.0, 1.0 == 1, a one-element array == a number, [1] == [1.0]. (Not a
# list of only ints and bools, whose items are taken as exact under `==`: design.md.)
EQUAL_BUT_OTHER = {
    "array->number": ([jnp.ones(1), "s"], 0, 1.0),
    "array->0-d array": ([jnp.ones(1)], 0, jnp.ones(())),
    "array->int array": ([jnp.ones(1), "s"], 0, jnp.ones(1, jnp.int32)),
    "float->int": ([1.0, 2.0], 0, 1),
    "float->array": ([1.0, 2.5], 0, jnp.ones(1)),
    "0.0->-0.0": ([0.0], 0, -0.0),
    "mixed int->float": ([1, jnp.ones(1)], 0, 1.0),
    "dict array->int": ({"a": jnp.ones(1)}, "a", 1),
    "set 1.0->1": ({1.0}, None, 1),
    "nested [1]->[1.0]": ([[1], "s"], 0, [1.0]),
}


@pytest.mark.parametrize("case", EQUAL_BUT_OTHER)
@pytest.mark.parametrize("made", ["built", "unflattened"])
def test_an_item_replaced_by_an_equal_one_of_another_kind_is_a_change(case, made):
    # `==` says "unchanged" for these: the check compares such items by identity.
    items, key, value = EQUAL_BUT_OTHER[case]
    model = Holds(items)
    if made == "unflattened":
        model = jax.tree.map(lambda x: x, model)

    def first(m):
        got = next(iter(m.items)) if type(m.items) is set else m.items[key]
        return jnp.asarray(got[0] if type(got) is list else got)

    jax.jit(first)(model)  # traced with the old item
    _replace(model.items, key, value)
    eager, jitted = first(model), jax.jit(first)(model)
    assert (jitted.dtype, jitted.shape) == (eager.dtype, eager.shape)
    np.testing.assert_array_equal(jitted, eager)
    np.testing.assert_array_equal(jnp.signbit(jitted), jnp.signbit(eager))


def test_a_field_written_before_the_first_read_is_kept():
    # An unflattened model fills its fields in on first read; one written before
    # that by `object.__setattr__` keeps the written value, in eager code and jit.
    model = jax.tree.map(lambda x: x, Knobs())
    object.__setattr__(model, "scale", 0.01)
    assert model.w.shape == (2,)  # the first read
    assert model.scale == 0.01
    np.testing.assert_allclose(jax.jit(lambda m: m())(model), model())
    np.testing.assert_allclose(model(), Knobs()() - (0.1 - 0.01) * 8.0, rtol=1e-6)


def test_a_changed_container_is_decided_once_then_read_back():
    model = Knobs()
    jax.jit(lambda m: m())(model)
    model.queue.append(1.0)
    first = jax.tree_util.tree_structure(model)
    assert jax.tree_util.tree_structure(model) == first
    assert first != jax.tree_util.tree_structure(Knobs())
    # The partition follows the values: a model built with them is the same tree.
    again = Knobs()
    again.queue.append(1.0)
    assert jax.tree_util.tree_structure(again) == first


def test_namedtuple_field_is_a_node_not_watched():
    # optax's GradientTransformation is a NamedTuple of functions, held by
    # optimistix's OptaxMinimiser.
    import optax

    class Holder(asx.AutoModule):
        optim: Any
        w: jax.Array

    m = Holder(optax.adam(1e-3), jnp.ones(2))
    assert jax.tree_util.tree_leaves(m) == [m.w]
    assert type(m.optim) is type(optax.adam(1e-3))
    assert jax.jit(lambda m: m.w * 2)(m).tolist() == [2.0, 2.0]


class _Nothing(NamedTuple):
    pass


@pytest.mark.parametrize("empty", [_Nothing(), jax.tree_util.Partial(len)])
def test_a_node_without_leaves_is_a_child_as_in_eqx_module(empty):
    # optax puts a `MaskedNode()` (a NamedTuple without fields) where a masked
    # parameter was: the tree must keep that node where the eqx.Module's has it.
    def build(base):
        class Dense(base):
            w: Any
            b: jax.Array

        return Dense(empty, jnp.ones(2))

    ours, twin = build(asx.AutoModule), build(eqx.Module)

    def structure(tree):
        return jax.tree_util.tree_structure(tree)

    assert structure(ours).num_nodes == structure(twin).num_nodes
    assert structure(ours.w) == structure(twin.w)
    assert jax.tree_util.tree_leaves(ours) == [ours.b]


def test_optax_masks_update_as_for_eqx_module():
    # optax.masked maps each masked array to `MaskedNode()`, a node without leaves:
    # in a field, in a layer, and in a dict beside a static value.
    import optax

    def run(base):
        class Dense(base):
            w: jax.Array
            b: jax.Array

        class Net(base):
            dense: Any
            linear: eqx.nn.Linear
            block: dict

        model = Net(
            Dense(jnp.ones((2, 2)), jnp.zeros(2)),
            eqx.nn.Linear(2, 2, key=jax.random.key(0)),
            {"w": jnp.full((2, 2), 2.0), "b": jnp.ones(2), "act": "relu"},
        )
        # The twin's string is a leaf optax cannot update: its arrays alone.
        params = model if base is asx.AutoModule else eqx.filter(model, eqx.is_array)
        decay = optax.adamw(
            1e-2, mask=lambda p: jax.tree_util.tree_map(lambda a: a.ndim > 1, p)
        )
        labels = jax.tree_util.tree_map(
            lambda a: "sgd" if a.ndim > 1 else "adam", params
        )
        split = optax.multi_transform(
            {"sgd": optax.sgd(0.1), "adam": optax.adam(0.1)}, labels
        )
        out = []
        for tx in (decay, split):
            state = tx.init(params)
            step = jax.jit(
                lambda m, s, tx=tx: eqx.apply_updates(m, tx.update(m, s, m)[0])
            )
            out.append(jax.tree_util.tree_leaves(step(params, state)))
        return out

    for ours, twin in zip(run(asx.AutoModule), run(eqx.Module)):
        assert len(ours) == len(twin) == 6
        for a, b in zip(ours, twin):
            np.testing.assert_array_equal(a, b)


def make_holder(base):
    class Holder(base):
        linear: eqx.nn.Linear
        mlp: eqx.nn.MLP
        layers: list

    return Holder


def holder(base):
    key = jax.random.key(0)
    return make_holder(base)(
        eqx.nn.Linear(2, 2, key=key),
        eqx.nn.MLP(2, 2, 4, 1, key=key),
        [eqx.nn.Linear(2, 2, key=key)],
    )


def _round_trip(model):
    leaves, treedef = jax.tree_util.tree_flatten(model)
    return jax.tree_util.tree_unflatten(treedef, leaves)


@pytest.mark.parametrize("made", ["constructed", "unflattened"])
@pytest.mark.parametrize(
    "change",
    [
        lambda m: m.layers.append(eqx.nn.Linear(2, 2, key=jax.random.key(1))),
        lambda m: m.layers.insert(0, jnp.ones(3)),
        lambda m: m.layers.pop(),
    ],
    ids=["append-layer", "insert-array", "pop"],
)
def test_a_list_of_layers_changed_in_place_is_seen_as_in_the_eqx_module(made, change):
    # Whether the model was constructed or is the result of a tree operation (what
    # `jax.jit` returns, what an optimiser update gives), the list its attribute
    # returns is the one watched, as an eqx.Module's flatten reads its list.
    ours, theirs = holder(asx.AutoModule), holder(eqx.Module)
    if made == "unflattened":
        ours, theirs = _round_trip(ours), _round_trip(theirs)
    change(ours)
    change(theirs)

    def total(m):
        return sum(jnp.sum(x) for x in jax.tree_util.tree_leaves(m) if eqx.is_array(x))

    assert float(total(ours)) == float(total(theirs))
    assert float(jax.jit(total)(ours)) == float(total(theirs))
    ours_paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(ours)[0]]
    theirs_paths = [
        p for p, x in jax.tree_util.tree_flatten_with_path(theirs)[0] if eqx.is_array(x)
    ]
    assert ours_paths == theirs_paths
