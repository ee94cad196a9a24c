"""The safetensors format: dtypes, interoperability with the `safetensors` reader, and
files that are corrupt or hostile."""

import io
import json
import random
import struct
import tracemalloc
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import ml_dtypes
import numpy as np
import pytest

import autostatic.checkpoint._header as header
from autostatic import CheckpointError, load, save
from autostatic.checkpoint._dtypes import FROM_SAFETENSORS

from .helpers import array_keystrs, assert_same_arrays, AutoMLP, EqxMLP, fuzz_loads

KEY = jax.random.key(0)


def _header(data: bytes) -> dict:
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n])


def _safetensors_file(header: dict, data: bytes = b"", header_len: int | None = None):
    encoded = json.dumps(header).encode()
    n = len(encoded) if header_len is None else header_len
    return io.BytesIO(struct.pack("<Q", n) + encoded + data)


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
    for path_, leaf in jtu.tree_flatten_with_path(model)[0]:
        if eqx.is_array(leaf):
            np.testing.assert_array_equal(tensors[jtu.keystr(path_)], np.asarray(leaf))


def test_files_written_by_safetensors_load(tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    arrays = {
        "['w']": np.arange(6, dtype=np.float32).reshape(2, 3),
        "['n']": np.array([1, 2], np.int64),
        "['m']": np.array([True, False]),
    }
    safetensors_numpy.save_file(arrays, str(tmp_path / "x.safetensors"))
    template = {k[2:-2]: np.zeros_like(v) for k, v in arrays.items()}
    out = load(tmp_path / "x.safetensors", template, host=True)
    for k, v in arrays.items():
        np.testing.assert_array_equal(out[k[2:-2]], v)


def test_headers_in_any_valid_json_layout_load():
    # Key order, whitespace and escapes that `save` does not write, but JSON allows.
    header = (
        '{\n  "__metadata__": {"format": "pt"},\n  "[\\u0027a\\u0027]": {\n'
        '    "data_offsets": [0, 8],\n    "shape": [ 2 ],\n    "dtype": "F32"\n  }\n}'
    )
    data = struct.pack("<Q", len(header)) + header.encode()
    data += np.array([1.5, 2.5], np.float32).tobytes()
    out = load(io.BytesIO(data), {"a": np.zeros(2, np.float32)})
    assert out["a"].tolist() == [1.5, 2.5]


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


def _dtype_tree(rng: np.random.Generator) -> dict[str, dict[str, np.ndarray]]:
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
            itemsize = np.dtype(FROM_SAFETENSORS[entry["dtype"]]).itemsize
            assert entry["data_offsets"][0] % itemsize == 0

    template = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)
    for like in (tree, template):
        out = load(io.BytesIO(data), like, host=True)
        assert_same_arrays(out, tree)
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
        assert_same_arrays(out, tree)


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


@pytest.mark.parametrize("bad", [2, 255])
def test_bool_bytes_other_than_0_and_1_are_refused(bad):
    f = io.BytesIO()
    save(f, {"ok": np.ones(2, np.float32), "mask": np.array([True, False, True])})
    data = bytearray(f.getvalue())
    begin, _ = _header(bytes(data))["['mask']"]["data_offsets"]
    data[8 + struct.unpack("<Q", data[:8])[0] + begin + 1] = bad
    template = {"ok": np.zeros(2, np.float32), "mask": np.zeros(3, bool)}
    with pytest.raises(CheckpointError, match=r"\['mask'\].*bool.*other than 0 and 1"):
        load(io.BytesIO(bytes(data)), template, host=True)
    with pytest.raises(CheckpointError, match=r"\['mask'\]"):
        load(io.BytesIO(bytes(data)), jax.tree.map(jnp.asarray, template))


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


def _raw_header(text: str, data: bytes = b"\0" * 16) -> io.BytesIO:
    return io.BytesIO(struct.pack("<Q", len(text)) + text.encode() + data)


def _hostile(entry: dict, data: bytes = b"\0" * 16, **extra) -> io.BytesIO:
    return _safetensors_file({"a": entry, **extra}, data)


_F32_4 = {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}


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
            "not a JSON object of strings",
        ),
        (
            _raw_header(f'{{"a":{json.dumps(_F32_4)},"a":{json.dumps(_F32_4)}}}'),
            "appears twice",
        ),
        (io.BytesIO(struct.pack("<Q", 8) + b"[" * 8), "not valid JSON"),
        (io.BytesIO(struct.pack("<Q", 10**5) + b"[" * 10**5), "not valid JSON"),
        (_hostile({"dtype": "F32", "shape": [[[[[[4]]]]]]}), "not an object"),
        (_hostile({"dtype": "F32", "shape": [4], "data_offsets": {"x": 1}}), "not an"),
        (
            _hostile({"dtype": "F32", "shape": [0] * 6000, "data_offsets": [0, 16]}),
            "at most 16384 bytes",
        ),
        (
            _hostile(_F32_4, __metadata__={f"k{i}": "" for i in range(2000)}),
            "more than 1024 entries",
        ),
        (_raw_header(json.dumps({"a": _F32_4}) + " x"), "after the JSON object"),
    ],
)
def test_hostile_headers_are_rejected_before_allocating(file, message):
    template = {"a": jax.ShapeDtypeStruct((4,), jnp.float32)}
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match=message):
            load(file, template, host=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20


def _many_tiny_tensors(count: int) -> bytes:
    """A valid file: the template's one tensor, then `count` empty ones."""
    entries = [f"\"['a']\":{json.dumps(_F32_4)}"]
    entries += [
        f'"[\'t{i}\']":{{"dtype":"F32","shape":[0],"data_offsets":[16,16]}}'
        for i in range(count)
    ]
    header = ("{" + ",".join(entries) + "}").encode()
    return struct.pack("<Q", len(header)) + header + b"\0" * 16


@pytest.mark.parametrize("strict", [True, False])
def test_headers_of_many_tensors_are_bounded_by_the_template(strict, monkeypatch):
    # 300,000 entries: before the bound, +300 MB to reject, and an error message
    # listing every key. Now the work is bounded by what the template needs: the
    # entries checked are counted (a strict load stops after the keys one message
    # lists; a partial one after the most it reads).
    data = _many_tiny_tensors(300_000)
    template = {"a": jax.ShapeDtypeStruct((4,), jnp.float32)}
    checked = []
    original = header._checked_entry
    monkeypatch.setattr(
        header, "_checked_entry", lambda *a: (checked.append(1), original(*a))[1]
    )
    with pytest.raises(CheckpointError) as info:
        load(io.BytesIO(data), template, host=True, strict=strict)
    most = header.MAX_LISTED + 1 if strict else 65_536 + 1
    assert 0 < len(checked) <= most + 1
    tracemalloc.start()  # separately: it slows Python code down several times
    try:
        with pytest.raises(CheckpointError):
            load(io.BytesIO(data), template, host=True, strict=strict)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    message = str(info.value)
    if strict:
        assert "not in the template: ['t0'] (file: float32[0])" in message
        assert "(about 300000 problems)" in message
        assert "... and about 299968 more" in message
    else:
        assert "more than 65536 tensors that the template does not need" in message
    assert len(message) < 5000
    assert peak < 2 * len(data)


def test_a_partial_load_reads_a_file_of_many_tensors():
    data = _many_tiny_tensors(1000)
    template = {"a": jax.ShapeDtypeStruct((4,), jnp.float32)}
    out = load(io.BytesIO(data), template, host=True, strict=False)
    assert out["a"].tolist() == [0.0] * 4
    assert "(about 1000 problems)" in _refusal(data, template)
    # When the header is read to its end, the count is exact.
    many = {f"m{i}": jax.ShapeDtypeStruct((2,), jnp.float32) for i in range(99)}
    message = _refusal(_valid_bytes(), many)
    assert "(101 problems)" in message and "... and 69 more" in message


def _refusal(data: bytes, template: Any) -> str:
    with pytest.raises(CheckpointError) as info:
        load(io.BytesIO(data), template, host=True)
    return str(info.value)


# --------------------------------------------------------------------------- fuzzing


def _fuzz_template() -> tuple[bytes, Any]:
    rng = np.random.default_rng(5)
    tree = {
        "w": rng.standard_normal((64, 96)).astype(np.float32),
        "mask": rng.integers(0, 2, 300).astype(bool),
        "q": rng.integers(-8, 8, (7, 5)).astype(ml_dtypes.int4),
        "c": (rng.standard_normal(6) + 1j).astype(np.complex128),
        "h": rng.standard_normal(33).astype(ml_dtypes.bfloat16),
        "n": np.arange(5, dtype=np.int64),
    }
    f = io.BytesIO()
    save(f, tree)
    return f.getvalue(), jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree
    )


def _mutate(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    header_end = 8 + int.from_bytes(data[:8], "little")
    kind = rng.randrange(6)
    if kind == 0:  # bit flips anywhere
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(out))
            out[i] ^= 1 << rng.randrange(8)
    elif kind == 1:  # truncation
        del out[rng.randrange(len(out)) :]
    elif kind == 2:  # a header byte replaced by a JSON-ish character
        i = rng.randrange(8, header_end)
        out[i] = ord(rng.choice('0123456789[]{}",: -eE.\\u'))
    elif kind == 3:  # a digit of the header changed (shapes, offsets)
        digits = [i for i in range(8, header_end) if chr(out[i]).isdigit()]
        out[rng.choice(digits)] = ord(str(rng.randrange(10)))
    elif kind == 4:  # a header byte inserted or deleted
        i = rng.randrange(8, header_end)
        if rng.random() < 0.5:
            del out[i]
        else:
            out.insert(i, ord(rng.choice(' 0"[')))
    else:  # the header length changed
        out[rng.randrange(8)] = rng.randrange(256)
    return bytes(out)


def test_mutated_files_fail_cleanly():
    """Bit flips, truncations and header edits of a valid file: a CheckpointError or a
    load of the template's shapes and dtypes (flipped data bytes load as changed values:
    there is no checksum), never another exception, a hang or a large allocation."""
    data, template = _fuzz_template()
    outcomes = fuzz_loads(
        lambda raw: load(io.BytesIO(raw), template, host=True),
        data,
        template,
        _mutate,
        400,
    )
    assert outcomes["refused"] > 100 and outcomes["loaded"] > 10, outcomes


# --------------------------------------------------------------------------- files


def test_text_mode_files_are_refused_with_a_clear_error(tmp_path):
    path = tmp_path / "m.safetensors"
    save(path, {"a": np.ones(2, np.float32)})
    template = {"a": np.zeros(2, np.float32)}
    with open(path) as text, pytest.raises(TypeError, match=r"binary.*'rb'"):
        load(text, template)
    with pytest.raises(TypeError, match=r"binary.*'rb'"):
        load(io.StringIO("not bytes"), template)
    with (
        open(tmp_path / "t.safetensors", "w") as text,
        pytest.raises(TypeError, match=r"binary.*'wb'"),
    ):
        save(text, {"a": np.ones(2, np.float32)})
