"""The safetensors format: dtype tables, the file written (header length, header,
tensor bytes) and its header read back with every field checked, and random-access
reading of a file's bytes.

Only the standard format is written, so other tools read our files; dtypes without a
safetensors name travel as raw bytes (design.md, "Serialisation", has the layout).
Reading assumes a hostile file: nothing is executed, every size is checked against the
file before anything is allocated, and the header is parsed one entry at a time so that
the work is bounded by the tensors the caller needs, not by what the file claims.
"""

import array
import contextlib
import dataclasses
import io
import json
import math
import os
import re
import sys
from collections.abc import Callable, Collection, Iterator
from typing import Any, BinaryIO

import ml_dtypes
import numpy as np

PathOrFile = str | os.PathLike | BinaryIO

MAX_HEADER_BYTES = 100 * 1024 * 1024  # safetensors' own limit
MAX_ENTRY_BYTES = 16 * 1024  # 64 dimensions of 20 digits, pretty-printed, fit easily
MAX_METADATA_ENTRIES = 1024
MAX_LISTED = 32  # keys named in one error message; the rest are counted
_LENGTH_BYTES = 8  # the header length that starts a file: unsigned, little-endian
_MAX_NDIM = 64  # numpy's own limit
METADATA_DTYPES = "autostatic.dtypes"
LITTLE_ENDIAN_HOST = sys.byteorder == "little"


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


# Every dtype this library reads or writes, by numpy name. Names read from a file are
# only ever looked up here, never passed to np.dtype.
KNOWN_DTYPES = _known_dtypes()

_SAFETENSORS_NAMES = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
    "float8_e4m3fnuz": "F8_E4M3FNUZ", "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "float8_e8m0fnu": "F8_E8M0",
    "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8",
    "uint64": "U64", "uint32": "U32", "uint16": "U16", "uint8": "U8",
    "bool": "BOOL", "complex64": "C64",
}  # fmt: skip
_SAFETENSORS_NAMES = {k: v for k, v in _SAFETENSORS_NAMES.items() if k in KNOWN_DTYPES}
FROM_SAFETENSORS = {v: KNOWN_DTYPES[k] for k, v in _SAFETENSORS_NAMES.items()}


@dataclasses.dataclass(frozen=True)
class Storage:
    """How a dtype is stored: a safetensors dtype, plus a trailing axis if raw."""

    name: str  # safetensors dtype name
    extra_axis: int | None  # trailing axis length for raw storage; None if none
    raw: bool  # recorded in __metadata__


def known_dtype_name(dtype: np.dtype) -> str | None:
    """The name under which `dtype` is in `KNOWN_DTYPES`, if it is (any byte order)."""
    known = KNOWN_DTYPES.get(dtype.name)
    if known is None:
        return None
    if known == dtype or (dtype.byteorder in "<>" and known == dtype.newbyteorder("=")):
        return dtype.name
    return None


def storage_of(name: str) -> Storage:
    st_name = _SAFETENSORS_NAMES.get(name)
    if st_name is not None:
        return Storage(st_name, None, raw=False)
    if name == "complex128":
        return Storage("F64", 2, raw=True)
    itemsize = KNOWN_DTYPES[name].itemsize
    return Storage("U8", itemsize if itemsize > 1 else None, raw=True)


def little_endian(dtype: np.dtype) -> np.dtype:
    # Only numpy's own multi-byte types have a byte order to choose; ml_dtypes are
    # native, which is little-endian on every platform JAX runs on.
    if (
        dtype.byteorder in "=<>"
        and dtype.itemsize > 1
        and dtype.name in _NUMPY_DTYPE_NAMES
    ):
        return dtype.newbyteorder("<")
    return dtype


def show(key: str) -> str:
    """A key path for a message: a file's keys can be any length, and hold what no
    terminal prints (a lone surrogate, valid in JSON, is escaped as `\\ud800`)."""
    if not key:
        return "<root>"  # the key path of a tree that is a single array
    key = key.encode("utf-8", "backslashreplace").decode("utf-8")
    return key if len(key) <= 200 else f"{key[:180]}...({len(key)} chars)"


def describe(dtype: np.dtype | str, shape: tuple[int, ...]) -> str:
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    return f"{name}[{','.join(map(str, shape))}]"


def clip(value: Any, limit: int = 100) -> str:
    """`repr(value)`, shortened: messages quote values read from hostile files."""
    text = repr(value).encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else f"{text[: limit - 20]}...({len(text)} chars)"


def invalid_bytes_message(key: str, array: np.ndarray) -> str | None:
    """Why `array`'s bytes are no valid values of its dtype, if they are not.

    Only bool can be wrong in a way that goes unnoticed: numpy and XLA read a byte 2 as
    True in one operation and as 2 in another (`sum`), so such a file would load as
    silently wrong values.
    """
    if array.dtype != np.bool_ or array.size == 0:
        return None
    as_bytes = array.reshape(-1).view(np.uint8)
    bad = np.flatnonzero(as_bytes > 1)
    if not bad.size:
        return None
    return (
        f"{show(key)}: bool tensor holds bytes other than 0 and 1 ({bad.size} of "
        f"{array.size}; byte {int(as_bytes[bad[0]])} at element {int(bad[0])}). The "
        "file is corrupt; nothing was loaded"
    )


# --------------------------------------------------------------------------- writing


@dataclasses.dataclass(frozen=True)
class Planned:
    """One array to write: its key, numpy dtype name and shape."""

    key: str
    dtype_name: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * KNOWN_DTYPES[self.dtype_name].itemsize


def encode_header(arrays: list[Planned]) -> tuple[bytes, list[int]]:
    """The header bytes, and the indices of `arrays` in the order their bytes follow.

    Decreasing item size keeps every tensor aligned to its item size (a stable sort, so
    same-size tensors keep their natural order); the header itself lists them in natural
    order, for people reading it.
    """
    order = sorted(
        range(len(arrays)),
        key=lambda i: -min(KNOWN_DTYPES[arrays[i].dtype_name].itemsize, 8),
    )
    offsets: dict[int, list[int]] = {}
    offset = 0
    for i in order:
        offsets[i] = [offset, offset + arrays[i].nbytes]
        offset += arrays[i].nbytes
    header: dict[str, Any] = {}
    raw_dtypes = {a.key: a.dtype_name for a in arrays if storage_of(a.dtype_name).raw}
    if raw_dtypes:
        header["__metadata__"] = {METADATA_DTYPES: json.dumps(raw_dtypes)}
    for i, planned in enumerate(arrays):
        storage = storage_of(planned.dtype_name)
        extra = () if storage.extra_axis is None else (storage.extra_axis,)
        header[planned.key] = {
            "dtype": storage.name,
            "shape": list(planned.shape + extra),
            "data_offsets": offsets[i],
        }
    encoded = json.dumps(header, separators=(",", ":")).encode()
    return encoded + b" " * (-len(encoded) % 8), order


def file_writer(
    planned: list[Planned], arrays: list[Any]
) -> Callable[[BinaryIO], None]:
    """The writer of the file holding `arrays`, the array of each entry of `planned`:
    the header length, the header, then the tensors' bytes in the order the header
    gives. The header is encoded here, once, however often the writer runs."""
    header, order = encode_header(planned)

    def write(f: BinaryIO) -> None:
        f.write(len(header).to_bytes(_LENGTH_BYTES, "little"))
        f.write(header)
        for i in order:
            _write_tensor(f, planned[i].key, arrays[i], planned[i].nbytes)

    return write


def _write_tensor(f: BinaryIO, key: str, leaf: Any, nbytes: int) -> None:
    """Writes the `nbytes` bytes of `leaf` as the file stores a tensor: little-endian,
    C order, packed."""
    # One array on the host at a time: a device array is copied here, then dropped.
    array = np.asarray(leaf)
    if array.dtype.byteorder == ">" or (
        array.dtype.byteorder == "=" and not LITTLE_ENDIAN_HOST
    ):
        array = array.astype(little_endian(array.dtype))
    flat = np.ascontiguousarray(array).reshape(-1)
    if flat.nbytes != nbytes:
        raise CheckpointError(
            f"{show(key)} changed size while being saved ({nbytes} bytes "
            f"planned, {flat.nbytes} found)."
        )
    if nbytes:
        f.write(flat.view(np.uint8).data)


# --------------------------------------------------------------------------- bytes


def require_binary(file: Any, mode: str) -> None:
    """Refuses a text-mode file object, which would fail later with a confusing
    UnicodeDecodeError (reading) or TypeError (writing)."""
    file_mode = getattr(file, "mode", "")
    if isinstance(file, io.TextIOBase) or (
        isinstance(file_mode, str) and file_mode and "b" not in file_mode
    ):
        raise TypeError(
            f"the file object is open in text mode ({file_mode or type(file).__name__}"
            f"); checkpoints are binary. Open it with open(path, {mode!r})."
        )


class Source:
    """Random access to the bytes of a checkpoint, relative to where it starts."""

    def __init__(self, file: BinaryIO, name: str) -> None:
        require_binary(file, "rb")
        self.file = file
        self.name = name
        try:
            self.start = file.tell()
            self.size = file.seek(0, io.SEEK_END) - self.start
        except (AttributeError, OSError, io.UnsupportedOperation) as err:
            raise CheckpointError(
                f"{name} is not seekable ({err}); loading needs random access. Read "
                "it into an io.BytesIO first."
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

    def read(self, offset: int, size: int, what: str) -> bytearray:
        """Reads `size` bytes, which the caller has checked the file has (a bytearray,
        so that a large header is not copied once more into a bytes object)."""
        data = bytearray(size)
        self.read_into(offset, memoryview(data), what)
        return data

    def seek_end(self) -> None:
        self.file.seek(self.start + self.size)


@contextlib.contextmanager
def open_source(file: PathOrFile) -> Iterator[Source]:
    """A `Source` for a path (opened unbuffered, read straight into arrays) or for a
    seekable binary file object positioned at the checkpoint."""
    if isinstance(file, (str, bytes, os.PathLike)):
        name = os.fsdecode(os.fspath(file))
        with open(name, "rb", buffering=0) as f:
            yield Source(f, repr(name))
    else:
        yield Source(file, "the file object")


# --------------------------------------------------------------------------- reading


@dataclasses.dataclass(frozen=True)
class Tensor:
    """A tensor of the file as it loads: its bytes are checked to fit the data section,
    so only where they start is kept."""

    key: str
    dtype: np.dtype  # the array's dtype after loading
    shape: tuple[int, ...]  # the array's shape after loading
    begin: int  # where its bytes start in the data section


@dataclasses.dataclass(frozen=True)
class Header:
    """What `read_header` found: the wanted tensors, and the others by count."""

    tensors: dict[str, Tensor]  # the wanted tensors the file has
    unwanted: tuple[Tensor, ...]  # the first MAX_LISTED other tensors
    unwanted_count: int  # all other tensors; an estimate when not `complete`
    complete: bool  # False when reading stopped early (too many others)
    data_start: int  # where the data section starts in the source


def read_header(
    source: Source, wanted: Collection[str], max_unwanted: int | None
) -> Header:
    """Reads and checks the header length and the header, parsing entries only as far
    as needed.

    `max_unwanted`: `None` stops once more than `MAX_LISTED` tensors outside `wanted`
    were met (the load will fail anyway; the rest is only counted); a number is a hard
    limit on such tensors, beyond which the file is refused.
    """
    if source.size < _LENGTH_BYTES:
        raise CheckpointError(
            f"{source.name} is not a valid safetensors file: it has {source.size} "
            f"bytes, fewer than the {_LENGTH_BYTES}-byte header length. The file is "
            "truncated or empty."
        )
    length = source.read(0, _LENGTH_BYTES, "the header length")
    header_len = int.from_bytes(length, "little")
    if header_len > MAX_HEADER_BYTES:
        raise CheckpointError(
            f"{source.name} is not a valid safetensors file: its header claims "
            f"{header_len} bytes, over the {MAX_HEADER_BYTES}-byte limit. It is "
            "corrupt or not a safetensors file."
        )
    data_start = _LENGTH_BYTES + header_len
    if data_start > source.size:
        raise CheckpointError(
            f"{source.name} is not a valid safetensors file: its header claims "
            f"{header_len} bytes but only {source.size - _LENGTH_BYTES} follow. The "
            "file is truncated or corrupt."
        )
    raw = source.read(_LENGTH_BYTES, header_len, "the header")
    parser = _HeaderParser(raw, data_start, source.size, source.name, wanted)
    return parser.parse(max_unwanted)


# Tokens of the header's JSON, matched on its bytes so that the header is never decoded
# or parsed as a whole: one entry at a time, each of bounded size.
_WS = rb"[ \t\n\r]*"
_STRING = rb'"[^"\\\x00-\x1f]*(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})[^"\\\x00-\x1f]*)*"'
_OPEN = re.compile(_WS + rb"\{" + _WS)
_NEXT = re.compile(_WS + rb"([,}])" + _WS)
_KEY = re.compile(rb"(" + _STRING + rb")" + _WS + rb":" + _WS)
_STRING_TOKEN = re.compile(_STRING)
_NOT_BLANK = re.compile(rb"[^ \t\n\r]")
# A tensor entry: an object without nested objects (shape and offsets are lists).
_ENTRY = re.compile(rb'\{[^{}"]*(?:' + _STRING + rb'[^{}"]*)*\}')
# The same as safetensors and `save` write it, parsed without the JSON decoder (a
# partial load may parse tens of thousands of entries it does not need).
_INT = rb"(?:0|[1-9][0-9]{0,18})"
_CANONICAL_ENTRY = re.compile(
    rb'\{' + _WS + rb'"dtype"' + _WS + rb":" + _WS + rb'"([A-Z0-9_]{1,16})"' + _WS
    + rb"," + _WS + rb'"shape"' + _WS + rb":" + _WS + rb"\[" + _WS
    + rb"((?:" + _INT + _WS + rb"," + _WS + rb"){0,63}" + _INT + rb")?" + _WS + rb"\]"
    + _WS + rb"," + _WS + rb'"data_offsets"' + _WS + rb":" + _WS + rb"\[" + _WS
    + rb"(" + _INT + rb")" + _WS + rb"," + _WS + rb"(" + _INT + rb")" + _WS + rb"\]"
    + _WS + rb"\}"
)  # fmt: skip


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"the key {clip(key)} appears twice")
            seen.add(key)
    return out


_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicates)

Corrupt = Callable[[str], CheckpointError]


def _is_int(x: Any) -> bool:
    return type(x) is int  # not bool, not float


def _json_string(token: bytes | bytearray, corrupt: Corrupt) -> str:
    """The value of a JSON string token (already matched by `_STRING`)."""
    try:
        if b"\\" not in token:  # the common case, without the JSON decoder
            return token[1:-1].decode("utf-8")
        return _DECODER.decode(token.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise corrupt(f"its header has an invalid JSON string ({err})") from None


def _json_value(raw: bytearray, begin: int, end: int, corrupt: Corrupt) -> Any:
    try:
        return _DECODER.decode(raw[begin:end].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise corrupt(f"its header is not valid JSON ({err})") from None


def _string_members(
    text: bytes | bytearray, start: int, limit: int, corrupt: Corrupt, what: str
) -> tuple[list[tuple[str, int, int]], int]:
    """The members of the JSON object of strings at `text[start:]`, as (key, value
    start, value end), and where the object ends; more than `limit` are refused."""
    m = _OPEN.match(text, start)
    if m is None:
        raise corrupt(f"{what} is not a JSON object of strings")
    members: list[tuple[str, int, int]] = []
    pos = m.end()
    if text[pos : pos + 1] == b"}":
        return members, pos + 1
    while True:
        key_m = _KEY.match(text, pos)
        value_m = _STRING_TOKEN.match(text, key_m.end()) if key_m else None
        next_m = _NEXT.match(text, value_m.end()) if value_m else None
        if key_m is None or value_m is None or next_m is None:
            raise corrupt(f"{what} is not a JSON object of strings (at byte {pos})")
        if len(members) == limit:
            raise corrupt(f"{what} has more than {limit} entries")
        key = _json_string(key_m.group(1), corrupt)
        members.append((key, value_m.start(), value_m.end()))
        pos = next_m.end()
        if next_m.group(1) == b"}":
            return members, next_m.start(1) + 1


def _entry_members(entry: Any, corrupt: Corrupt) -> tuple[Any, Any, Any]:
    """The dtype, shape and data_offsets of a parsed tensor entry."""
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise corrupt("is not an object with dtype, shape and data_offsets")
    return entry["dtype"], entry["shape"], entry["data_offsets"]


def _checked_entry(
    st_name: Any, shape: Any, offsets: Any, data_len: int, corrupt: Corrupt
) -> tuple[str, tuple[int, ...], int, int]:
    """A tensor entry's safetensors dtype, stored shape and byte offsets, checked."""
    st_dtype = FROM_SAFETENSORS.get(st_name) if isinstance(st_name, str) else None
    if st_dtype is None:
        raise corrupt(
            f"has dtype {clip(st_name)}, which this library does not read "
            f"(known: {', '.join(sorted(FROM_SAFETENSORS))})"
        )
    if (
        not isinstance(shape, list)
        or len(shape) > _MAX_NDIM
        or not all(_is_int(d) and d >= 0 for d in shape)
    ):
        raise corrupt(
            f"has shape {clip(shape)}; expected at most {_MAX_NDIM} non-negative "
            "integers"
        )
    shape = tuple(shape)
    # Bounded so that numpy can represent it, even when some dimension is zero.
    if math.prod(max(d, 1) for d in shape) * st_dtype.itemsize >= 2**63:
        raise corrupt(f"has shape {shape}, which is too large for any array")
    if not (
        isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_int, offsets))
    ):
        raise corrupt(f"has data_offsets {clip(offsets)}; expected [begin, end]")
    begin, end = offsets
    if not 0 <= begin <= end:
        raise corrupt(f"has data_offsets {offsets}, which are not ordered")
    if end > data_len:
        raise corrupt(
            f"lies at bytes [{begin}, {end}) of the data, which has only {data_len} "
            "bytes: the file is truncated or the header is wrong"
        )
    nbytes = math.prod(shape) * st_dtype.itemsize
    if end - begin != nbytes:
        raise corrupt(
            f"is {describe(st_dtype, shape)} ({nbytes} bytes) but its data_offsets "
            f"span {end - begin} bytes"
        )
    return st_name, shape, begin, end


def _loaded_tensor(
    key: str, st_name: str, shape: tuple[int, ...], begin: int,
    raw_dtype: str | None, corrupt: Corrupt,
) -> Tensor:  # fmt: skip
    """The tensor as loaded: a raw-stored dtype restored from `__metadata__`."""
    if raw_dtype is None:
        return Tensor(key, FROM_SAFETENSORS[st_name], shape, begin)
    true = KNOWN_DTYPES.get(raw_dtype)
    if true is None:
        raise corrupt(
            f"tensor {clip(key)} has the unknown numpy dtype {clip(raw_dtype)} in "
            "__metadata__"
        )
    storage = storage_of(raw_dtype)
    if storage.name != st_name or (
        storage.extra_axis is not None
        and (not shape or shape[-1] != storage.extra_axis)
    ):
        raise corrupt(
            f"tensor {clip(key)} is {describe(st_name, shape)}, which cannot hold "
            f"{raw_dtype} data"
        )
    if storage.extra_axis is not None:
        shape = shape[:-1]
    return Tensor(key, true, shape, begin)


# A checked tensor entry: its safetensors dtype, stored shape and where its bytes start.
_Entry = tuple[str, tuple[int, ...], int]


class _HeaderParser:
    """Walks the top-level JSON object of a safetensors header, entry by entry."""

    def __init__(
        self,
        raw: bytearray,
        data_start: int,
        size: int,
        name: str,
        wanted: Collection[str],
    ) -> None:
        self.raw, self.name, self.wanted = raw, name, wanted
        self.data_start, self.data_len = data_start, size - data_start
        self.found: dict[str, _Entry] = {}
        self.listed: dict[str, _Entry] = {}
        self.unwanted_count = 0
        # Begin, end and key position of every tensor, for the tiling check.
        self.spans = array.array("q")
        self.raw_dtypes_at: tuple[int, int] | None = None
        self.seen_metadata = False

    def corrupt(self, why: str) -> CheckpointError:
        return CheckpointError(f"{self.name} is not a valid safetensors file: {why}.")

    def parse(self, max_unwanted: int | None) -> Header:
        m = _OPEN.match(self.raw)
        if m is None:
            raise self.corrupt("its header is not valid JSON (not a JSON object)")
        pos, done = m.end(), self.raw[m.end() : m.end() + 1] == b"}"
        if done:
            pos += 1
        while not done:
            if max_unwanted is None and self.unwanted_count > MAX_LISTED:
                # Only counted: the load fails anyway, and the message needs a number.
                self.unwanted_count += self.raw.count(b'"data_offsets"', pos)
                listed = self._loaded(self.listed, {})
                return self._header({}, listed, complete=False)
            pos, done = self._member(pos, max_unwanted)
        if _NOT_BLANK.search(self.raw, pos):
            raise self.corrupt(f"its header has data after the JSON object ({pos})")
        self._check_tiling()
        raw_dtypes = self._raw_dtypes()
        tensors = self._loaded(self.found, raw_dtypes)
        listed = self._loaded(self.listed, raw_dtypes)
        return self._header(tensors, listed, complete=True)

    def _header(
        self, tensors: dict[str, Tensor], listed: dict[str, Tensor], complete: bool
    ) -> Header:
        unwanted = tuple(listed.values())
        return Header(tensors, unwanted, self.unwanted_count, complete, self.data_start)

    def _member(self, pos: int, max_unwanted: int | None) -> tuple[int, bool]:
        """Parses one `"key": value` at `pos`; returns where the next starts, and
        whether the object ended."""
        key_m = _KEY.match(self.raw, pos)
        if key_m is None:
            raise self.corrupt(f"its header is not valid JSON (at byte {pos})")
        key = _json_string(key_m.group(1), self.corrupt)
        if key == "__metadata__":
            end = self._metadata(key_m.end())
        else:
            end = self._tensor(key, pos, key_m.end(), max_unwanted)
        next_m = _NEXT.match(self.raw, end)
        if next_m is None:
            raise self.corrupt(f"its header is not valid JSON (at byte {end})")
        if next_m.group(1) == b"}":
            return next_m.start(1) + 1, True
        return next_m.end(), False

    def _metadata(self, at: int) -> int:
        if self.seen_metadata:
            raise self.corrupt("its header is not valid JSON (the key '__metadata__' "
                               "appears twice)")  # fmt: skip
        self.seen_metadata = True
        members, end = _string_members(
            self.raw, at, MAX_METADATA_ENTRIES, self.corrupt, "__metadata__"
        )
        for key, begin, value_end in members:
            if key == METADATA_DTYPES:
                if self.raw_dtypes_at is not None:
                    raise self.corrupt(f"__metadata__ has {key!r} twice")
                self.raw_dtypes_at = (begin, value_end)
        return end

    def _tensor(self, key: str, key_at: int, at: int, max_unwanted: int | None) -> int:
        def corrupt(why: str) -> CheckpointError:
            return self.corrupt(f"tensor {clip(key)} {why}")

        m = _CANONICAL_ENTRY.match(self.raw, at)
        if m is not None:  # as safetensors and `save` write it: no JSON decoder
            st_name, dims, begin, end = m.groups()
            shape = [int(d) for d in dims.split(b",")] if dims else []
            offsets = [int(begin), int(end)]
            values = (st_name.decode("ascii"), shape, offsets)
        else:
            m = _ENTRY.match(self.raw, at, min(len(self.raw), at + MAX_ENTRY_BYTES))
            if m is None:
                raise corrupt(
                    "is not an object with dtype, shape and data_offsets (of at most "
                    f"{MAX_ENTRY_BYTES} bytes)"
                )
            entry = _json_value(self.raw, at, m.end(), self.corrupt)
            values = _entry_members(entry, corrupt)
        st_name, shape, begin, end = _checked_entry(*values, self.data_len, corrupt)
        self.spans.extend((begin, end, key_at))
        if key in self.found or key in self.listed:
            raise self.corrupt(f"the key {clip(key)} appears twice")
        if key in self.wanted:
            self.found[key] = (st_name, shape, begin)
        else:
            self.unwanted_count += 1
            if len(self.listed) < MAX_LISTED:
                self.listed[key] = (st_name, shape, begin)
            if max_unwanted is not None and self.unwanted_count > max_unwanted:
                raise self.corrupt(
                    f"it has more than {max_unwanted} tensors that the template does "
                    "not need, which is more than a partial load reads. Load it into "
                    "a template of the whole saved model"
                )
        return m.end()

    def _key_at(self, position: int) -> str:
        key_m = _KEY.match(self.raw, position)
        assert key_m is not None  # parsed before
        return _json_string(key_m.group(1), self.corrupt)

    def _check_tiling(self) -> None:
        # The tensors must tile the data section exactly, as safetensors requires: no
        # overlaps (two names sharing bytes), no gaps, nothing after the last one.
        spans = np.frombuffer(self.spans, np.int64).reshape(-1, 3)
        spans = spans[np.lexsort((spans[:, 1], spans[:, 0]))]
        ends = np.concatenate(([0], spans[:, 1]))
        overlap = np.flatnonzero(spans[:, 0] < ends[:-1])
        gap = np.flatnonzero(spans[:, 0] > ends[:-1])
        if overlap.size and (not gap.size or overlap[0] < gap[0]):
            i = int(overlap[0])
            first, second = self._key_at(spans[i - 1, 2]), self._key_at(spans[i, 2])
            raise self.corrupt(f"tensors {clip(first)} and {clip(second)} overlap")
        if gap.size:
            i = int(gap[0])
            raise self.corrupt(
                f"bytes [{ends[i]}, {spans[i, 0]}) of the data belong to no tensor"
            )
        if ends[-1] != self.data_len:
            raise self.corrupt(
                f"the last {self.data_len - ends[-1]} bytes belong to no tensor"
            )

    def _raw_dtypes(self) -> dict[str, str]:
        if self.raw_dtypes_at is None:
            return {}
        what = f"__metadata__[{METADATA_DTYPES!r}]"
        text = _json_string(self.raw[slice(*self.raw_dtypes_at)], self.corrupt)
        if not text.isascii():  # json.dumps, which wrote it, escapes everything else
            raise self.corrupt(f"{what} is not ASCII JSON")
        data = text.encode("ascii")
        del text
        limit = len(self.found) + self.unwanted_count
        members, end = _string_members(data, 0, limit, self.corrupt, what)
        if _NOT_BLANK.search(data, end):
            raise self.corrupt(f"{what} is not a JSON object of strings")
        known_all = self.unwanted_count == len(self.listed)
        out = {}
        for key, begin, value_end in members:
            if known_all and key not in self.found and key not in self.listed:
                raise self.corrupt(
                    f"__metadata__ names a dtype for {clip(key)}, which is not a tensor"
                )
            out[key] = _json_string(data[begin:value_end], self.corrupt)
        return out

    def _loaded(
        self,
        entries: dict[str, _Entry],
        raw_dtypes: dict[str, str],
    ) -> dict[str, Tensor]:
        return {
            key: _loaded_tensor(
                key, st_name, shape, begin, raw_dtypes.get(key), self.corrupt
            )
            for key, (st_name, shape, begin) in entries.items()
        }
