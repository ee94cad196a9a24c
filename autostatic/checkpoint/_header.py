"""Reading a safetensors header: its length and its JSON, every field checked.

Reading assumes a hostile file: nothing is executed, every size is checked against the
file before anything is allocated, and the header is parsed one entry at a time so that
the work is bounded by the tensors the caller needs, not by what the file claims.
"""

import array
import dataclasses
import json
import math
import re
from collections.abc import Callable, Collection
from typing import Any

import numpy as np

from ._dtypes import FROM_SAFETENSORS, KNOWN_DTYPES, METADATA_DTYPES, storage_of
from ._errors import CheckpointError, clip, describe
from ._source import Source

MAX_HEADER_BYTES = 100 * 1024 * 1024  # safetensors' own limit
MAX_ENTRY_BYTES = 16 * 1024  # 64 dimensions of 20 digits, pretty-printed, fit easily
MAX_METADATA_ENTRIES = 1024
MAX_LISTED = 32  # keys named in one error message; the rest are counted
LENGTH_BYTES = 8  # the header length that starts a file: unsigned, little-endian
_MAX_NDIM = 64  # numpy's own limit


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
    if source.size < LENGTH_BYTES:
        raise CheckpointError(
            f"{source.name} is not a valid safetensors file: it has {source.size} "
            f"bytes, fewer than the {LENGTH_BYTES}-byte header length. The file is "
            "truncated or empty."
        )
    length = source.read(0, LENGTH_BYTES, "the header length")
    header_len = int.from_bytes(length, "little")
    if header_len > MAX_HEADER_BYTES:
        raise CheckpointError(
            f"{source.name} is not a valid safetensors file: its header claims "
            f"{header_len} bytes, over the {MAX_HEADER_BYTES}-byte limit. It is "
            "corrupt or not a safetensors file."
        )
    data_start = LENGTH_BYTES + header_len
    if data_start > source.size:
        raise CheckpointError(
            f"{source.name} is not a valid safetensors file: its header claims "
            f"{header_len} bytes but only {source.size - LENGTH_BYTES} follow. The "
            "file is truncated or corrupt."
        )
    raw = source.read(LENGTH_BYTES, header_len, "the header")
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
