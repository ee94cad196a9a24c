"""Where loaded arrays go: uncommitted on the default device, as Equinox's reader puts
them, unless the template leaf carries a placement (a sharding, or an array committed
to its devices); and a port of Equinox's BERT example that reads its checkpoint and
trains under `eqx.filter_pmap`, as the stock notebook does."""

import functools
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P, SingleDeviceSharding

import autostatic as asx
import autostatic.checkpoint._checkpoint as checkpoint
import autostatic.routing._serialisation as serialisation
from autostatic import load, load_eqx, save

from .helpers import assert_same_arrays, AutoMLP, needs_devices

KEY = jax.random.key(0)


def _arrays(tree: Any) -> list[jax.Array]:
    return [x for x in jtu.tree_leaves(tree) if isinstance(x, jax.Array)]


def _assert_uncommitted(tree: Any, device: jax.Device | None = None) -> None:
    """Every array of `tree` is where `jnp.asarray` of a numpy array puts it."""
    arrays = _arrays(tree)
    assert arrays
    for x in arrays:
        assert not x.committed
        assert x.devices() == {device or jax.devices()[0]}


# ------------------------------------------------- Equinox's BERT example, small


def _block_init(self, hidden: int, num_heads: int, key: jax.Array) -> None:
    self.attention = eqx.nn.MultiheadAttention(num_heads, hidden, key=key)
    self.layernorm = eqx.nn.LayerNorm(hidden)
    self.dropout = eqx.nn.Dropout(0.1)
    self.num_heads = num_heads


def _block_call(
    self, x: jax.Array, enable_dropout: bool, key: jax.Array | None
) -> jax.Array:
    y = self.attention(x, x, x, inference=not enable_dropout)
    y = self.dropout(y, inference=not enable_dropout, key=key)
    return jax.vmap(self.layernorm)(x + y)


class EqxAttentionBlock(eqx.Module):
    """As in the notebook: `num_heads` marked static, so Equinox does not write it."""

    attention: eqx.nn.MultiheadAttention
    layernorm: eqx.nn.LayerNorm
    dropout: eqx.nn.Dropout
    num_heads: int = eqx.field(static=True)

    __init__ = _block_init
    __call__ = _block_call


class AutoAttentionBlock(asx.AutoModule):
    """The port: the base swapped, the static marker dropped."""

    attention: eqx.nn.MultiheadAttention
    layernorm: eqx.nn.LayerNorm
    dropout: eqx.nn.Dropout
    num_heads: int

    __init__ = _block_init
    __call__ = _block_call


def _classifier_init(self, block: type, key: jax.Array) -> None:
    embed_key, block_key, head_key = jax.random.split(key, 3)
    self.embedder = eqx.nn.Embedding(100, 16, key=embed_key)
    self.block = block(16, 2, block_key)
    self.head = eqx.nn.Linear(16, 2, key=head_key)
    self.dropout = eqx.nn.Dropout(0.1)


def _classifier_call(
    self, inputs: dict[str, jax.Array], enable_dropout: bool = True, key: Any = None
) -> jax.Array:
    block_key, dropout_key = (None, None) if key is None else jax.random.split(key)
    x = jax.vmap(self.embedder)(inputs["token_ids"])
    x = self.block(x, enable_dropout, block_key)
    pooled = jnp.tanh(x[0])
    pooled = self.dropout(pooled, inference=not enable_dropout, key=dropout_key)
    return self.head(pooled)


class EqxClassifier(eqx.Module):
    embedder: eqx.nn.Embedding
    block: EqxAttentionBlock
    head: eqx.nn.Linear
    dropout: eqx.nn.Dropout

    def __init__(self, key: jax.Array):
        _classifier_init(self, EqxAttentionBlock, key)

    __call__ = _classifier_call


class AutoClassifier(asx.AutoModule):
    embedder: eqx.nn.Embedding
    block: AutoAttentionBlock
    head: eqx.nn.Linear
    dropout: eqx.nn.Dropout

    def __init__(self, key: jax.Array):
        _classifier_init(self, AutoAttentionBlock, key)

    __call__ = _classifier_call


@eqx.filter_value_and_grad
def _compute_loss(classifier: Any, inputs: dict, key: jax.Array) -> jax.Array:
    batched_keys = jax.random.split(key, num=inputs["token_ids"].shape[0])
    logits = jax.vmap(classifier, in_axes=(0, None, 0))(inputs, True, batched_keys)
    return jnp.mean(
        optax.softmax_cross_entropy_with_integer_labels(
            logits=logits, labels=inputs["label"]
        )
    )


def _make_step(
    model: Any, inputs: dict, opt_state: Any, key: jax.Array, tx: Any
) -> tuple:
    key, new_key = jax.random.split(key)
    loss, grads = _compute_loss(model, inputs, key)
    grads = jax.lax.pmean(grads, axis_name="devices")
    updates, opt_state = tx.update(grads, opt_state, model)
    model = eqx.apply_updates(model, updates)
    return loss, model, opt_state, new_key


def _replicate(tree: Any, n: int) -> Any:
    # As the notebook's `jax.device_put_replicated`, which JAX no longer has.
    stack = lambda x: jnp.broadcast_to(x, (n, *x.shape)) if eqx.is_array(x) else x
    return jax.tree.map(stack, tree)


def _train(classifier_chkpt: Any) -> tuple[Any, Any]:
    """The notebook's training cell: one step on every device."""
    num_devices = jax.device_count()
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(learning_rate=1e-3))
    # The notebook's `tx.init(classifier_chkpt)` gives `Dropout.p` a moment, which
    # optax 0.2.8's adam refuses beside its `None` gradient, stock or not.
    opt_state = tx.init(eqx.filter(classifier_chkpt, eqx.is_array))
    p_make_step = eqx.filter_pmap(
        functools.partial(_make_step, tx=tx), axis_name="devices"
    )
    opt_state = _replicate(opt_state, num_devices)
    model = _replicate(classifier_chkpt, num_devices)
    train_key = _replicate(jax.random.PRNGKey(5678), num_devices)
    rng = np.random.default_rng(0)
    inputs = {
        "token_ids": jnp.asarray(rng.integers(0, 100, (num_devices, 2, 12))),
        "label": jnp.asarray(rng.integers(0, 2, (num_devices, 2))),
    }
    loss, model, opt_state, train_key = p_make_step(model, inputs, opt_state, train_key)
    return loss, model


@pytest.fixture
def fallbacks(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """The calls of the routed `eqx.tree_deserialise_leaves` to its fallback,
    `load_eqx` as Equinox places arrays."""
    calls: list[tuple] = []
    fallback = serialisation.load_eqx_unplaced

    def spy(*args: Any) -> Any:
        calls.append(args)
        return fallback(*args)

    monkeypatch.setattr(serialisation, "load_eqx_unplaced", spy)
    return calls


@needs_devices(8)
def test_the_ported_bert_example_reads_its_checkpoint_and_trains_under_pmap(
    tmp_path, fallbacks
):
    path = tmp_path / "bert_checkpoint.eqx"
    eqx.tree_serialise_leaves(path, EqxClassifier(jax.random.key(1)))
    stock = eqx.tree_deserialise_leaves(path, EqxClassifier(jax.random.key(2)))
    assert not fallbacks
    # The stock file lacks `num_heads`, so Equinox's own reader cannot fill the
    # port's template and the routed function falls back to `load_eqx`.
    port = eqx.tree_deserialise_leaves(path, AutoClassifier(jax.random.key(2)))
    assert len(fallbacks) == 1
    assert_same_arrays(port, stock)

    stock_loss, stock_model = _train(stock)
    # Arrays committed to device 0 stop here: "Sharding passed to jit does not
    # match the sharding on the respective arg".
    port_loss, port_model = _train(port)
    assert stock_loss.shape == (jax.device_count(),)
    np.testing.assert_array_equal(port_loss, stock_loss)
    assert_same_arrays(port_model, stock_model)
    assert isinstance(port_model, AutoClassifier) and port_model.block.num_heads == 2
    _assert_uncommitted(stock)
    _assert_uncommitted(port)


def test_the_routed_reader_places_like_equinox_on_either_path(tmp_path, fallbacks):
    stock_path, port_path = tmp_path / "stock.eqx", tmp_path / "port.eqx"
    eqx.tree_serialise_leaves(stock_path, EqxClassifier(KEY))
    eqx.tree_serialise_leaves(port_path, AutoClassifier(KEY))
    # Equinox's reader ignores where the template's arrays are: so does the
    # fallback, so that where the arrays go does not depend on which path read them.
    committed = jax.device_put(AutoClassifier(KEY), jax.devices()[-1])
    abstract = eqx.filter_eval_shape(AutoClassifier, KEY)
    for like in (AutoClassifier(KEY), abstract, committed):
        _assert_uncommitted(eqx.tree_deserialise_leaves(port_path, like))
        assert not fallbacks
        _assert_uncommitted(eqx.tree_deserialise_leaves(stock_path, like))
        assert len(fallbacks) == 1
        fallbacks.clear()


# ------------------------------------------------------- load and load_eqx


def _save_both(tmp_path: Any, model: Any) -> dict[str, Callable[..., Any]]:
    """`model` saved by `save` and by `eqx.tree_serialise_leaves`, and a reader of
    each: `load` and `load_eqx`."""
    save(tmp_path / "m.safetensors", model)
    eqx.tree_serialise_leaves(tmp_path / "m.eqx", model)
    return {
        "load": functools.partial(load, tmp_path / "m.safetensors"),
        "load_eqx": functools.partial(load_eqx, tmp_path / "m.eqx"),
    }


@pytest.mark.parametrize("reader", ["load", "load_eqx"])
@pytest.mark.parametrize("abstract", [True, False])
def test_a_template_without_placement_loads_uncommitted(reader, abstract, tmp_path):
    model = AutoMLP(2, 8, KEY)
    read = _save_both(tmp_path, model)[reader]
    like = eqx.filter_eval_shape(AutoMLP, 2, 8, KEY) if abstract else model
    if abstract:  # eval_shape sets no sharding
        assert all(x.sharding is None for x in jtu.tree_leaves(like))
    out = read(like)
    _assert_uncommitted(out)
    assert_same_arrays(out, model)
    with jax.default_device(jax.devices()[-1]):  # as jnp.asarray honours it
        _assert_uncommitted(read(like), jax.devices()[-1])
    host = read(like, host=True)
    assert all(type(x) is np.ndarray for x in jtu.tree_leaves(host) if eqx.is_array(x))
    assert_same_arrays(host, model)


def test_uncommitted_arrays_adopt_the_buffers_read(tmp_path, monkeypatch):
    model = {"small": jnp.arange(5.0), "large": jnp.zeros((1024, 1024))}
    save(tmp_path / "m.safetensors", model)
    read: list[np.ndarray] = []
    read_array = checkpoint.read_array

    def recording(*args: Any) -> np.ndarray:
        read.append(read_array(*args))
        return read[-1]

    monkeypatch.setattr(checkpoint, "read_array", recording)
    out = load(tmp_path / "m.safetensors", model)
    _assert_uncommitted(out)
    pointers = {x.unsafe_buffer_pointer() for x in out.values()}
    assert pointers == {array.ctypes.data for array in read}  # no second copy


@needs_devices(8)
@pytest.mark.parametrize("reader", ["load", "load_eqx"])
@pytest.mark.parametrize("abstract", [True, False])
def test_a_template_with_a_sharding_loads_with_it(reader, abstract, tmp_path):
    model = AutoMLP(2, 8, KEY)
    read = _save_both(tmp_path, model)[reader]
    mesh = Mesh(np.array(jax.devices()), ("x",))

    def sharding(leaf: Any) -> NamedSharding:
        return NamedSharding(mesh, P("x", None) if leaf.ndim == 2 else P("x"))

    def place(leaf: Any) -> Any:
        if abstract:
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding(leaf))
        return jax.device_put(leaf, sharding(leaf))

    like = jax.tree.map(place, model)
    out = read(like)
    pairs = zip(_arrays(out), jtu.tree_leaves(like), strict=True)
    for got, want in pairs:
        assert got.committed and got.sharding == want.sharding
        assert len(got.addressable_shards) == 8
    assert_same_arrays(out, model)
    host = read(like, host=True)
    assert all(type(x) is np.ndarray for x in jtu.tree_leaves(host) if eqx.is_array(x))
    assert_same_arrays(host, model)


@needs_devices(2)
@pytest.mark.parametrize("reader", ["load", "load_eqx"])
def test_a_template_committed_to_a_device_loads_onto_it(reader, tmp_path):
    model = AutoMLP(2, 8, KEY)
    read = _save_both(tmp_path, model)[reader]
    device = jax.devices()[1]
    on_device = lambda x: jax.ShapeDtypeStruct(
        x.shape, x.dtype, sharding=SingleDeviceSharding(device)
    )
    for like in (jax.device_put(model, device), jax.tree.map(on_device, model)):
        out = read(like)
        assert all(x.committed and x.devices() == {device} for x in _arrays(out))
    # An array JAX placed (`device_put` without a device) carries no placement.
    _assert_uncommitted(read(jax.device_put(model)))
