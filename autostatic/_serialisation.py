"""Checkpoints addressed by key path: `save`, `load`, and `load_eqx` for Equinox files.

Why not `eqx.tree_serialise_leaves`? Its format is positional: one `.npy` blob per leaf,
in depth-first order, Python scalars included. An AutoModule keeps its Python scalars
static, so the same model flattens to fewer leaves and a positional load would shift.
Here every array is stored under the name of its natural key path
(`jax.tree_util.keystr`, e.g. `.layers[0].weight`), which is the same for an AutoModule
and for the equivalent `eqx.Module`, does not depend on which values are static, and
lets a mismatch be reported by name. `load_eqx` still reads Equinox's own files, by
walking the template in Equinox's leaf order.

File format (`save`)
--------------------
A standard safetensors file, readable by other tools without this library:

- 8 bytes: little-endian unsigned length N of the header; N bytes of JSON (padded with
  spaces to a multiple of 8); then the tensor bytes, little-endian, C order, packed
  without gaps, exactly as the safetensors specification requires.
- One tensor per array leaf, named by `keystr` of its key path. Non-array leaves and all
  static data are not stored: they come from the template at load time.
- Tensors are laid out by decreasing item size, so each one starts at a multiple of its
  item size (the data section starts 8-aligned) and copies out at full speed.
- dtypes with a safetensors name use it: F64 F32 F16 BF16 F8_E4M3 (float8_e4m3fn)
  F8_E5M2 F8_E4M3FNUZ F8_E5M2FNUZ F8_E8M0 (float8_e8m0fnu) I8..I64 U8..U64 BOOL C64.
- A safetensors reader rejects the *whole file* when one dtype name is unknown to it
  (checked with safetensors 0.8.0), so other dtypes are not given names of our own.
  They are stored as their raw bytes under a standard dtype, and
  `__metadata__["autostatic.dtypes"]` (a JSON object, since safetensors metadata values
  are strings) maps each such tensor name to its exact numpy dtype name:
  complex128 is stored as F64 with a trailing axis of 2 (real, imaginary: its memory
  layout); every other one (int4, uint4, int2, uint2, float8_e4m3, float8_e3m4,
  float8_e4m3b11fnuz, float4_e2m1fn, float6_*, ...) as U8, one byte per element as
  ml_dtypes holds it in memory (not safetensors' bit-packed F4/F6), with a trailing axis
  of the item size when that is more than one byte. Other tools see the raw bytes; this
  library restores the dtype bit for bit.

Memory and safety (`load`)
--------------------------
The header is read, validated and compared with the template before any tensor is read,
so a mismatch raises one error naming every offending key and nothing is half-loaded.
Each tensor is then read with `readinto` straight into its own freshly allocated numpy
array, one at a time; with `host=False` it is handed to `jax.device_put` at once, and at
most two transfers are in flight (an asynchronous transfer holds its host buffer, so
unbounded, reading would run ahead and pile the whole file up on the host). The buffers
are 64-byte aligned, which XLA's CPU client adopts without copying. So loading needs
the memory of the result plus a tensor or two, never a second copy of the file. It
deliberately does not use a memory map: JAX's CPU backend aliases numpy buffers in
`device_put`, so arrays made from a map would stay backed by the file, and a mapped
file truncated by another process kills the reader with SIGBUS instead of raising an
error.

Nothing from the file is ever executed (JSON header, raw bytes, no pickle), and every
header field is checked before anything is allocated: header length (at most 100 MB and
within the file), JSON shape, dtype names (looked up in a fixed table, never passed to
`np.dtype`), non-negative integer dimensions, offsets inside the data section, tiling it
without overlaps or gaps, and each tensor's byte count equal to shape times item size.
So no tensor can claim more memory than the file has bytes.

Reading Equinox's files (`load_eqx`)
------------------------------------
`eqx.tree_serialise_leaves` writes one `.npy` blob per leaf of the `eqx.Module`, in
depth-first order: arrays, and Python bool/int/float/complex values (which are static
in an AutoModule); other leaves are skipped. `load_eqx` walks `expose(like)`, in which
every AutoModule field is a child again, so its leaves come in that same order. Each
blob's header is parsed (numpy's own header parser; object dtypes, which would need
pickle, are refused) and checked against the template leaf before its data is read:
arrays by shape and dtype, stored Python values against the template's static value.
A difference, a missing blob or trailing bytes is an error naming the key path.
"""

import contextlib
import dataclasses
import io
import json
import math
import os
import pathlib
import secrets
import stat
import struct
import sys
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

import equinox as eqx
import jax
import jax.tree_util as jtu
import ml_dtypes
import numpy as np

from ._partition import expose, is_dynamic_leaf

PathOrFile = str | os.PathLike | BinaryIO

MAX_HEADER_BYTES = 100 * 1024 * 1024
_MAX_NDIM = 64  # numpy's own limit
_METADATA_DTYPES = "autostatic.dtypes"
_LITTLE_ENDIAN_HOST = sys.byteorder == "little"


class CheckpointError(ValueError):
    """A file that is not a valid checkpoint, or that does not match the template."""


# --------------------------------------------------------------------------- dtypes

_NUMPY_DTYPE_NAMES = (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
)  # fmt: skip
_ML_DTYPE_NAMES = (
    "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
    "float8_e8m0fnu", "float8_e4m3", "float8_e3m4", "float8_e4m3b11fnuz",
    "float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn", "int4", "uint4", "int2", "uint2",
    "int1", "uint1", "complex32", "bcomplex32",
)  # fmt: skip


def _known_dtypes() -> dict[str, np.dtype]:
    known = {name: np.dtype(name) for name in _NUMPY_DTYPE_NAMES}
    for name in _ML_DTYPE_NAMES:
        scalar_type = getattr(ml_dtypes, name, None)  # older ml_dtypes lack some
        if scalar_type is not None:
            known[name] = np.dtype(scalar_type)
    return known


# Every dtype this module reads or writes, by numpy name. Names read from a file are
# only ever looked up here.
_KNOWN_DTYPES = _known_dtypes()

_SAFETENSORS_NAMES = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
    "float8_e4m3fnuz": "F8_E4M3FNUZ", "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "float8_e8m0fnu": "F8_E8M0",
    "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8",
    "uint64": "U64", "uint32": "U32", "uint16": "U16", "uint8": "U8",
    "bool": "BOOL", "complex64": "C64",
}  # fmt: skip
_SAFETENSORS_NAMES = {k: v for k, v in _SAFETENSORS_NAMES.items() if k in _KNOWN_DTYPES}
_FROM_SAFETENSORS = {v: _KNOWN_DTYPES[k] for k, v in _SAFETENSORS_NAMES.items()}


@dataclasses.dataclass(frozen=True)
class _Storage:
    """How a dtype is stored: a safetensors dtype, plus a trailing axis if raw."""

    name: str  # safetensors dtype name
    dtype: np.dtype  # its numpy dtype
    extra_axis: int | None  # trailing axis length for raw storage; None if none
    raw: bool  # recorded in __metadata__


def _dtype_name(dtype: np.dtype) -> str | None:
    """The name under which `dtype` is in `_KNOWN_DTYPES`, if it is (any byte order)."""
    known = _KNOWN_DTYPES.get(dtype.name)
    if known is None:
        return None
    if known == dtype or (dtype.byteorder in "<>" and known == dtype.newbyteorder("=")):
        return dtype.name
    return None


def _storage(name: str) -> _Storage:
    st_name = _SAFETENSORS_NAMES.get(name)
    if st_name is not None:
        return _Storage(st_name, _FROM_SAFETENSORS[st_name], None, raw=False)
    if name == "complex128":
        return _Storage("F64", np.dtype("float64"), 2, raw=True)
    itemsize = _KNOWN_DTYPES[name].itemsize
    return _Storage("U8", np.dtype("uint8"), itemsize if itemsize > 1 else None, True)


def _little_endian(dtype: np.dtype) -> np.dtype:
    # Only numpy's own multi-byte types have a byte order to choose; ml_dtypes are
    # native, which is little-endian on every platform JAX runs on.
    if (
        dtype.byteorder in "=<>"
        and dtype.itemsize > 1
        and dtype.name in _NUMPY_DTYPE_NAMES
    ):
        return dtype.newbyteorder("<")
    return dtype


def _show(key: str) -> str:
    return key or "<root>"  # the key path of a tree that is a single array


def _describe(dtype: np.dtype | str, shape: tuple[int, ...]) -> str:
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    return f"{name}[{','.join(map(str, shape))}]"


# --------------------------------------------------------------------------- save


def _array_leaves(tree: Any) -> list[tuple[str, Any]]:
    """Each array leaf of `tree` with the keystr of its path, which must be unique."""
    out: dict[str, Any] = {}
    for path, leaf in jtu.tree_flatten_with_path(tree)[0]:
        key = jtu.keystr(path)
        if isinstance(leaf, jax.ShapeDtypeStruct):
            raise CheckpointError(
                f"{_show(key)} is a jax.ShapeDtypeStruct, which has no data to "
                "save. Save a tree of concrete arrays (abstract trees are for `like` "
                "in load)."
            )
        if not eqx.is_array(leaf):
            continue
        if isinstance(leaf, jax.core.Tracer):
            raise CheckpointError(
                f"{_show(key)} is a traced array: save cannot run inside jax.jit, "
                "jax.grad or other transformations. Call it outside them."
            )
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            raise CheckpointError(
                f"{_show(key)} is not fully addressable from this process (a "
                "multi-host array). Gather it first, e.g. with "
                "jax.experimental.multihost_utils.process_allgather."
            )
        if key in out:
            raise CheckpointError(
                f"two array leaves have the key path {key!r}, so they would share a "
                "name in the file. Give them distinct keys (e.g. different dict keys "
                "or attribute names)."
            )
        out[key] = leaf
    return list(out.items())


@dataclasses.dataclass(frozen=True)
class _Entry:
    key: str
    leaf: Any
    storage: _Storage
    stored_shape: tuple[int, ...]
    nbytes: int
    itemsize: int


def _checked_dtype(key: str, leaf: Any, known_only: bool = True) -> np.dtype:
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        raise CheckpointError(
            f"{_show(key)} is an array of PRNG keys, which has no portable bytes. "
            "Store jax.random.key_data(key) instead, and rebuild the key with "
            "jax.random.wrap_key_data after loading."
        )
    dtype = np.dtype(leaf.dtype)
    if known_only and _dtype_name(dtype) is None:
        raise CheckpointError(
            f"{_show(key)} has dtype {dtype}, which has no checkpoint format. "
            f"Supported: {', '.join(sorted(_KNOWN_DTYPES))}. Cast it "
            "(x.astype(...)) first."
        )
    return dtype


def _plan(leaves: list[tuple[str, Any]]) -> tuple[bytes, list[_Entry]]:
    """The header bytes, and the entries in the order their bytes are written."""
    entries = []
    raw_dtypes: dict[str, str] = {}
    for key, leaf in leaves:
        dtype = _checked_dtype(key, leaf)
        storage = _storage(dtype.name)
        shape = tuple(int(d) for d in np.shape(leaf))
        stored_shape = shape
        if storage.extra_axis is not None:
            stored_shape = shape + (storage.extra_axis,)
        if storage.raw:
            raw_dtypes[key] = dtype.name
        nbytes = math.prod(shape) * dtype.itemsize
        entries.append(_Entry(key, leaf, storage, stored_shape, nbytes, dtype.itemsize))
    # Decreasing item size keeps every tensor aligned to its item size (stable sort, so
    # same-size tensors keep their natural order).
    order = sorted(entries, key=lambda e: -min(e.itemsize, 8))
    offsets = {}
    offset = 0
    for entry in order:
        offsets[entry.key] = [offset, offset + entry.nbytes]
        offset += entry.nbytes
    header: dict[str, Any] = {}
    if raw_dtypes:
        header["__metadata__"] = {_METADATA_DTYPES: json.dumps(raw_dtypes)}
    for entry in entries:  # the header itself in natural order, for people reading it
        header[entry.key] = {
            "dtype": entry.storage.name,
            "shape": list(entry.stored_shape),
            "data_offsets": offsets[entry.key],
        }
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    return encoded, order


def _write_tensor(f: BinaryIO, key: str, leaf: Any, nbytes: int) -> None:
    # One array on the host at a time: a device array is copied here, then dropped.
    array = np.asarray(leaf)
    if array.dtype.byteorder == ">" or (
        array.dtype.byteorder == "=" and not _LITTLE_ENDIAN_HOST
    ):
        array = array.astype(_little_endian(array.dtype))
    flat = np.ascontiguousarray(array).reshape(-1)
    if flat.nbytes != nbytes:
        raise CheckpointError(
            f"{_show(key)} changed size while being saved ({nbytes} bytes "
            f"planned, {flat.nbytes} found)."
        )
    if nbytes:
        f.write(memoryview(flat.view(np.uint8)))


def _write(f: BinaryIO, header: bytes, order: list[_Entry]) -> None:
    f.write(struct.pack("<Q", len(header)))
    f.write(header)
    for entry in order:
        _write_tensor(f, entry.key, entry.leaf, entry.nbytes)


def _is_path(file: Any) -> bool:
    return isinstance(file, (str, bytes, os.PathLike))


def _fsync_folder(folder: str) -> None:
    # Makes the rename itself durable; not every platform can open a folder.
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> None:
    """Writes through `write` to a temporary file in the same folder, then renames it.

    A failure at any point leaves an existing file at `path` untouched and removes the
    temporary file.
    """
    path = os.fsdecode(os.fspath(path))
    folder = os.path.dirname(os.path.abspath(path))
    temp = os.path.join(folder, f".{os.path.basename(path)}.{secrets.token_hex(6)}.tmp")
    # os.open with 0o666 gives the final file the usual umask permissions.
    fd = os.open(
        temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666
    )
    try:
        with contextlib.suppress(FileNotFoundError):  # keep a replaced file's mode
            os.chmod(fd, stat.S_IMODE(os.stat(path).st_mode))
        with open(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    _fsync_folder(folder)


def save(file: PathOrFile, tree: Any) -> None:
    """Saves the arrays of `tree` as a safetensors file, each under its key path.

    **Arguments:**

    - `file`: a path (`str` or `os.PathLike`), or a binary file object open for
        writing. Saving to a path is atomic: the file is written next to it under a
        temporary name, flushed to disk and renamed, so a crash leaves any earlier file
        intact.
    - `tree`: any pytree (AutoModule, `eqx.Module`, dicts, ...). Every array leaf
        (`eqx.is_array`: JAX and numpy arrays and scalars) is stored under
        `jax.tree_util.keystr` of its natural key path, e.g. `.layers[0].weight`.
        Other leaves and static data are not stored; `load` takes them from its
        template.

    Arrays are copied to the host and written one at a time.
    """
    header, order = _plan(_array_leaves(tree))
    if _is_path(file):
        _atomic_write(file, lambda f: _write(f, header, order))
    else:
        _write(file, header, order)  # pyright: ignore[reportArgumentType]


# --------------------------------------------------------------------------- reading


class _Source:
    """Random access to the bytes of a checkpoint, relative to where it starts."""

    def __init__(self, file: BinaryIO, name: str):
        self.file = file
        self.name = name
        try:
            self.start = file.tell()
            self.size = file.seek(0, io.SEEK_END) - self.start
        except (AttributeError, OSError, io.UnsupportedOperation) as err:
            raise CheckpointError(
                f"{name} is not seekable ({err}); load needs random access. Read it "
                "into an io.BytesIO first."
            ) from err
        self._readinto = getattr(file, "readinto", None)

    def read_into(self, offset: int, view: memoryview, what: str) -> None:
        self.file.seek(self.start + offset)
        done, total = 0, len(view)
        while done < total:
            if self._readinto is not None:
                got = self._readinto(view[done:])
            else:
                chunk = self.file.read(min(total - done, 1 << 26))
                got = len(chunk)
                view[done : done + got] = chunk
            if not got:
                raise CheckpointError(
                    f"{self.name} ended while reading {what}: {total} bytes expected "
                    f"at byte {offset}, {done} found. The file is truncated or was "
                    "changed while loading."
                )
            done += got


@contextlib.contextmanager
def _open_source(file: PathOrFile) -> Iterator[_Source]:
    if _is_path(file):
        name = os.fsdecode(os.fspath(file))  # pyright: ignore[reportArgumentType]
        with open(name, "rb", buffering=0) as f:
            yield _Source(f, repr(name))  # pyright: ignore[reportArgumentType]
    else:
        yield _Source(file, "the file object")  # pyright: ignore[reportArgumentType]


@dataclasses.dataclass(frozen=True)
class _Tensor:
    key: str
    dtype: np.dtype  # the array's dtype after loading
    shape: tuple[int, ...]  # the array's shape after loading
    begin: int  # byte offsets in the data section
    end: int


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"the key {key!r} appears twice")
            seen.add(key)
    return out


def _is_int(x: Any) -> bool:
    return type(x) is int  # not bool, not float


def _parse_header(raw: bytes, data_len: int, name: str) -> dict[str, _Tensor]:
    def corrupt(why: str) -> CheckpointError:
        return CheckpointError(f"{name} is not a valid safetensors file: {why}.")

    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise corrupt(f"its header is not valid JSON ({err})") from None
    if not isinstance(header, dict):
        raise corrupt("its header is not a JSON object")
    metadata = header.pop("__metadata__", None)
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict) or not all(
        isinstance(v, str) for v in metadata.values()
    ):
        raise corrupt("__metadata__ is not an object of strings")
    raw_dtypes: Any = {}
    if _METADATA_DTYPES in metadata:
        try:
            raw_dtypes = json.loads(metadata[_METADATA_DTYPES])
        except (ValueError, RecursionError) as err:
            raise corrupt(
                f"__metadata__[{_METADATA_DTYPES!r}] is not JSON ({err})"
            ) from None
        if not isinstance(raw_dtypes, dict) or not all(
            isinstance(v, str) for v in raw_dtypes.values()
        ):
            raise corrupt(
                f"__metadata__[{_METADATA_DTYPES!r}] is not an object of strings"
            )
        for key in raw_dtypes:
            if key not in header:
                raise corrupt(
                    f"__metadata__ names a dtype for {key!r}, which is not a tensor"
                )

    tensors: dict[str, _Tensor] = {}
    for key, entry in header.items():
        where = f"tensor {key!r}"
        if not isinstance(entry, dict) or set(entry) != {
            "dtype",
            "shape",
            "data_offsets",
        }:
            raise corrupt(
                f"{where} is not an object with dtype, shape and data_offsets"
            )
        st_dtype = (
            _FROM_SAFETENSORS.get(entry["dtype"])
            if isinstance(entry["dtype"], str)
            else None
        )
        if st_dtype is None:
            raise corrupt(
                f"{where} has dtype {entry['dtype']!r}, which this library does not "
                f"read (known: {', '.join(sorted(_FROM_SAFETENSORS))})"
            )
        shape = entry["shape"]
        if (
            not isinstance(shape, list)
            or len(shape) > _MAX_NDIM
            or not all(_is_int(d) and d >= 0 for d in shape)
        ):
            raise corrupt(
                f"{where} has shape {shape!r}; expected at most {_MAX_NDIM} "
                "non-negative integers"
            )
        shape = tuple(shape)
        # Bounded so that numpy can represent it, even when some dimension is zero.
        if math.prod(max(d, 1) for d in shape) * st_dtype.itemsize >= 2**63:
            raise corrupt(
                f"{where} has shape {shape}, which is too large for any array"
            )
        offsets = entry["data_offsets"]
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(map(_is_int, offsets))
        ):
            raise corrupt(
                f"{where} has data_offsets {offsets!r}; expected [begin, end]"
            )
        begin, end = offsets
        if not 0 <= begin <= end:
            raise corrupt(f"{where} has data_offsets {offsets}, which are not ordered")
        if end > data_len:
            raise corrupt(
                f"{where} lies at bytes [{begin}, {end}) of the data, which has only "
                f"{data_len} bytes: the file is truncated or the header is wrong"
            )
        nbytes = math.prod(shape) * st_dtype.itemsize
        if end - begin != nbytes:
            raise corrupt(
                f"{where} is {_describe(st_dtype, shape)} ({nbytes} bytes) but its "
                f"data_offsets span {end - begin} bytes"
            )
        dtype = st_dtype
        if key in raw_dtypes:
            true = _KNOWN_DTYPES.get(raw_dtypes[key])
            if true is None:
                raise corrupt(
                    f"{where} has the unknown numpy dtype {raw_dtypes[key]!r} in "
                    "__metadata__"
                )
            storage = _storage(raw_dtypes[key])
            fits = storage.name == entry["dtype"] and (
                storage.extra_axis is None
                or (shape and shape[-1] == storage.extra_axis)
            )
            if not fits:
                raise corrupt(
                    f"{where} is {_describe(entry['dtype'], shape)}, which cannot hold "
                    f"{raw_dtypes[key]} data"
                )
            dtype = true
            if storage.extra_axis is not None:
                shape = shape[:-1]
        tensors[key] = _Tensor(key, dtype, shape, begin, end)

    # The tensors must tile the data section exactly, as safetensors requires: no
    # overlaps (two names sharing bytes), no gaps, nothing after the last one.
    expected = 0
    previous = None
    for t in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if t.begin < expected:
            raise corrupt(f"tensors {previous!r} and {t.key!r} overlap")
        if t.begin > expected:
            raise corrupt(
                f"bytes [{expected}, {t.begin}) of the data belong to no tensor"
            )
        expected, previous = t.end, t.key
    if expected != data_len:
        raise corrupt(f"the last {data_len - expected} bytes belong to no tensor")
    return tensors


def _read_header(source: _Source) -> tuple[dict[str, _Tensor], int]:
    """The tensors of the file, and where its data section starts."""
    if source.size < 8:
        raise CheckpointError(
            f"{source.name} is not a valid safetensors file: it has {source.size} "
            "bytes, fewer than the 8-byte header length. The file is truncated or "
            "empty."
        )
    prefix = bytearray(8)
    source.read_into(0, memoryview(prefix), "the header length")
    (header_len,) = struct.unpack("<Q", prefix)
    if header_len > MAX_HEADER_BYTES:
        raise CheckpointError(
            f"{source.name} is not a valid safetensors file: its header claims "
            f"{header_len} bytes, over the {MAX_HEADER_BYTES}-byte limit. It is "
            "corrupt or not a safetensors file."
        )
    if 8 + header_len > source.size:
        raise CheckpointError(
            f"{source.name} is not a valid safetensors file: its header claims "
            f"{header_len} bytes but only {source.size - 8} follow. The file is "
            "truncated or corrupt."
        )
    raw = bytearray(header_len)
    source.read_into(8, memoryview(raw), "the header")
    tensors = _parse_header(bytes(raw), source.size - 8 - header_len, source.name)
    return tensors, 8 + header_len


# --------------------------------------------------------------------------- templates


def _template_shape_dtype(
    key: str, leaf: Any, known_only: bool = True
) -> tuple[tuple[int, ...], np.dtype]:
    dtype = _checked_dtype(key, leaf, known_only)
    if dtype.byteorder in "<>":  # a byte-swapped numpy template; the file is native
        dtype = dtype.newbyteorder("=")
    return tuple(int(d) for d in np.shape(leaf)), dtype


def _is_numpy(leaf: Any) -> bool:
    return isinstance(leaf, (np.ndarray, np.generic))


# XLA's CPU client aliases a numpy buffer aligned to this instead of copying it, so a
# tensor read into such a buffer becomes a device array without a second copy.
_ALIGNMENT = 64


def _aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + _ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % _ALIGNMENT
    return raw[start : start + nbytes].view(dtype).reshape(shape)


class _InFlight:
    """Bounds the host buffers held by asynchronous `device_put`s to two tensors.

    A transfer keeps its numpy buffer alive until it completes; without waiting, reading
    runs ahead of the transfers and the whole file can pile up on the host. Waiting for
    the previous transfer after starting the next one keeps reading and copying
    overlapped.
    """

    def __init__(self) -> None:
        self.previous: Any = None

    def add(self, value: Any) -> Any:
        if isinstance(value, jax.Array):
            self.wait()
            self.previous = value
        return value

    def wait(self) -> None:
        if self.previous is not None:
            self.previous.block_until_ready()
            self.previous = None


def _finish(array: np.ndarray, like: Any, host: bool) -> Any:
    """The loaded value for the template leaf `like`: numpy, or a placed jax.Array."""
    if isinstance(like, np.generic):
        return array[()]
    if host or _is_numpy(like):
        return array
    # Same placement as the template; ShapeDtypeStruct.sharding may be None (default
    # device). On CPU, JAX may alias `array`, which is ours alone, so no copy is made.
    return jax.device_put(array, getattr(like, "sharding", None))


def _check_jax_can_hold(key: str, dtype: np.dtype, like: Any, host: bool) -> str | None:
    if host or _is_numpy(like):
        return None
    if jax.dtypes.canonicalize_dtype(dtype) != dtype:
        return (
            f"{_show(key)}: {dtype} cannot become a jax.Array while 64-bit mode is "
            "off (JAX would silently convert it); enable jax_enable_x64 or load with "
            "host=True"
        )
    return None


def _format_problems(name: str, problems: list[str], hint: str) -> str:
    lines = "\n  ".join(problems)
    return (
        f"{name} does not match the template ({len(problems)} problem"
        f"{'s' if len(problems) != 1 else ''}):\n  {lines}\n{hint}"
    )


def load(
    file: PathOrFile, like: Any, *, host: bool = False, strict: bool = True
) -> Any:
    """Loads a file written by `save` into the structure of the template `like`.

    **Arguments:**

    - `file`: a path, or a seekable binary file object positioned at the checkpoint.
    - `like`: a tree of the same structure as the saved one: a concrete model, or an
        abstract one whose arrays are `jax.ShapeDtypeStruct`s (from
        `eqx.filter_eval_shape` or `jax.eval_shape`, which allocate nothing). Its array
        leaves are filled from the file by key path; every other leaf and all static
        data are kept from `like`.
    - `host`: if `True`, every loaded leaf is a numpy array (bfloat16 etc. as ml_dtypes
        arrays) and nothing is allocated on any JAX device. If `False`, leaves whose
        template is a `jax.Array` or `ShapeDtypeStruct` become `jax.Array`s placed
        with the template leaf's `.sharding` (the default device if it has none);
        leaves whose template is a numpy array stay numpy arrays, as in Equinox.
    - `strict`: if `False`, tensors in the file that the template does not have are
        ignored. Tensors the template needs but the file lacks are always an error.

    **Returns:**

    A copy of `like` with its arrays loaded.

    **Raises:**

    `CheckpointError` (a `ValueError`) if the file is not a valid checkpoint, or, before
    anything is loaded, if it does not match the template: one error listing every
    missing key, unexpected key, and shape or dtype difference.
    """
    with _open_source(file) as source:
        tensors, data_start = _read_header(source)
        paths_and_leaves, treedef = jtu.tree_flatten_with_path(like)
        wanted: dict[str, tuple[int, Any]] = {}
        others: dict[str, Any] = {}
        problems: list[str] = []
        for index, (path, leaf) in enumerate(paths_and_leaves):
            key = jtu.keystr(path)
            if not is_dynamic_leaf(leaf):
                others[key] = leaf
            elif key in wanted:
                raise CheckpointError(
                    f"two array leaves of the template have the key path {key!r}; "
                    "keys must be unique to load by name."
                )
            else:
                wanted[key] = (index, leaf)
        for key, (_, leaf) in wanted.items():
            shape, dtype = _template_shape_dtype(key, leaf)
            tensor = tensors.get(key)
            expected = _describe(dtype, shape)
            if tensor is None:
                problems.append(
                    f"missing from the file: {_show(key)} (template: {expected})"
                )
                continue
            found = _describe(tensor.dtype, tensor.shape)
            if tensor.shape != shape:
                problems.append(
                    f"shape differs: {_show(key)} (template: {expected}, file: {found})"
                )
            elif tensor.dtype != dtype:
                problems.append(
                    f"dtype differs: {_show(key)} (template: {expected}, file: {found})"
                )
            else:
                problem = _check_jax_can_hold(key, dtype, leaf, host)
                if problem is not None:
                    problems.append(problem)
        if strict:
            for key, tensor in tensors.items():
                if key not in wanted:
                    there = (
                        f"; the template has a {type(others[key]).__name__} there"
                        if key in others
                        else ""
                    )
                    found = _describe(tensor.dtype, tensor.shape)
                    problems.append(
                        f"not in the template: {_show(key)} (file: {found}{there})"
                    )
        if problems:
            raise CheckpointError(
                _format_problems(
                    source.name,
                    problems,
                    "Build the template with the hyperparameters of the saved model. "
                    "Pass strict=False to ignore tensors the template does not have.",
                )
            )

        new_leaves = [leaf for _, leaf in paths_and_leaves]
        in_flight = _InFlight()
        # In file order, so a path is read front to back.
        for key in sorted(wanted, key=lambda k: tensors[k].begin):
            index, leaf = wanted[key]
            tensor = tensors[key]
            array = _aligned_empty(tensor.shape, _little_endian(tensor.dtype))
            if array.nbytes:
                view = memoryview(array.reshape(-1).view(np.uint8))
                source.read_into(data_start + tensor.begin, view, f"tensor {key!r}")
            if array.dtype != tensor.dtype:
                array = array.astype(tensor.dtype)  # big-endian hosts only
            new_leaves[index] = in_flight.add(_finish(array, leaf, host))
            del array
        in_flight.wait()
        source.file.seek(source.start + source.size)
    return jtu.tree_unflatten(treedef, new_leaves)


# --------------------------------------------------------------------------- load_eqx


def _with_eqx_suffix(path: str | os.PathLike) -> pathlib.Path:
    # The rule of eqx.tree_serialise_leaves, so the same path finds the same file.
    path = pathlib.Path(os.fsdecode(os.fspath(path)))
    return path.with_suffix(".eqx") if path.suffix == "" else path


class _NpyReader:
    """Reads Equinox's concatenated `.npy` blobs one at a time, checking each first."""

    def __init__(self, file: BinaryIO, name: str):
        self.file = file
        self.name = name
        self.start = file.tell()
        self.end = file.seek(0, io.SEEK_END)
        file.seek(self.start)
        self.count = 0

    def fail(self, key: str, offset: int, why: str, hint: str = "") -> CheckpointError:
        hint = hint or (
            "The file was not saved from a model with the structure of this template "
            "(or is corrupt)"
        )
        return CheckpointError(
            f"{self.name}, leaf {_show(key)} (blob #{self.count}, byte "
            f"{offset - self.start}): {why}. {hint}; nothing was loaded."
        )

    def header(self, key: str) -> tuple[tuple[int, ...], bool, np.dtype, int]:
        """Reads the next blob's header: shape, Fortran order, dtype, blob offset."""
        offset = self.file.tell()
        if offset >= self.end:
            raise self.fail(
                key,
                offset,
                "the file ends here, but the template has more leaves that Equinox "
                "saves (arrays and bool/int/float/complex values)",
            )
        try:
            version = np.lib.format.read_magic(self.file)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(self.file)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(self.file)
            else:
                raise ValueError(f".npy format version {version} is not supported")
        except (ValueError, SyntaxError, TypeError, OverflowError) as err:
            raise self.fail(key, offset, f"no valid .npy header here ({err})") from None
        if dtype.hasobject:
            raise self.fail(
                key,
                offset,
                f"the blob holds Python objects ({dtype}), which would need "
                "pickle; it is never unpickled",
            )
        return tuple(shape), bool(fortran), dtype, offset

    def data(
        self,
        key: str,
        offset: int,
        shape: tuple[int, ...],
        fortran: bool,
        dtype: np.dtype,
    ) -> np.ndarray:
        nbytes = math.prod(shape) * dtype.itemsize
        left = self.end - self.file.tell()
        if nbytes > left:
            raise self.fail(
                key,
                offset,
                f"the blob needs {nbytes} bytes but only {left} are left: "
                "the file is truncated",
            )
        array = _aligned_empty((math.prod(shape),), dtype)
        view = memoryview(array.view(np.uint8))
        readinto = self.file.readinto  # pyright: ignore[reportAttributeAccessIssue]
        done = 0
        while done < nbytes:
            got = readinto(view[done:])
            if not got:
                raise self.fail(key, offset, "the file ended inside this blob")
            done += got
        self.count += 1
        if fortran:
            return array.reshape(shape[::-1]).transpose()
        return array.reshape(shape)


def _read_dtype_for(stored: np.dtype, expected: np.dtype) -> np.dtype | None:
    """The dtype to read a blob as, to end up as `expected`; None if it cannot."""
    if stored == expected:
        return stored
    # np.save writes ml_dtypes arrays (bfloat16, float8, int4, ...) as plain void
    # ('|V2', '|V1'): same bytes, re-viewed from the template's dtype.
    if (
        stored.kind == "V"
        and stored.fields is None
        and stored.subdtype is None
        and stored.itemsize == expected.itemsize
        and expected.kind in "VW"
    ):
        return stored
    if stored.byteorder in "<>" and stored.newbyteorder("=") == expected:
        return stored  # converted after reading
    return None


def _as_dtype(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if array.dtype == dtype:
        return array
    if array.dtype.kind == "V":
        return array.view(dtype)  # the same bytes, now with their meaning
    return array.astype(dtype)  # byte order


_SCALAR_KINDS = ((bool, "b"), (int, "iu"), (float, "f"), (complex, "c"))


def _scalar_kinds(value: Any) -> str | None:
    for kind, letters in _SCALAR_KINDS:
        if isinstance(value, kind):
            return letters
    return None


def _same_value(stored: np.ndarray, value: Any) -> bool:
    item = stored.item()
    try:
        if item == value:
            return True
        if stored.dtype.kind in "fc":
            # Tolerate a value stored at lower precision, and NaN.
            as_stored = np.asarray(value, dtype=stored.dtype)
            return bool(np.array_equal(as_stored, stored, equal_nan=True))
    except (TypeError, ValueError, OverflowError):
        pass
    return False


@contextlib.contextmanager
def _open_eqx(file: PathOrFile) -> Iterator[tuple[BinaryIO, str]]:
    if _is_path(file):
        path = _with_eqx_suffix(file)  # pyright: ignore[reportArgumentType]
        with open(path, "rb") as f:
            yield f, repr(str(path))
    else:
        yield file, "the file object"  # pyright: ignore[reportReturnType]


def load_eqx(file: PathOrFile, like: Any, *, host: bool = False) -> Any:
    """Loads a file written by `eqx.tree_serialise_leaves` into the template `like`.

    Equinox's format is positional: one `.npy` blob per leaf of the saved model, in
    depth-first order, Python bool/int/float/complex leaves included (e.g.
    `Dropout.p`, `inference` flags, unmarked int fields) and other non-array leaves
    skipped. In an AutoModule those Python values are static, so the template is walked
    in its *full* leaf order, static values included, which is the order of the
    equivalent `eqx.Module`: each array is read and checked against the template's
    shape and dtype, and each stored Python value must equal the template's static
    value. Any difference is an error naming the key path, never a shifted load.

    **Arguments:**

    - `file`: a path (a path without suffix gets `.eqx`, as in Equinox) or a seekable
        binary file object positioned at the checkpoint.
    - `like`: the AutoModule (or any pytree) to load into, concrete or with
        `jax.ShapeDtypeStruct` arrays, built with the saved model's hyperparameters.
    - `host`: as for `load`.

    **Returns:**

    A copy of `like` with its arrays loaded; static values are those of `like`.
    """
    with _open_eqx(file) as (f, name):
        reader = _NpyReader(f, name)
        loaded: dict[str, Any] = {}
        in_flight = _InFlight()
        # Fields declared eqx.field(static=True) were never written by Equinox.
        for path, leaf in jtu.tree_flatten_with_path(
            expose(like, keep_declared_static=True)
        )[0]:
            key = jtu.keystr(path)
            if is_dynamic_leaf(leaf):
                shape, dtype = _template_shape_dtype(key, leaf, known_only=False)
                got_shape, fortran, got_dtype, offset = reader.header(key)
                read_dtype = _read_dtype_for(got_dtype, dtype)
                if got_shape != shape or read_dtype is None:
                    raise reader.fail(
                        key,
                        offset,
                        f"the file has {_describe(got_dtype, got_shape)} "
                        f"where the template has {_describe(dtype, shape)}",
                    )
                problem = _check_jax_can_hold(key, dtype, leaf, host)
                if problem is not None:
                    raise CheckpointError(problem)
                array = _as_dtype(
                    reader.data(key, offset, shape, fortran, read_dtype), dtype
                )
                loaded[key] = in_flight.add(_finish(array, leaf, host))
            elif (kinds := _scalar_kinds(leaf)) is not None:
                got_shape, fortran, got_dtype, offset = reader.header(key)
                if got_shape != () or got_dtype.kind not in kinds:
                    raise reader.fail(
                        key,
                        offset,
                        f"the file has a {_describe(got_dtype, got_shape)} array where "
                        f"the template has the {type(leaf).__name__} {leaf!r}",
                        "The saved model has a different structure. If the Equinox "
                        "model marks this field eqx.field(static=True), Equinox did "
                        "not save it: load the file into the Equinox model with "
                        "eqx.tree_deserialise_leaves, then move the arrays across "
                        "with save and load, which go by key path",
                    )
                stored = reader.data(key, offset, got_shape, fortran, got_dtype)
                if not _same_value(stored, leaf):
                    raise reader.fail(
                        key,
                        offset,
                        f"the file stores {stored.item()!r} where the template has the "
                        f"static value {leaf!r}",
                        "Build the template with the hyperparameters of the saved "
                        f"model ({_show(key)} = {stored.item()!r})",
                    )
            elif hasattr(leaf, "__jax_array__"):
                # Saved by Equinox; static here. Its value must match, like a scalar's.
                expected = np.asarray(leaf)
                got_shape, fortran, got_dtype, offset = reader.header(key)
                read_dtype = _read_dtype_for(got_dtype, expected.dtype)
                if got_shape != expected.shape or read_dtype is None:
                    raise reader.fail(
                        key,
                        offset,
                        f"the file has {_describe(got_dtype, got_shape)} "
                        "where the template has "
                        f"{_describe(expected.dtype, expected.shape)}",
                    )
                stored = reader.data(key, offset, got_shape, fortran, read_dtype)
                if _as_dtype(stored, expected.dtype).tobytes() != expected.tobytes():
                    raise reader.fail(
                        key, offset, "the stored value differs from the template's"
                    )
            # Anything else (functions, strings, None, ...) was not saved.
        in_flight.wait()
        trailing = reader.end - f.tell()
        if trailing:
            raise CheckpointError(
                f"{name}: {trailing} bytes are left after the {reader.count} blobs "
                "that the template accounts for. The file was saved from a model with "
                "more leaves than this template; nothing was loaded."
            )

    def fill(path: tuple, leaf: Any) -> Any:
        if not is_dynamic_leaf(leaf):
            return leaf
        key = jtu.keystr(path)
        try:
            return loaded[key]
        except KeyError:
            raise AssertionError(
                f"internal error: the array at {_show(key)} was not met in the "
                "template's full leaf order. Please report this."
            ) from None

    return jtu.tree_map_with_path(fill, like)
