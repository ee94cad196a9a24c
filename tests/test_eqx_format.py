"""Reading Equinox's files (`eqx.tree_serialise_leaves`) with `load_eqx`, side by side
with the `eqx.Module` twins that wrote them."""

import io
import random
import re
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest
from jaxtyping import ArrayLike, Int

import autostatic as asx
from autostatic import CheckpointError, load_eqx

from .helpers import assert_same_arrays, AutoMLP, EqxMLP, fuzz_loads

KEY = jax.random.key(0)


def _net_init(self, key, depth=2, rate=0.5, flag=True):
    k1, k2 = jax.random.split(key)
    self.norm = eqx.nn.BatchNorm(3, "batch", mode="batch")
    self.dropout = eqx.nn.Dropout(rate)
    self.linear = eqx.nn.Linear(3, 3, key=k1)
    self.depth = depth
    self.rate = rate
    self.flag = flag
    self.act = jax.nn.relu
    self.name = "net"
    self.sizes = [3, depth, 2.5]
    self.extra = jax.random.normal(k2, (2,), jnp.bfloat16)


class EqxNet(eqx.Module):
    """Nothing marked static: Equinox saves `depth`, `rate`, `flag`, `sizes` too."""

    norm: eqx.nn.BatchNorm
    dropout: eqx.nn.Dropout
    linear: eqx.nn.Linear
    depth: int
    rate: float
    flag: bool
    act: Callable
    name: str
    sizes: list
    extra: jax.Array

    __init__ = _net_init


class AutoNet(asx.AutoModule):
    norm: eqx.nn.BatchNorm
    dropout: eqx.nn.Dropout
    linear: eqx.nn.Linear
    depth: int
    rate: float
    flag: bool
    act: Callable
    name: str
    sizes: list
    extra: jax.Array

    __init__ = _net_init


class AutoNetWithOneMore(asx.AutoModule):
    norm: eqx.nn.BatchNorm
    dropout: eqx.nn.Dropout
    more: jax.Array  # not in the saved model
    linear: eqx.nn.Linear
    depth: int
    rate: float
    flag: bool
    act: Callable
    name: str
    sizes: list
    extra: jax.Array

    def __init__(self, key, **kwargs):
        _net_init(self, key, **kwargs)
        self.more = jnp.zeros(3)


def _eqx_checkpoint(tmp_path, **kwargs):
    model, state = eqx.nn.make_with_state(EqxNet)(jax.random.key(3), **kwargs)
    eqx.tree_serialise_leaves(tmp_path / "model.eqx", model)
    eqx.tree_serialise_leaves(tmp_path / "state.eqx", state)
    return model, state


@pytest.mark.parametrize("abstract", [True, False])
def test_load_eqx_reads_equinox_files_into_an_automodule(abstract, tmp_path):
    eqx_model, eqx_state = _eqx_checkpoint(tmp_path, depth=4, rate=0.25, flag=False)
    make = eqx.nn.make_with_state(AutoNet)
    args = (KEY,), dict(depth=4, rate=0.25, flag=False)
    if abstract:
        like, like_state = eqx.filter_eval_shape(make, *args[0], **args[1])
    else:
        like, like_state = make(*args[0], **args[1])
    model = load_eqx(tmp_path / "model", like)  # Equinox's suffix rule: model.eqx
    state = load_eqx(tmp_path / "state.eqx", like_state)
    assert isinstance(model, AutoNet) and model.depth == 4 and model.dropout.p == 0.25
    assert model.extra.dtype == jnp.bfloat16
    assert_same_arrays(model, eqx_model)
    assert_same_arrays(state, eqx_state)

    # Same outputs as the Equinox model.
    def run(m, s):
        y, _ = m.norm(jnp.arange(3.0), s)
        return m.linear(y)

    ours = run(asx.inference_mode(model), state)
    assert jnp.allclose(ours, run(eqx.nn.inference_mode(eqx_model), eqx_state))

    host = load_eqx(tmp_path / "model.eqx", like, host=True)
    assert all(type(x) is np.ndarray for x in jtu.tree_leaves(host))


def test_eqx_tree_deserialise_leaves_reads_an_equinox_file_as_load_eqx_does(tmp_path):
    # Equinox's own loader sees the AutoModule template as the eqx.Module twin, so
    # the Python ints, floats and bools Equinox saved land where they belong.
    _eqx_checkpoint(tmp_path)
    like, _ = eqx.filter_eval_shape(eqx.nn.make_with_state(AutoNet), KEY)
    loaded = eqx.tree_deserialise_leaves(tmp_path / "model.eqx", like)
    assert_same_arrays(loaded, load_eqx(tmp_path / "model.eqx", like))
    assert loaded.sizes == [3, 2, 2.5] and loaded.depth == 2 and loaded.flag is True


@pytest.mark.parametrize(
    "kwargs, key, stored, template",
    [
        (dict(rate=0.3), ".dropout.p", "0.5", "0.3"),
        (dict(depth=3), ".depth", "2", "3"),
        (dict(flag=False), ".flag", "True", "False"),
    ],
)
def test_load_eqx_names_a_static_value_that_differs(
    kwargs, key, stored, template, tmp_path
):
    _eqx_checkpoint(tmp_path)
    like, _ = eqx.filter_eval_shape(eqx.nn.make_with_state(AutoNet), KEY, **kwargs)
    with pytest.raises(CheckpointError) as info:
        load_eqx(tmp_path / "model.eqx", like)
    message = str(info.value)
    assert f"leaf {key} " in message
    assert (
        f"stores {stored} where the template has the static value {template}" in message
    )


def _counter_class(base):
    class Counter(base):
        w: jax.Array
        steps: Int[ArrayLike, ""]  # a leaf: loop state, not a hyperparameter
        lr: float | jax.Array

        def __init__(self, steps=0, lr=0.1):
            self.w = jnp.ones(2)
            self.steps = steps
            self.lr = lr

    return Counter


def test_load_eqx_loads_the_stored_value_of_a_python_scalar_leaf():
    # A field annotated to hold arrays keeps a Python number a leaf: its stored value
    # is loaded, as Equinox loads it, not compared with the template's.
    buffer = io.BytesIO()
    eqx.tree_serialise_leaves(buffer, _counter_class(eqx.Module)(steps=5, lr=0.01))
    template = _counter_class(asx.AutoModule)()
    buffer.seek(0)
    loaded = load_eqx(buffer, template)
    buffer.seek(0)
    ref = eqx.tree_deserialise_leaves(buffer, _counter_class(eqx.Module)())
    assert (loaded.steps, loaded.lr) == (ref.steps, ref.lr) == (5, 0.01)
    assert type(loaded.steps) is int and type(loaded.lr) is float


def test_load_eqx_names_a_static_value_stored_as_another_kind():
    class Flag(eqx.Module):
        w: jax.Array
        s: object

    class AutoFlag(asx.AutoModule):
        w: jax.Array
        s: object

    buffer = io.BytesIO()
    eqx.tree_serialise_leaves(buffer, Flag(jnp.ones(2), 1))
    buffer.seek(0)
    with pytest.raises(
        CheckpointError,
        match=r"leaf \.s .*stores 1 where the template has the static value True",
    ):
        load_eqx(buffer, AutoFlag(jnp.ones(2), True))


def test_load_eqx_never_shifts_on_an_extra_array(tmp_path):
    _eqx_checkpoint(tmp_path)
    like, _ = eqx.filter_eval_shape(eqx.nn.make_with_state(AutoNetWithOneMore), KEY)
    with pytest.raises(
        CheckpointError, match=r"leaf \.more .*where the template has float32\[3\]"
    ):
        load_eqx(tmp_path / "model.eqx", like)


def test_load_eqx_checks_shapes_and_the_end_of_the_file(tmp_path):
    model = EqxMLP(2, 3, KEY)
    f = io.BytesIO()
    eqx.tree_serialise_leaves(f, model)
    data = f.getvalue()
    with pytest.raises(
        CheckpointError,
        match=r"leaf \.layers\[0\]\.weight .*"
        r"float32\[3,3\] where the template has float32\[4,4\]",
    ):
        load_eqx(io.BytesIO(data), EqxMLP(2, 4, KEY))
    with pytest.raises(CheckpointError, match="bytes are left"):
        load_eqx(io.BytesIO(data), EqxMLP(1, 3, KEY))
    with pytest.raises(CheckpointError, match="file ends here"):
        load_eqx(io.BytesIO(data), EqxMLP(3, 3, KEY))
    with pytest.raises(CheckpointError, match="truncated"):
        load_eqx(io.BytesIO(data[:-4]), EqxMLP(2, 3, KEY))
    assert_same_arrays(load_eqx(io.BytesIO(data), EqxMLP(2, 3, KEY)), model)


def test_load_eqx_says_when_only_a_dtype_differs():
    class Curve(asx.AutoModule):
        coef: np.ndarray

    f = io.BytesIO()
    eqx.tree_serialise_leaves(f, Curve(np.linspace(0.0, 1.0, 4)))  # float64
    template = eqx.filter_eval_shape(Curve, np.linspace(0.0, 1.0, 4))
    with pytest.raises(CheckpointError, match="Only the dtype differs"):
        load_eqx(io.BytesIO(f.getvalue()), template)


def test_load_eqx_reads_byte_swapped_and_fortran_ordered_numpy_arrays():
    tree = {
        "big": np.arange(3, dtype=">f4"),
        "fortran": np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3)),
    }
    f = io.BytesIO()
    eqx.tree_serialise_leaves(f, tree)
    f.seek(0)
    out = load_eqx(
        f, {"big": np.zeros(3, np.float32), "fortran": np.zeros((2, 3), np.int32)}
    )
    assert out["big"].dtype == np.float32 and out["big"].tolist() == [0.0, 1.0, 2.0]
    assert out["fortran"].tolist() == [[0, 1, 2], [3, 4, 5]]


def test_load_eqx_skips_fields_the_automodule_also_declares_static(tmp_path):
    class E(eqx.Module):
        n: int = eqx.field(static=True)
        w: jax.Array = None

    class A(asx.AutoModule):
        n: int = eqx.field(static=True)
        w: jax.Array = None

    path = tmp_path / "e.eqx"
    eqx.tree_serialise_leaves(path, E(3, jnp.arange(3.0)))
    loaded = load_eqx(path, A(3, jnp.zeros(3)))
    assert loaded.n == 3 and loaded.w.tolist() == [0.0, 1.0, 2.0]


# ------------------------------------------------- fields Equinox marked static


class EqxAttention(eqx.Module):
    """The attention block of Equinox's BERT example, plus an unmarked float."""

    attention: eqx.nn.MultiheadAttention
    layernorm: eqx.nn.LayerNorm
    dropout: eqx.nn.Dropout
    scale: float
    num_heads: int = eqx.field(static=True)

    def __init__(self, hidden: int, num_heads: int, key: jax.Array):
        self.attention = eqx.nn.MultiheadAttention(num_heads, hidden, key=key)
        self.layernorm = eqx.nn.LayerNorm(hidden)
        self.dropout = eqx.nn.Dropout(0.1)
        self.scale = 0.5
        self.num_heads = num_heads

    def __call__(self, x: jax.Array) -> jax.Array:
        y = self.attention(x, x, x, inference=True)
        return jax.vmap(self.layernorm)(x + self.scale * y)


class AutoAttention(asx.AutoModule):
    """The port: the same fields, the `eqx.field(static=True)` marker deleted."""

    attention: eqx.nn.MultiheadAttention
    layernorm: eqx.nn.LayerNorm
    dropout: eqx.nn.Dropout
    scale: float
    num_heads: int

    __init__ = EqxAttention.__init__
    __call__ = EqxAttention.__call__


class EqxEncoder(eqx.Module):
    blocks: list
    depth: int = eqx.field(static=True)

    def __init__(self, depth: int, key: jax.Array, block: type = EqxAttention):
        self.blocks = [block(128, 2, k) for k in jax.random.split(key, depth)]
        self.depth = depth


class AutoEncoder(asx.AutoModule):
    blocks: list
    depth: int

    __init__ = EqxEncoder.__init__


@pytest.mark.parametrize("abstract", [True, False])
def test_load_eqx_aligns_past_fields_equinox_marked_static(abstract, tmp_path):
    original = EqxEncoder(2, jax.random.key(4))
    eqx.tree_serialise_leaves(tmp_path / "bert.eqx", original)
    make = lambda: AutoEncoder(2, KEY, AutoAttention)
    like = eqx.filter_eval_shape(make) if abstract else make()
    # Before the alignment: "the file has a float32[128,128] array where the template
    # has the int 2" (`num_heads`, which Equinox did not write).
    ported = load_eqx(tmp_path / "bert.eqx", like)
    assert isinstance(ported, AutoEncoder) and ported.blocks[1].num_heads == 2
    arrays = lambda tree: [x for x in jtu.tree_leaves(tree) if eqx.is_array(x)]
    assert eqx.tree_equal(arrays(ported), arrays(original))
    assert_same_arrays(ported, original)
    x = jax.random.normal(KEY, (5, 128))
    for ours, theirs in zip(ported.blocks, original.blocks, strict=True):
        assert jnp.array_equal(ours(x), theirs(x))


def test_load_eqx_reads_equinox_files_of_the_eqx_mlp_into_the_automlp():
    # EqxMLP marks `width`, `sizes` and `scale` static, so Equinox wrote only arrays;
    # every Python value of AutoMLP's full leaf order is absent from the file.
    original = EqxMLP(2, 3, KEY)
    f = io.BytesIO()
    eqx.tree_serialise_leaves(f, original)
    f.seek(0)
    ported = load_eqx(f, eqx.filter_eval_shape(AutoMLP, 2, 3, jax.random.key(9)))
    assert_same_arrays(ported, original)


def test_load_eqx_reads_files_equinox_wrote_from_an_automodule():
    model = AutoMLP(2, 3, KEY, scale=2.0)
    f = io.BytesIO()
    eqx.tree_serialise_leaves(f, model)  # flattens like JAX: arrays only
    f.seek(0)
    loaded = load_eqx(f, AutoMLP(2, 3, jax.random.key(5), scale=2.0))
    assert eqx.tree_equal(loaded, model)


class EqxCounter(eqx.Module):
    heads: int = eqx.field(static=True)
    step: np.ndarray
    layers: int


class AutoCounter(asx.AutoModule):
    heads: int
    step: np.ndarray
    layers: int


def test_a_file_that_fits_in_two_ways_is_refused():
    # The file holds [step, layers] = [2, 3], both int64 (Equinox writes a Python int
    # with numpy). With heads == 2 it also reads as [heads, step] = [2, 3] with
    # `layers` absent: `step` would be 2 or 3.
    f = io.BytesIO()
    eqx.tree_serialise_leaves(f, EqxCounter(2, np.array(2), 3))
    template = AutoCounter(2, np.array(0), 3)
    with pytest.raises(CheckpointError) as info:
        load_eqx(io.BytesIO(f.getvalue()), template)
    assert "more than one way" in str(info.value)
    assert "(ambiguous: .heads, .step, .layers)" in str(info.value)
    # With another step value only one reading fits, and it loads.
    f = io.BytesIO()
    eqx.tree_serialise_leaves(f, EqxCounter(2, np.array(7), 3))
    assert load_eqx(io.BytesIO(f.getvalue()), template).step == 7


def test_equal_static_values_that_share_a_stored_value_load():
    class E(eqx.Module):
        a: int = eqx.field(static=True)
        b: int
        w: jax.Array

    class A(asx.AutoModule):
        a: int
        b: int
        w: jax.Array

    f = io.BytesIO()
    eqx.tree_serialise_leaves(f, E(2, 2, jnp.arange(3.0)))
    # The stored 2 is `a` or `b`: both readings load the same array, so it loads.
    loaded = load_eqx(io.BytesIO(f.getvalue()), A(2, 2, jnp.zeros(3)))
    assert loaded.w.tolist() == [0.0, 1.0, 2.0]


# --------------------------------------------------------------------------- bad files


def test_the_file_is_never_unpickled():
    # A .npy blob holding a pickle is refused rather than executed.
    f = io.BytesIO()
    np.save(f, np.array([{"x": 1}], dtype=object), allow_pickle=True)
    f.seek(0)
    with pytest.raises(CheckpointError, match="pickle"):
        load_eqx(f, {"x": jax.ShapeDtypeStruct((1,), jnp.float32)})


def _npy(header: str, data: bytes = b"") -> io.BytesIO:
    text = header.encode().ljust(118) + b"\n"
    return io.BytesIO(
        b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text + data
    )


@pytest.mark.parametrize(
    "header",
    [
        "{'descr': '<f4', 'fortran_order': False, 'shape': (3,(, }",  # TokenError
        "{'descr': '<f4', 'fortran_order': False, 'shape': (-3,), }",
        "{'descr': '<f4', 'fortran_order': 0, 'shape': (3,), }",
        "{'descr': 'xyz', 'fortran_order': False, 'shape': (3,), }",
        "{'descr': '<f4', 'fortran_order': False, 'shape': " + "(" * 50 + "}",
        "[" * 100,
    ],
)
def test_malformed_npy_headers_are_checkpoint_errors(header):
    with pytest.raises(CheckpointError, match=r"blob #0 \(byte 0\)"):
        load_eqx(_npy(header, b"\0" * 12), {"x": np.zeros(3, np.float32)})


def test_bool_arrays_with_bytes_other_than_0_and_1_are_refused():
    f = io.BytesIO()
    eqx.tree_serialise_leaves(f, {"mask": np.array([True, False, True])})
    data = bytearray(f.getvalue())
    data[-2] = 2
    with pytest.raises(CheckpointError, match=r"\['mask'\].*bool.*other than 0 and 1"):
        load_eqx(io.BytesIO(bytes(data)), {"mask": np.zeros(3, bool)})


def test_text_mode_files_are_refused_with_a_clear_error(tmp_path):
    eqx.tree_serialise_leaves(tmp_path / "m.eqx", {"w": np.ones(2, np.float32)})
    with open(tmp_path / "m.eqx") as text, pytest.raises(TypeError, match="'rb'"):
        load_eqx(text, {"w": np.zeros(2, np.float32)})


def _mutate(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    headers = [m.start() for m in re.finditer(rb"\{'", data)]  # each .npy header
    kind = rng.randrange(4)
    if kind == 0:  # bit flips anywhere
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(out))
            out[i] ^= 1 << rng.randrange(8)
    elif kind == 1:  # truncation
        del out[rng.randrange(len(out)) :]
    else:  # an edit inside one of the .npy headers
        i = rng.choice(headers) + rng.randrange(60)
        if kind == 2:
            out[i] = ord(rng.choice("0123456789(),:'-<>|{} bfiuV"))
        else:
            del out[i]
    return bytes(out)


def test_mutated_equinox_files_fail_cleanly():
    """Bit flips, truncations and header edits of a file Equinox wrote: a
    CheckpointError or a load of the template's shapes and dtypes, never another
    exception, a hang or a large allocation."""
    model, _ = eqx.nn.make_with_state(EqxNet)(jax.random.key(3))
    f = io.BytesIO()
    extra = {"mask": np.array([True, False]), "big": np.ones((64, 64), np.float32)}
    eqx.tree_serialise_leaves(f, {"net": model, **extra})
    data = f.getvalue()
    template = {
        "net": eqx.filter_eval_shape(eqx.nn.make_with_state(AutoNet), KEY)[0],
        **jax.tree.map(np.zeros_like, extra),
    }
    outcomes = fuzz_loads(
        lambda raw: load_eqx(io.BytesIO(raw), template, host=True),
        data,
        template,
        _mutate,
        300,
    )
    assert outcomes["refused"] > 50 and outcomes["loaded"] > 10, outcomes


@pytest.mark.parametrize("abstract", [True, False])
def test_eqx_tree_deserialise_leaves_reads_files_with_and_without_static_fields(
    abstract, tmp_path
):
    # Porting stays the base swap alone: the original's own loading line reads the
    # file it wrote, although it marked `num_heads` static and never wrote it.
    original = EqxEncoder(2, jax.random.key(4))
    eqx.tree_serialise_leaves(tmp_path / "bert.eqx", original)
    make = lambda: AutoEncoder(2, KEY, AutoAttention)
    like = eqx.filter_eval_shape(make) if abstract else make()
    ported = eqx.tree_deserialise_leaves(tmp_path / "bert.eqx", like)
    assert_same_arrays(ported, original)
    assert ported.blocks[1].num_heads == 2
    from_bytes = io.BytesIO((tmp_path / "bert.eqx").read_bytes())
    assert_same_arrays(eqx.tree_deserialise_leaves(from_bytes, like), original)
    # And the file the port writes (every field) reads back the same way.
    eqx.tree_serialise_leaves(tmp_path / "port.eqx", ported)
    again = eqx.tree_deserialise_leaves(tmp_path / "port.eqx", like)
    assert_same_arrays(again, original)
    # A template that fits neither way is refused, naming where.
    other = eqx.filter_eval_shape(lambda: AutoEncoder(2, KEY, _narrower))
    with pytest.raises(CheckpointError, match=r"\.blocks\[0\]\.attention"):
        eqx.tree_deserialise_leaves(tmp_path / "bert.eqx", other)


def _narrower(hidden: int, num_heads: int, key: jax.Array) -> AutoAttention:
    return AutoAttention(64, num_heads, key)
