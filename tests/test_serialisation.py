"""Serialisation: key-addressed safetensors checkpoints, and reading Equinox's files."""

import io
import json
import os
import struct
import time
import tracemalloc
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import autostatic as asx
import autostatic._serialisation as ser
from autostatic._serialisation import CheckpointError, load, load_eqx, save

from .helpers import array_keystrs, AutoMLP, EqxMLP, needs_devices

KEY = jax.random.key(0)


def _leaves_with_keys(tree):
    return {
        jtu.keystr(p): leaf
        for p, leaf in jtu.tree_flatten_with_path(tree)[0]
        if eqx.is_array(leaf)
    }


def _assert_same_arrays(a, b):
    la, lb = _leaves_with_keys(a), _leaves_with_keys(b)
    assert la.keys() == lb.keys()
    for key in la:
        x, y = np.asarray(la[key]), np.asarray(lb[key])
        assert x.dtype == y.dtype and x.shape == y.shape, key
        assert x.tobytes() == y.tobytes(), key


def _header(data: bytes) -> dict:
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n])


def _safetensors_file(header: dict, data: bytes = b"", header_len: int | None = None):
    encoded = json.dumps(header).encode()
    n = len(encoded) if header_len is None else header_len
    return io.BytesIO(struct.pack("<Q", n) + encoded + data)


# ------------------------------------------------------------------- host / device


def test_eval_shape_template_loads_to_host_without_jax_arrays(tmp_path):
    model = AutoMLP(2, 4, KEY, scale=2.0)
    path = tmp_path / "model.safetensors"
    save(path, model)
    template = eqx.filter_eval_shape(AutoMLP, 2, 4, KEY, scale=2.0)
    live = len(jax.live_arrays())
    host = load(path, template, host=True)
    assert len(jax.live_arrays()) == live  # nothing was put on any device
    leaves = jtu.tree_leaves(host)
    assert leaves and all(type(x) is np.ndarray for x in leaves)
    _assert_same_arrays(host, model)
    assert host.scale == 2.0 and host.layers[1].activation is jax.nn.relu
    assert jtu.tree_structure(host) == jtu.tree_structure(model)

    device = load(path, template)
    assert all(isinstance(x, jax.Array) for x in jtu.tree_leaves(device))
    _assert_same_arrays(device, model)
    x = jnp.ones(4)
    assert jnp.array_equal(device(x), model(x))


@needs_devices(8)
def test_loads_with_the_template_sharding(tmp_path):
    mesh = Mesh(np.array(jax.devices()), ("x",))
    model = AutoMLP(2, 8, KEY)
    save(tmp_path / "m.safetensors", model)

    def shard(leaf):
        spec = P("x", None) if leaf.ndim == 2 else P("x")
        return jax.ShapeDtypeStruct(
            leaf.shape, leaf.dtype, sharding=NamedSharding(mesh, spec)
        )

    template = jax.tree.map(shard, eqx.filter_eval_shape(AutoMLP, 2, 8, KEY))
    out = load(tmp_path / "m.safetensors", template)
    pairs = zip(jtu.tree_leaves(out), jtu.tree_leaves(template), strict=True)
    for got, want in pairs:
        assert got.sharding == want.sharding
        assert len(got.addressable_shards) == 8
    _assert_same_arrays(out, model)

    # A concrete template keeps each array where it is.
    device = jax.devices()[3]
    on_3 = jax.device_put(model, device)
    out = load(tmp_path / "m.safetensors", on_3)
    assert all(x.devices() == {device} for x in jtu.tree_leaves(out))


def test_numpy_template_leaves_stay_numpy():
    tree = {"a": np.arange(3.0), "b": jnp.arange(2), "c": np.float32(2.5)}
    f = io.BytesIO()
    save(f, tree)
    f.seek(0)
    out = load(f, tree)
    assert type(out["a"]) is np.ndarray and isinstance(out["b"], jax.Array)
    assert type(out["c"]) is np.float32 and out["c"] == 2.5


# --------------------------------------------------------------------------- keys


def test_keys_are_natural_key_paths_readable_by_safetensors(tmp_path):
    safetensors = pytest.importorskip("safetensors")
    model = AutoMLP(3, 4, KEY)
    path = tmp_path / "model.safetensors"
    save(str(path), model)
    with safetensors.safe_open(str(path), framework="numpy") as f:
        keys = set(f.keys())
        tensors = {k: f.get_tensor(k) for k in keys}
    assert keys == set(array_keystrs(model)) == set(array_keystrs(EqxMLP(3, 4, KEY)))
    assert ".layers[2].weight" in keys
    for key, leaf in _leaves_with_keys(model).items():
        np.testing.assert_array_equal(tensors[key], np.asarray(leaf))


def test_duplicate_key_paths_are_an_error():
    class Twice:
        def __init__(self, a, b):
            self.a, self.b = a, b

    jtu.register_pytree_with_keys(
        Twice,
        lambda t: (((jtu.GetAttrKey("w"), t.a), (jtu.GetAttrKey("w"), t.b)), None),
        lambda _, children: Twice(*children),
    )
    with pytest.raises(ValueError, match=r"\.w"):
        save(io.BytesIO(), Twice(jnp.zeros(2), jnp.ones(2)))


def test_shape_dtype_structs_cannot_be_saved():
    with pytest.raises(CheckpointError, match=r"\['w'\].*ShapeDtypeStruct"):
        save(io.BytesIO(), {"w": jax.ShapeDtypeStruct((2,), jnp.float32)})


# --------------------------------------------------------------------------- dtypes

_NUMPY_DTYPES = [
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
]  # fmt: skip
_ML_DTYPES = [
    "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
    "float8_e8m0fnu", "float8_e4m3", "float8_e3m4", "float8_e4m3b11fnuz",
    "float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn", "int4", "uint4", "int2", "uint2",
    "complex32", "bcomplex32",
]  # fmt: skip
_ALL_DTYPES = _NUMPY_DTYPES + [n for n in _ML_DTYPES if hasattr(ml_dtypes, n)]
_SAFETENSORS_NAME = {
    "bool": "BOOL", "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64",
    "uint8": "U8", "uint16": "U16", "uint32": "U32", "uint64": "U64", "float16": "F16",
    "float32": "F32", "float64": "F64", "complex64": "C64", "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "float8_e8m0fnu": "F8_E8M0",
    "float8_e4m3fnuz": "F8_E4M3FNUZ", "float8_e5m2fnuz": "F8_E5M2FNUZ",
}  # fmt: skip


def _random(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    dtype = np.dtype(getattr(ml_dtypes, name, None) or name)
    size = int(np.prod(shape))
    if name == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if name.startswith(("int", "uint")) and name in _ML_DTYPES:
        info = ml_dtypes.iinfo(dtype)
        return rng.integers(int(info.min), int(info.max) + 1, shape).astype(dtype)
    if name.startswith(("float4", "float6")):
        return rng.standard_normal(shape).astype(dtype)
    # Every bit pattern, NaN payloads included.
    return (
        np.frombuffer(rng.bytes(size * dtype.itemsize), np.uint8)
        .view(dtype)
        .reshape(shape)
    )


def _dtype_tree(rng):
    tree = {}
    for name in _ALL_DTYPES:
        tree[name] = {
            "matrix": _random(name, (3, 5), rng),
            "scalar": _random(name, (), rng),
            "empty": _random(name, (0, 4), rng),
        }
    return tree


def test_every_dtype_round_trips_bit_exactly_on_host():
    tree = _dtype_tree(np.random.default_rng(0))
    f = io.BytesIO()
    save(f, tree)
    data = f.getvalue()
    header = _header(data)
    for name, stored in _SAFETENSORS_NAME.items():
        assert header[f"['{name}']['matrix']"]["dtype"] == stored
    raw = json.loads(header["__metadata__"]["autostatic.dtypes"])
    assert raw["['complex128']['matrix']"] == "complex128"
    assert header["['complex128']['matrix']"] == {
        **header["['complex128']['matrix']"],
        "dtype": "F64",
        "shape": [3, 5, 2],
    }
    assert raw["['int4']['matrix']"] == "int4"
    assert header["['int4']['matrix']"]["dtype"] == "U8"
    # Tensors are aligned to their item size.
    for key, entry in header.items():
        if key != "__metadata__":
            itemsize = np.dtype(ser._FROM_SAFETENSORS[entry["dtype"]]).itemsize
            assert entry["data_offsets"][0] % itemsize == 0

    template = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)
    for like in (tree, template):
        out = load(io.BytesIO(data), like, host=True)
        _assert_same_arrays(out, tree)
        assert all(type(x) is np.ndarray for x in jtu.tree_leaves(out))


def test_files_with_every_dtype_open_in_safetensors(tmp_path):
    safetensors = pytest.importorskip("safetensors")
    tree = _dtype_tree(np.random.default_rng(1))
    save(tmp_path / "all.safetensors", tree)
    header = _header((tmp_path / "all.safetensors").read_bytes())
    # safe_open refuses a whole file if one dtype name is unknown to it.
    with safetensors.safe_open(str(tmp_path / "all.safetensors"), "numpy") as f:
        assert len(f.keys()) == 3 * len(_ALL_DTYPES)
        assert "autostatic.dtypes" in f.metadata()
        # safetensors' numpy API has no ml_dtypes (BF16, F8_*); it reads the rest.
        # safe_open is not iterable, only its keys() are.
        names = f.keys()
        readable = [
            k for k in names if not header[k]["dtype"].startswith(("BF16", "F8_"))
        ]
        loaded = {k: f.get_tensor(k) for k in readable}
    for name in ("float32", "int64", "bool", "complex64", "uint16"):
        np.testing.assert_array_equal(
            loaded[f"['{name}']['matrix']"], tree[name]["matrix"]
        )
    c128 = loaded["['complex128']['matrix']"]
    assert c128.dtype == np.float64 and c128.shape == (3, 5, 2)
    assert c128.tobytes() == tree["complex128"]["matrix"].tobytes()
    int4 = loaded["['int4']['matrix']"]
    assert int4.dtype == np.uint8 and int4.tobytes() == tree["int4"]["matrix"].tobytes()


def _jax_supports(name: str) -> bool:
    try:
        jnp.asarray(
            np.zeros(2, getattr(ml_dtypes, name, None) or name)
        ).block_until_ready()
    except Exception:  # e.g. float6 has a jnp name but no XLA CPU support
        return False
    return True


def test_jax_arrays_round_trip_on_device():
    rng = np.random.default_rng(2)
    with jax.enable_x64(True):
        names = [n for n in _ALL_DTYPES if _jax_supports(n)]
        assert {"bfloat16", "float8_e4m3fn", "int4", "uint4", "complex128"} <= set(
            names
        )
        tree = {
            n: {
                "m": jnp.asarray(_random(n, (2, 3), rng)),
                "s": jnp.asarray(_random(n, (), rng)),
            }
            for n in names
        }
        f = io.BytesIO()
        save(f, tree)
        f.seek(0)
        out = load(f, eqx.filter_eval_shape(lambda: tree))
        assert all(isinstance(x, jax.Array) for x in jtu.tree_leaves(out))
        _assert_same_arrays(out, tree)


def test_64_bit_arrays_need_x64_or_host():
    tree = {"w": np.arange(3, dtype=np.float64)}
    f = io.BytesIO()
    save(f, tree)
    template = {"w": jax.ShapeDtypeStruct((3,), np.float64)}
    with pytest.raises(CheckpointError, match=r"\['w'\].*host=True"):
        load(io.BytesIO(f.getvalue()), template)
    out = load(io.BytesIO(f.getvalue()), template, host=True)
    assert out["w"].dtype == np.float64


def test_byte_swapped_numpy_arrays_are_stored_little_endian():
    tree = {"a": np.arange(4, dtype=">f4"), "b": np.arange(3, dtype=">i8")}
    f = io.BytesIO()
    save(f, tree)
    out = load(io.BytesIO(f.getvalue()), tree, host=True)
    assert out["a"].dtype == np.float32 and out["a"].tolist() == [0, 1, 2, 3]
    assert out["b"].dtype == np.int64 and out["b"].tolist() == [0, 1, 2]
    data = f.getvalue()
    begin, end = _header(data)["['b']"]["data_offsets"]
    start = 8 + struct.unpack("<Q", data[:8])[0]
    assert data[start + begin : start + end] == np.arange(3, dtype="<i8").tobytes()


def test_a_single_array_and_prng_keys():
    f = io.BytesIO()
    save(f, jnp.arange(3.0))
    assert _header(f.getvalue()).keys() == {""}
    out = load(io.BytesIO(f.getvalue()), jax.ShapeDtypeStruct((3,), jnp.float32))
    assert out.tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(CheckpointError, match="<root>"):
        load(io.BytesIO(f.getvalue()), jax.ShapeDtypeStruct((4,), jnp.float32))
    with pytest.raises(CheckpointError, match=r"\['key'\].*key_data"):
        save(io.BytesIO(), {"key": jax.random.key(0)})


# --------------------------------------------------------------------------- mismatches


def test_one_error_lists_every_mismatch_and_nothing_is_read(monkeypatch):
    f = io.BytesIO()
    save(
        f,
        {
            "a": jnp.zeros(3),
            "b": jnp.zeros((2, 2)),
            "c": jnp.zeros(2),
            "gone": jnp.ones(1),
        },
    )
    template = {
        "a": jnp.zeros(4),  # shape
        "b": jnp.zeros((2, 2), jnp.bfloat16),  # dtype
        "c": jnp.zeros(2),  # fine
        "new": jax.ShapeDtypeStruct((5,), jnp.float32),  # missing from the file
    }
    reads = []
    original = ser._Source.read_into
    monkeypatch.setattr(
        ser._Source,
        "read_into",
        lambda s, o, v, w: (reads.append(w), original(s, o, v, w)),
    )
    with pytest.raises(CheckpointError) as info:
        load(io.BytesIO(f.getvalue()), template)
    message = str(info.value)
    assert "4 problems" in message
    assert "shape differs: ['a'] (template: float32[4], file: float32[3])" in message
    assert (
        "dtype differs: ['b'] (template: bfloat16[2,2], file: float32[2,2])" in message
    )
    assert "missing from the file: ['new'] (template: float32[5])" in message
    assert "not in the template: ['gone'] (file: float32[1])" in message
    assert "['c']" not in message
    assert reads == ["the header length", "the header"]  # no tensor was read


def test_strict_false_ignores_extra_tensors_but_not_missing_ones():
    f = io.BytesIO()
    save(f, {"a": jnp.arange(3.0), "extra": jnp.ones(2)})
    out = load(io.BytesIO(f.getvalue()), {"a": jnp.zeros(3)}, strict=False)
    assert out["a"].tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(CheckpointError, match=r"not in the template: \['extra'\]"):
        load(io.BytesIO(f.getvalue()), {"a": jnp.zeros(3)})
    with pytest.raises(
        CheckpointError, match=r"missing from the file: \['b'\]"
    ) as info:
        load(
            io.BytesIO(f.getvalue()),
            {"a": jnp.zeros(3), "b": jnp.zeros(1)},
            strict=False,
        )
    assert "extra" not in str(info.value)


def test_a_static_value_where_the_file_has_an_array_is_named():
    f = io.BytesIO()
    save(f, {"a": jnp.zeros(2), "b": jnp.ones(2)})
    with pytest.raises(
        CheckpointError, match=r"\['b'\].*the template has a float there"
    ):
        load(io.BytesIO(f.getvalue()), {"a": jnp.zeros(2), "b": 1.0})


def test_checkpoints_move_between_eqx_and_auto_modules(tmp_path):
    auto, eqx_model = AutoMLP(2, 3, KEY), EqxMLP(2, 3, jax.random.key(1))
    save(tmp_path / "eqx.safetensors", eqx_model)
    out = load(tmp_path / "eqx.safetensors", eqx.filter_eval_shape(AutoMLP, 2, 3, KEY))
    assert isinstance(out, AutoMLP)
    _assert_same_arrays(out, eqx_model)
    save(tmp_path / "auto.safetensors", auto)
    back = load(tmp_path / "auto.safetensors", eqx_model)
    assert isinstance(back, EqxMLP)
    _assert_same_arrays(back, auto)


# --------------------------------------------------------------------------- bad files


def _valid_bytes() -> bytes:
    f = io.BytesIO()
    save(f, {"a": jnp.arange(4.0), "b": jnp.arange(3, dtype=jnp.int32)})
    return f.getvalue()


def _load_bytes(data: bytes):
    template = {"a": jnp.zeros(4), "b": jnp.zeros(3, jnp.int32)}
    return load(io.BytesIO(data), template)


@pytest.mark.parametrize("cut", [0, 5, 8, 20, -1, -13])
def test_truncated_files_are_rejected(cut, tmp_path):
    data = _valid_bytes()
    with pytest.raises(CheckpointError, match=r"truncated|not a valid"):
        _load_bytes(data[:cut])
    (tmp_path / "cut.safetensors").write_bytes(data[:cut])
    with pytest.raises(CheckpointError, match=r"truncated|not a valid"):
        load(
            tmp_path / "cut.safetensors",
            {"a": jnp.zeros(4), "b": jnp.zeros(3, jnp.int32)},
        )


def test_trailing_bytes_and_corrupt_headers_are_rejected():
    data = _valid_bytes()
    with pytest.raises(CheckpointError, match="belong to no tensor"):
        _load_bytes(data + b"\0" * 8)
    n = struct.unpack("<Q", data[:8])[0]
    garbage = data[:8] + b"\xff" * n + data[8 + n :]
    with pytest.raises(CheckpointError, match="not valid JSON"):
        _load_bytes(garbage)
    with pytest.raises(CheckpointError, match="not a JSON object"):
        _load_bytes(struct.pack("<Q", 2) + b"[]")


def _hostile(entry: dict, data: bytes = b"\0" * 16, **extra) -> io.BytesIO:
    return _safetensors_file({"a": entry, **extra}, data)


@pytest.mark.parametrize(
    "file, message",
    [
        (_safetensors_file({}, header_len=2**62), "over the"),
        (_safetensors_file({}, header_len=200 * 2**20), "over the"),
        (_safetensors_file({}, header_len=1000), "only"),
        (
            _hostile({"dtype": "F32", "shape": [4], "data_offsets": [0, 2**40]}),
            "truncated",
        ),
        (_hostile({"dtype": "F32", "shape": [2**40], "data_offsets": [0, 16]}), "span"),
        (
            _hostile(
                {"dtype": "F32", "shape": [2**40, 2**40], "data_offsets": [0, 16]}
            ),
            "too large|span",
        ),
        (
            _hostile(
                {"dtype": "F32", "shape": [0, 2**62, 2**62], "data_offsets": [0, 0]}
            ),
            "too large",
        ),
        (
            _hostile({"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}),
            "non-negative",
        ),
        (
            _hostile({"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}),
            "non-negative",
        ),
        (
            _hostile({"dtype": "F32", "shape": [4.0], "data_offsets": [0, 16]}),
            "non-negative",
        ),
        (
            _hostile({"dtype": "F32", "shape": [4], "data_offsets": [8, 4]}),
            "not ordered",
        ),
        (
            _hostile({"dtype": "F32", "shape": [4], "data_offsets": [-16, 0]}),
            "not ordered",
        ),
        (
            _hostile({"dtype": "O", "shape": [4], "data_offsets": [0, 16]}),
            "does not read",
        ),
        (_hostile({"dtype": "F32", "shape": [4]}), "data_offsets"),
        (
            _hostile(
                {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                b"\0" * 24,
                b={"dtype": "F32", "shape": [2], "data_offsets": [8, 16]},
            ),
            "overlap",
        ),
        (
            _hostile(
                {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                b={"dtype": "F32", "shape": [1], "data_offsets": [12, 16]},
            ),
            "belong to no tensor",
        ),
        (
            _hostile(
                {"dtype": "U8", "shape": [16], "data_offsets": [0, 16]},
                __metadata__={"autostatic.dtypes": json.dumps({"a": "object"})},
            ),
            "unknown numpy dtype",
        ),
        (
            _hostile(
                {"dtype": "U8", "shape": [16], "data_offsets": [0, 16]},
                __metadata__={"autostatic.dtypes": json.dumps({"a": "complex128"})},
            ),
            "cannot hold",
        ),
        (
            _hostile(
                {"dtype": "U8", "shape": [16], "data_offsets": [0, 16]},
                __metadata__={"autostatic.dtypes": "[" * 100_000},
            ),
            "not JSON",
        ),
        (io.BytesIO(struct.pack("<Q", 16) + b'{"a":1, "a":2}  '), "appears twice"),
        (io.BytesIO(struct.pack("<Q", 8) + b"[" * 8), "not valid JSON"),
        (io.BytesIO(struct.pack("<Q", 10**5) + b"[" * 10**5), "not valid JSON"),
    ],
)
def test_hostile_headers_are_rejected_before_allocating(file, message):
    template = {"a": jax.ShapeDtypeStruct((4,), jnp.float32)}
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(CheckpointError, match=message):
            load(file, template, host=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - start < 2.0
    assert peak < 4 * 2**20


def test_the_file_is_never_unpickled():
    # A .npy blob holding a pickle is refused rather than executed.
    f = io.BytesIO()
    np.save(f, np.array([{"x": 1}], dtype=object), allow_pickle=True)
    f.seek(0)
    with pytest.raises(CheckpointError, match="pickle"):
        load_eqx(f, {"x": jax.ShapeDtypeStruct((1,), jnp.float32)})


# --------------------------------------------------------------------------- files


@pytest.mark.parametrize("kind", ["str", "pathlib", "bytesio"])
def test_paths_and_file_objects(kind, tmp_path):
    model = AutoMLP(2, 3, KEY)
    template = eqx.filter_eval_shape(AutoMLP, 2, 3, KEY)
    if kind == "bytesio":
        f = io.BytesIO(b"prefix")
        f.seek(6)  # a checkpoint may start anywhere in a file object
        save(f, model)
        f.seek(6)
        out = load(f, template)
        assert f.tell() == len(f.getvalue())
    else:
        path = tmp_path / "m.safetensors"
        target = str(path) if kind == "str" else path
        save(target, model)
        assert os.listdir(tmp_path) == ["m.safetensors"]
        out = load(target, template)
    _assert_same_arrays(out, model)


@pytest.mark.parametrize("error", [OSError("disk full"), KeyboardInterrupt()])
def test_failed_save_leaves_the_earlier_file_intact(error, tmp_path, monkeypatch):
    path = tmp_path / "m.safetensors"
    save(path, AutoMLP(2, 3, KEY))
    before = path.read_bytes()
    calls = []
    original = ser._write_tensor

    def failing(f, key, leaf, nbytes):
        calls.append(key)
        if len(calls) == 2:
            f.write(b"\0" * 5)  # partly written when it fails
            raise error
        original(f, key, leaf, nbytes)

    monkeypatch.setattr(ser, "_write_tensor", failing)
    with pytest.raises(type(error)):
        save(path, AutoMLP(2, 3, jax.random.key(7)))
    assert len(calls) == 2
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["m.safetensors"]
    monkeypatch.undo()
    _assert_same_arrays(load(path, AutoMLP(2, 3, KEY)), AutoMLP(2, 3, KEY))


# --------------------------------------------------------------------------- load_eqx


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
    _assert_same_arrays(model, eqx_model)
    _assert_same_arrays(state, eqx_state)

    # Same outputs as the Equinox model.
    def run(m, s):
        y, _ = m.norm(jnp.arange(3.0), s)
        return m.linear(y)

    ours = run(asx.inference_mode(model), state)
    assert jnp.allclose(ours, run(eqx.nn.inference_mode(eqx_model), eqx_state))

    host = load_eqx(tmp_path / "model.eqx", like, host=True)
    assert all(type(x) is np.ndarray for x in jtu.tree_leaves(host))


def test_naive_positional_load_would_shift(tmp_path):
    _eqx_checkpoint(tmp_path)
    like, _ = eqx.filter_eval_shape(eqx.nn.make_with_state(AutoNet), KEY)
    with pytest.raises(RuntimeError, match="changed shape"):
        eqx.tree_deserialise_leaves(tmp_path / "model.eqx", like)
    load_eqx(tmp_path / "model.eqx", like)


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
    _assert_same_arrays(load_eqx(io.BytesIO(data), EqxMLP(2, 3, KEY)), model)


def test_load_eqx_explains_fields_that_equinox_marked_static():
    # EqxMLP marks `width` static, so Equinox did not save it; AutoMLP's full leaf
    # order has it. The error says so instead of loading shifted values.
    f = io.BytesIO()
    eqx.tree_serialise_leaves(f, EqxMLP(2, 3, KEY))
    f.seek(0)
    with pytest.raises(
        CheckpointError, match=r"leaf \.layers\[0\]\.width .*static=True"
    ):
        load_eqx(f, eqx.filter_eval_shape(AutoMLP, 2, 3, KEY))


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


def test_saving_over_a_file_keeps_its_permissions(tmp_path):
    import stat as stat_module

    path = tmp_path / "private.safetensors"
    save(path, {"a": jnp.ones(2)})
    os.chmod(path, 0o600)
    save(path, {"a": jnp.zeros(2)})
    assert stat_module.S_IMODE(os.stat(path).st_mode) == 0o600
