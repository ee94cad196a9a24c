"""The fast carriers of `eqx.nn` layers in an AutoModule's pytree: what must not change
compared with the same model written as an `eqx.Module`. The attributes hold the
layers themselves; carriers appear only in the pytree (to `is_leaf` callbacks)."""

import copy
import dataclasses
import inspect
import pickle
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import autostatic as asx

from .helpers import array_keystrs, keystrs, TraceCounter

KEY = jax.random.key(0)


def halve(x):  # a plain function: picklable, unlike jnp.tanh
    return x / 2


class Block(asx.AutoModule):
    attention: eqx.nn.MultiheadAttention
    norm: eqx.nn.LayerNorm
    mlp: eqx.nn.MLP
    stack: list  # mixed: layers, a function, a Dropout
    sizes: list

    def __init__(self, key):
        k1, k2, k3, k4 = jax.random.split(key, 4)
        self.attention = eqx.nn.MultiheadAttention(2, 8, key=k1)
        self.norm = eqx.nn.LayerNorm(8)
        self.mlp = eqx.nn.MLP(8, 8, 16, 1, key=k2)
        self.stack = [
            eqx.nn.Linear(8, 8, key=k3),
            jax.nn.relu,
            eqx.nn.Sequential([eqx.nn.Linear(8, 8, key=k4), eqx.nn.Lambda(halve)]),
            eqx.nn.Dropout(0.1),
        ]
        self.sizes = [8, 8]

    def __call__(self, x, key=None):
        x = self.norm(x + self.attention(x[None], x[None], x[None])[0])
        x = jax.vmap(self.mlp)(x[None])[0]
        for layer in self.stack[:3]:
            x = layer(x)
        return self.stack[3](x, key=key, inference=key is None)


class EqxBlock(eqx.Module):
    attention: eqx.nn.MultiheadAttention
    norm: eqx.nn.LayerNorm
    mlp: eqx.nn.MLP
    stack: list
    sizes: list = eqx.field(static=True)

    __init__ = Block.__init__
    __call__ = Block.__call__


def _layers(model):
    return [model.attention, model.norm, model.mlp, model.stack[0], model.stack[2]]


def _pytree_layers(model):
    is_layer = lambda x: isinstance(x, eqx.Module) and not isinstance(x, asx.AutoModule)
    return [
        x for x in jax.tree_util.tree_leaves(model, is_leaf=is_layer) if is_layer(x)
    ]


def test_attributes_are_the_layers_and_the_pytree_holds_their_carriers():
    model = Block(KEY)
    classes = [
        eqx.nn.MultiheadAttention,
        eqx.nn.LayerNorm,
        eqx.nn.MLP,
        eqx.nn.Linear,
        eqx.nn.Sequential,
    ]
    for layer, cls in zip(_layers(model), classes):
        assert type(layer) is cls
        standalone = jax.tree_util.tree_structure(eqx.combine(layer))
        assert jax.tree_util.tree_structure(layer) == standalone
    assert type(model.stack[0]) is eqx.nn.Linear  # nested layers too
    assert type(model.attention.query_proj) is eqx.nn.Linear
    # In the pytree (what an is_leaf callback sees), each is a carrier: an instance of
    # its layer class, with the layer's name and repr.
    carriers = _pytree_layers(model)
    assert [type(t).__name__ for t in carriers] == [
        "MultiheadAttention",
        "LayerNorm",
        "MLP",
        "Linear",
        "Sequential",
        "Dropout",
    ]
    for carrier, cls in zip(carriers, classes):
        assert isinstance(carrier, cls) and type(carrier) is not cls
    assert repr(carriers[3]).startswith("Linear(")
    # It reads, calls, indexes and compares as its layer.
    linear, sequential = carriers[3], carriers[4]
    x = jnp.ones(linear.in_features)
    np.testing.assert_array_equal(linear(x), model.stack[0](x))
    assert linear.weight is model.stack[0].weight
    assert vars(linear) == vars(model.stack[0])
    assert [f.name for f in dataclasses.fields(linear)] == [
        f.name for f in dataclasses.fields(eqx.nn.Linear)
    ]
    assert len(sequential) == len(model.stack[2]) and type(sequential[0]) is type(
        model.stack[2][0]
    )
    assert inspect.signature(linear) == inspect.signature(model.stack[0])
    assert inspect.signature(type(linear)) == inspect.signature(eqx.nn.Linear)
    xs = jnp.ones((3, linear.in_features))
    assert eqx.filter_vmap(linear, in_axes=dict(x=0))(xs).shape == (3, 8)
    with pytest.raises(dataclasses.FrozenInstanceError, match="'weight'"):
        linear.weight = None
    with pytest.raises(dataclasses.FrozenInstanceError, match="'bias'"):
        del linear.bias
    with pytest.raises(dataclasses.FrozenInstanceError, match="'weight'"):
        object.__setattr__(linear, "weight", None)
    assert linear.weight is model.stack[0].weight  # untouched
    # A field on the class reads as on the layer class: its default, or none.
    mlp = carriers[2]
    assert type(mlp).scan is eqx.nn.MLP.scan
    with pytest.raises(AttributeError):
        type(linear).weight  # the read is the test
    # `==` is symmetric, as eqx.Module's: an equal carrier, not the layer (another
    # node type, as the layer's own `==` says).
    again = _pytree_layers(jax.tree_util.tree_map(lambda x: x, model))[3]
    assert again is not linear and bool(again == linear) and linear != carriers[2]
    assert linear != model.stack[0] and model.stack[0] != linear
    assert eqx.tree_pformat(model) == eqx.tree_pformat(EqxBlock(KEY)).replace(
        "EqxBlock", "Block"
    )
    rebuilt = jax.tree_util.tree_map(lambda x: x + 1, model)
    for layer, cls in zip(_layers(rebuilt), classes):
        assert type(layer) is cls
    assert type(rebuilt.stack[2].layers[0]) is eqx.nn.Linear


def test_key_paths_leaves_and_results_match_the_eqx_module():
    model, ref = Block(KEY), EqxBlock(KEY)
    # Equinox's non-array leaves (Dropout.p, the MLP's activations) are static here.
    assert keystrs(model) == array_keystrs(ref)
    ref_arrays = [x for x in jax.tree_util.tree_leaves(ref) if eqx.is_array(x)]
    for a, b in zip(jax.tree_util.tree_leaves(model), ref_arrays, strict=True):
        np.testing.assert_array_equal(a, b)
    x = jax.random.normal(jax.random.key(1), (8,))
    np.testing.assert_allclose(
        jax.jit(lambda m, x: m(x))(model, x),
        eqx.filter_jit(lambda m, x: m(x))(ref, x),
        rtol=1e-6,
    )
    grads = jax.grad(lambda m: jnp.sum(m(x)))(model)
    ref_grads = eqx.filter_grad(lambda m: jnp.sum(m(x)))(ref)
    for a, b in zip(
        jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(ref_grads)
    ):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_tree_map_replacing_held_layers_reads_as_in_the_eqx_module():
    # `stack` mixes layers with a function: its read puts layers back at the item
    # positions that held carriers, unless a tree_map put something else there.
    def is_linear(x):
        return isinstance(x, eqx.nn.Linear)

    def swap(x):
        return "linear" if is_linear(x) else x

    ours, theirs = (
        jax.tree_util.tree_map(swap, m, is_leaf=is_linear)
        for m in (Block(KEY), EqxBlock(KEY))
    )
    assert [type(x) for x in ours.stack] == [type(x) for x in theirs.stack]
    assert ours.stack[0] == theirs.stack[0] == "linear"
    assert ours.stack[1] is theirs.stack[1] is jax.nn.relu
    assert ours.stack[2].layers[0] == theirs.stack[2].layers[0] == "linear"
    assert jax.tree_util.tree_structure(ours.stack[3]) == jax.tree_util.tree_structure(
        theirs.stack[3]
    )


class _Scaled(asx.AutoModule):
    linear: eqx.nn.Linear
    stack: list
    scale: jax.Array


class _EqxScaled(eqx.Module):
    linear: eqx.nn.Linear
    stack: list
    scale: jax.Array


def test_a_tree_map_keeping_layers_and_replacing_arrays_reads_as_in_the_eqx_module():
    # The arrays beside the layers become 0s (a template) while the layers an is_leaf
    # callback stops at come back as they were: the attributes are the layers.
    is_layer = lambda x: isinstance(x, eqx.nn.Linear)
    keep_layers = lambda x: x if is_layer(x) else 0
    linears = [eqx.nn.Linear(2, 2, key=k) for k in jax.random.split(KEY, 2)]
    ours, theirs = (
        cls(linears[0], [linears[1], jnp.ones(2)], jnp.ones(()))
        for cls in (_Scaled, _EqxScaled)
    )
    ours_map, theirs_map = (
        jax.tree_util.tree_map(keep_layers, m, is_leaf=is_layer) for m in (ours, theirs)
    )
    for model in (ours_map, theirs_map):
        assert model.linear is linears[0] and model.stack[0] is linears[1]
        assert model.stack[1] == 0 and model.scale == 0
    assert jax.tree_util.tree_structure(ours_map) == jax.tree_util.tree_structure(ours)
    again = jax.tree_util.tree_map(keep_layers, ours_map, is_leaf=is_layer)
    assert again.linear is linears[0] and again.stack[0] is linears[1]


def test_separately_built_models_share_one_trace():
    counter = TraceCounter(lambda m, x: m(x))
    f = jax.jit(counter)
    x = jnp.ones(8)
    f(Block(KEY), x)
    f(Block(jax.random.key(2)), x)
    f(jax.tree_util.tree_map(lambda a: a * 2, Block(KEY)), x)
    assert counter.count == 1


def test_eqx_tree_at_on_sub_layers_and_their_arrays():
    model = Block(KEY)
    new = eqx.nn.Linear(8, 8, key=jax.random.key(3))
    swapped = eqx.tree_at(lambda m: m.stack[0], model, new)
    assert jnp.array_equal(swapped.stack[0].weight, new.weight)
    assert jax.tree_util.tree_structure(swapped) == jax.tree_util.tree_structure(model)
    inner = eqx.tree_at(lambda m: m.stack[2].layers[0].bias, model, jnp.zeros(8))
    assert jnp.array_equal(inner.stack[2].layers[0].bias, jnp.zeros(8))
    nested = eqx.tree_at(
        lambda m: m.attention.query_proj, model, replace_fn=lambda layer: layer
    )
    assert jax.tree_util.tree_structure(nested) == jax.tree_util.tree_structure(model)
    p = eqx.tree_at(lambda m: m.stack[3].p, model, 0.5)
    assert p.stack[3].p == 0.5 and keystrs(p) == keystrs(model)


def test_stateful_layers_with_make_with_state():
    class Normed(asx.AutoModule):
        linear: eqx.nn.Linear
        norm: eqx.nn.BatchNorm

        def __init__(self, key):
            self.linear = eqx.nn.Linear(3, 3, key=key)
            self.norm = eqx.nn.BatchNorm(3, "batch", mode="batch")

    model, state = eqx.nn.make_with_state(Normed)(KEY)
    assert isinstance(model.norm, eqx.nn.BatchNorm)
    run = jax.jit(
        jax.vmap(
            lambda m, x, s: m.norm(m.linear(x), s),
            in_axes=(None, 0, None),
            out_axes=(0, None),
            axis_name="batch",
        )
    )
    out, state = run(model, jnp.ones((4, 3)), state)
    assert out.shape == (4, 3)
    inf = eqx.nn.inference_mode(model)
    assert inf.norm.inference and isinstance(inf.norm, eqx.nn.BatchNorm)


class Stack(asx.AutoModule):
    layers: list


@pytest.mark.parametrize(
    "roundtrip",
    [copy.copy, copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))],
    ids=["copy", "deepcopy", "pickle"],
)
def test_copy_and_pickle_keep_carriers(roundtrip):
    # jax.nn.relu and jnp.tanh cannot be pickled or deep-copied to themselves.
    k1, k2 = jax.random.split(KEY)
    model = Stack(
        [
            eqx.nn.Linear(4, 4, key=k1),
            halve,
            eqx.nn.Sequential([eqx.nn.Linear(4, 4, key=k2), eqx.nn.Lambda(halve)]),
            eqx.nn.Dropout(0.1),
            eqx.nn.LayerNorm(4),
        ]
    )
    other = roundtrip(model)
    assert jax.tree_util.tree_structure(other) == jax.tree_util.tree_structure(model)
    assert type(other.layers[0]) is type(model.layers[0])
    carrier = _pytree_layers(model)[0]
    layer = roundtrip(carrier)  # a carrier on its own: as the layer it stands for
    assert type(layer) is eqx.nn.Linear
    assert jnp.array_equal(layer.weight, model.layers[0].weight)


def test_a_carrier_called_as_a_class_builds_a_working_layer():
    carrier_cls = type(_pytree_layers(Block(KEY))[3])
    assert carrier_cls is not eqx.nn.Linear
    layer = carrier_cls(3, 2, key=KEY)
    assert keystrs(layer) == [".weight", ".bias"]
    assert jax.jit(lambda lin, x: lin(x))(layer, jnp.ones(3)).shape == (2,)
    # Put in place of held layers by a tree_map, it reads back as a layer: alone in
    # an attention's field, and as an item of a list.
    key = jax.random.key(5)
    model = jax.tree.map(
        lambda x: carrier_cls(8, 8, key=key) if isinstance(x, eqx.nn.Linear) else x,
        Block(KEY),
        is_leaf=lambda x: isinstance(x, eqx.nn.Linear),
    )
    expected = eqx.nn.Linear(8, 8, key=key).weight
    for layer in (model.attention.query_proj, model.stack[0]):
        assert type(layer) is eqx.nn.Linear
        np.testing.assert_array_equal(layer.weight, expected)


class _Collects(asx.AutoModule):
    layers: list
    norms: dict
    lone: Any


class _EqxCollects(eqx.Module):
    layers: list
    norms: dict
    lone: Any


def test_a_model_built_from_layers_an_is_leaf_callback_saw_holds_the_layers():
    # `jax.tree.leaves(model, is_leaf=...)` gives carriers; a model built from them
    # holds the layers they stand for, with the treedef of one built from the layers,
    # as an eqx.Module built from what its own is_leaf callback saw.
    is_layer = lambda x: isinstance(x, (eqx.nn.Linear, eqx.nn.LayerNorm))
    for cls in (_Collects, _EqxCollects):
        keys = jax.random.split(KEY, 4)
        made = [eqx.nn.Linear(2, 2, key=k) for k in keys[:3]]
        model = cls(made[:2], {"a": eqx.nn.LayerNorm(2)}, made[2])
        seen = [x for x in jax.tree_util.tree_leaves(model, is_leaf=is_layer)]
        again = cls(seen[:2], {"a": seen[2]}, seen[3])
        assert [type(x) for x in (*again.layers, again.norms["a"], again.lone)] == [
            eqx.nn.Linear,
            eqx.nn.Linear,
            eqx.nn.LayerNorm,
            eqx.nn.Linear,
        ]
        assert jax.tree_util.tree_structure(again) == jax.tree_util.tree_structure(
            model
        )
        diff = jax.tree_util.tree_map(lambda a, b: a - b, model, again)
        assert float(diff.lone.weight.sum()) == 0.0


def test_layers_outside_an_automodule_stay_equinox_s():
    linear = eqx.nn.Linear(2, 2, key=KEY)
    model = Block(KEY)
    assert type(linear) is eqx.nn.Linear  # building a model does not touch its inputs
    assert type(model.stack[0]) is eqx.nn.Linear
    # A held layer and a standalone one are trees of one structure.
    standalone = eqx.nn.Linear(8, 8, key=jax.random.key(9))
    summed = jax.tree_util.tree_map(lambda a, b: a + b, model.stack[0], standalone)
    assert type(summed) is eqx.nn.Linear
    picked = jax.lax.cond(True, lambda: model.stack[0], lambda: standalone)
    assert jnp.array_equal(picked.weight, model.stack[0].weight)
    assert eqx.tree_equal(model, Block(KEY))


# eqx.nn.Shared (tied weights): its `__call__` puts the tied nodes back with `tree_at`
# into its `pytree`, whose placeholders are static values inside an AutoModule.
def _tied_embedding(self):
    embedding = eqx.nn.Embedding(10, 4, key=jax.random.key(0))
    linear = eqx.nn.Linear(4, 10, key=jax.random.key(1))
    self.shared = eqx.nn.Shared(
        (embedding, linear), lambda p: p[1].weight, lambda p: p[0].weight
    )


def _tied_embedding_call(self, token):
    embedding, linear = self.shared()
    assert linear.weight is embedding.weight
    return linear(embedding(token))


def _tied_layer(self):  # a whole layer tied, inside a mixed list
    first = eqx.nn.Linear(4, 4, key=jax.random.key(0))
    last = eqx.nn.Linear(4, 4, key=jax.random.key(1))
    self.shared = eqx.nn.Shared(
        [first, jax.nn.relu, last], lambda p: p[2], lambda p: p[0]
    )


def _tied_layer_call(self, x):
    first, activation, last = self.shared()
    return last(activation(first(x)))


@pytest.mark.parametrize(
    "init, call, x",
    [
        (_tied_embedding, _tied_embedding_call, jnp.asarray(3)),
        (_tied_layer, _tied_layer_call, jnp.ones(4)),
    ],
    ids=["embedding", "layer"],
)
def test_shared_ties_nodes_as_in_eqx_module(init, call, x):
    class Tied(asx.AutoModule):
        shared: eqx.nn.Shared
        __init__ = init
        __call__ = call

    class EqxTied(eqx.Module):
        shared: eqx.nn.Shared
        __init__ = init
        __call__ = call

    ours, theirs = Tied(), EqxTied()
    assert array_keystrs(ours) == array_keystrs(theirs)  # the tied copy is not a leaf
    np.testing.assert_array_equal(ours(x), theirs(x))

    def loss(model, x):
        return jnp.sum(model(x) ** 2)

    counter = TraceCounter(jax.grad(loss))
    step = jax.jit(counter)  # plain jax.jit: the placeholders and functions are static
    grads = step(ours, x)
    expected = eqx.filter_jit(eqx.filter_grad(loss))(theirs, x)
    assert array_keystrs(grads) == array_keystrs(expected)
    for a, b in zip(
        jax.tree_util.tree_leaves(eqx.filter(grads, eqx.is_array)),
        jax.tree_util.tree_leaves(eqx.filter(expected, eqx.is_array)),
    ):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    step(jax.tree_util.tree_map(lambda a, g: a - 0.1 * g, ours, grads), x)
    assert counter.count == 1


def _tied_weight(pair):
    return pair[1].weight


def _tying_weight(pair):
    return pair[0].weight


def _tied_at_module_level(self):  # `where` and `get` made once, as two models share
    embedding = eqx.nn.Embedding(10, 4, key=jax.random.key(0))
    linear = eqx.nn.Linear(4, 10, key=jax.random.key(1))
    self.shared = eqx.nn.Shared((embedding, linear), _tied_weight, _tying_weight)


def test_shared_models_built_alike_share_a_structure_as_in_eqx_module():
    # Each `eqx.nn.Shared` puts a new `SharedNode()` (equal only to itself) where a
    # tied node was; in an `eqx.Module` it is a leaf that `eqx.filter` makes `None`,
    # so an optimiser state made from one model updates another built alike, and two
    # models' arrays can be averaged.
    import optax

    class Tied(asx.AutoModule):
        shared: eqx.nn.Shared
        __init__ = _tied_at_module_level

    class EqxTied(eqx.Module):
        shared: eqx.nn.Shared
        __init__ = _tied_at_module_level

    def soup_and_step(cls):
        a, b = cls(), cls()
        arrays = eqx.filter(a, eqx.is_array)
        mean = jax.tree_util.tree_map(
            lambda x, y: (x + y) / 2, arrays, eqx.filter(b, eqx.is_array)
        )
        optimiser = optax.adam(0.1)
        state = optimiser.init(eqx.filter(cls(), eqx.is_array))
        updates, _ = optimiser.update(mean, state, arrays)
        return eqx.apply_updates(a, updates)

    ours, theirs = soup_and_step(Tied), soup_and_step(EqxTied)
    assert jax.tree_util.tree_structure(Tied()) == jax.tree_util.tree_structure(Tied())
    assert array_keystrs(ours) == array_keystrs(theirs)
    for x, y in zip(
        jax.tree_util.tree_leaves(eqx.filter(ours, eqx.is_array)),
        jax.tree_util.tree_leaves(eqx.filter(theirs, eqx.is_array)),
    ):
        np.testing.assert_array_equal(x, y)


def test_layers_as_nodes_is_the_surgery_thread_s_alone():
    # While one thread runs `eqx.tree_at` (its flattens give the layers as nodes, so
    # that `where` finds them), another thread's flattens give the carriers.
    import threading

    from autostatic.core._carriers import layers_as_nodes

    model = Block(KEY)
    inside, done = threading.Event(), threading.Event()
    seen = {}

    def norm_node():
        found = jax.tree_util.tree_leaves(
            model, is_leaf=lambda x: isinstance(x, eqx.nn.LayerNorm)
        )
        return next(x for x in found if isinstance(x, eqx.nn.LayerNorm))

    def surgery():
        with layers_as_nodes():
            seen["surgery"] = type(norm_node())
            inside.set()
            done.wait(5)

    thread = threading.Thread(target=surgery)
    thread.start()
    assert inside.wait(5)
    seen["reader"] = type(norm_node())
    done.set()
    thread.join()
    assert seen["surgery"] is eqx.nn.LayerNorm
    assert seen["reader"] is not eqx.nn.LayerNorm
    assert type(norm_node()) is not eqx.nn.LayerNorm


class Layers(asx.AutoModule):
    layers: list


def _carrier_auxes(model):
    (child,) = jax.tree_util.tree_structure(model).children()
    return [node.node_data()[1] for node in child.children()]


def test_layers_of_equal_sizes_have_equal_aux_and_floats_stay_exact():
    key = jax.random.key(0)
    model = Layers(
        [eqx.nn.Linear(2, 3, key=key), eqx.nn.Linear(2, 3, key=key)]
        + [eqx.nn.Linear(3, 2, key=key), eqx.nn.Linear(2, 3, key=key)]
    )
    a, b, c, d = _carrier_auxes(model)
    assert a == b and a[0] is b[0] and c != a and d == a
    # A float is compared too, but never a zero or NaN by `==`: 0.0 and -0.0 stay
    # apart.
    norm, other = _carrier_auxes(Layers([eqx.nn.LayerNorm(4), eqx.nn.LayerNorm(4)]))
    assert norm == other
    zero, negative = _carrier_auxes(Layers([eqx.nn.Dropout(0.0), eqx.nn.Dropout(-0.0)]))
    assert zero != negative
    again, _ = _carrier_auxes(Layers([eqx.nn.Dropout(-0.0), eqx.nn.Dropout(-0.0)]))
    assert again == negative
    dropouts = Layers([eqx.nn.Dropout(-0.0), eqx.nn.Dropout(0.0)])
    signs = [str(layer.p) for layer in jax.tree.map(lambda x: x, dropouts).layers]
    assert signs == ["-0.0", "0.0"]


@pytest.mark.parametrize("first", [0.1, -0.0])
def test_a_layer_class_unflattens_every_layout_it_meets(first):
    # A carrier class's unflatten runs its first layout's fill inline; a layer of
    # the same class with another layout (a zero `p` is held exactly, a `0.1` as it
    # is) must still read back its own values, whichever came first.
    for order in ([first, 0.1, -0.0], [first, -0.0, 0.1]):
        model = Layers([eqx.nn.Dropout(p) for p in order])
        for _ in range(2):
            again = jax.tree.map(lambda x: x, model)
            ps = [layer.p for layer in again.layers]
            assert [type(p) for p in ps] == [float] * 3
            assert [str(p) for p in ps] == [str(p) for p in order]
