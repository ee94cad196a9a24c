"""Reading Equinox's own files (`eqx.tree_serialise_leaves`): `load_eqx`.

Equinox writes one `.npy` blob per leaf in depth-first order, Python bool/int/float/
complex values included, and names nothing. An AutoModule keeps those Python values
static, and the `eqx.Module` that wrote the file may have marked some of them
`eqx.field(static=True)`, which Equinox then did not write. So the blobs are aligned to
the template's full leaf order (static values included) by a small dynamic program in
which a stored Python value may be absent: every shape, dtype and stored value is
checked, and a file that fits in two ways that load different arrays is refused, never
guessed.
"""

import dataclasses
import io
import math
import os
import pathlib
from collections.abc import Callable
from typing import Any

import jax.tree_util as jtu
import numpy as np

from .._compat import saved_by_tree_serialise_leaves
from ..core._exposed import expose
from ..core._leaves import is_dynamic_leaf
from ._errors import CheckpointError, describe, show
from ._loading import (
    format_problems,
    InFlight,
    jax_dtype_problem,
    place,
    read_array,
    template_shape_dtype,
)
from ._source import open_source, PathOrFile, Source

_NPY_MAGIC = b"\x93NUMPY"
_MAX_NPY_HEADER = 10_000  # numpy's own default limit for a header it parses


@dataclasses.dataclass(frozen=True)
class _Blob:
    """One `.npy` blob of the file, read up to its data."""

    index: int
    offset: int  # where its header starts, relative to the checkpoint
    data: int  # where its data starts
    shape: tuple[int, ...]
    fortran: bool
    dtype: np.dtype
    value: np.ndarray | None  # the value of a 0-d blob, read with the header

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def describe(self) -> str:
        return describe(self.dtype, self.shape)


@dataclasses.dataclass(frozen=True)
class _Slot:
    """A template leaf that Equinox writes: an array (`required`), or a value that is
    static here and may have been static in the saved model too."""

    key: str
    leaf: Any
    required: bool
    shape: tuple[int, ...]
    dtype: np.dtype
    kinds: str = ""  # for a Python scalar: the dtype kinds that can store it
    # A Python scalar that is a leaf of the template itself (a field annotated to
    # hold arrays: a step counter): always saved, and its stored value is loaded.
    loads_value: bool = False


_SCALAR_KINDS = ((bool, "b"), (int, "iu"), (float, "f"), (complex, "c"))


def _scalar_kinds(value: Any) -> str | None:
    for kind, letters in _SCALAR_KINDS:
        if isinstance(value, kind):
            return letters
    return None


def _slots(like: Any) -> list[_Slot]:
    """The template's leaves that Equinox writes, in its order: `expose` makes every
    AutoModule field a child again, except those declared `eqx.field(static=True)`,
    which Equinox does not write either."""
    slots: list[_Slot] = []
    arrays: set[str] = set()  # filled by key path, so keys must be unique
    scalar_leaves = {
        jtu.keystr(path)
        for path, leaf in jtu.tree_flatten_with_path(like)[0]
        if _scalar_kinds(leaf) is not None
    }
    exposed = expose(like, keep_declared_static=True)
    for path, leaf in jtu.tree_flatten_with_path(exposed)[0]:
        key = jtu.keystr(path)
        if is_dynamic_leaf(leaf):
            if key in arrays:
                raise CheckpointError(
                    f"two array leaves of the template have the key path {key!r}; "
                    "keys must be unique to fill the template."
                )
            arrays.add(key)
            shape, dtype = template_shape_dtype(key, leaf, known_only=False)
            slots.append(_Slot(key, leaf, True, shape, dtype))
        elif (kinds := _scalar_kinds(leaf)) is not None:
            loads = key in scalar_leaves
            dtype = np.asarray(leaf).dtype
            slots.append(_Slot(key, leaf, loads, (), dtype, kinds, loads_value=loads))
        elif saved_by_tree_serialise_leaves(leaf):  # e.g. an object with __jax_array__
            expected = np.asarray(leaf)
            slots.append(_Slot(key, expected, False, expected.shape, expected.dtype))
    return slots


# --------------------------------------------------------------------------- blobs


class _Blobs:
    """Reads the `.npy` headers of the file, then blob data on request."""

    def __init__(self, source: Source, limit: int) -> None:
        self.source = source
        self.blobs: list[_Blob] = []
        pos = 0
        while pos < source.size:
            if len(self.blobs) == limit:
                raise CheckpointError(
                    f"{source.name}: {source.size - pos} bytes are left after the "
                    f"{limit} blobs that the template can account for. The file was "
                    "saved from a model with more leaves than this template; nothing "
                    "was loaded."
                )
            blob = self._header(pos, len(self.blobs))
            self.blobs.append(blob)
            pos = blob.data + blob.nbytes

    def fail(self, index: int, offset: int, why: str) -> CheckpointError:
        return CheckpointError(
            f"{self.source.name}, blob #{index} (byte {offset}): {why}. The file is "
            "not one that eqx.tree_serialise_leaves wrote, or it is corrupt; nothing "
            "was loaded."
        )

    def _header(self, offset: int, index: int) -> _Blob:
        left = self.source.size - offset
        prefix = self.source.read(offset, min(12, left), "a .npy header")
        if len(prefix) < 10 or not prefix.startswith(_NPY_MAGIC):
            raise self.fail(index, offset, "no .npy header here")
        version = (prefix[6], prefix[7])
        if version not in ((1, 0), (2, 0)):
            raise self.fail(index, offset, f".npy format version {version} is unknown")
        size_bytes = 2 if version == (1, 0) else 4
        header_len = int.from_bytes(prefix[8 : 8 + size_bytes], "little")
        data = offset + 8 + size_bytes + header_len
        if header_len > _MAX_NPY_HEADER or data > self.source.size:
            raise self.fail(index, offset, f"its header claims {header_len} bytes")
        text = self.source.read(offset + 8, size_bytes + header_len, "a .npy header")
        shape, fortran, dtype = self._parse(index, offset, version, text)
        blob = _Blob(index, offset, data, shape, fortran, dtype, None)
        left = self.source.size - data
        if blob.nbytes > left:
            raise self.fail(
                index,
                offset,
                f"the blob needs {blob.nbytes} bytes but only {left} are left: the "
                "file is truncated",
            )
        if shape == ():
            value = np.frombuffer(
                self.source.read(data, dtype.itemsize, "a value"), dtype
            )
            blob = dataclasses.replace(blob, value=value.reshape(()))
        return blob

    def _parse(
        self, index: int, offset: int, version: tuple[int, int], text: bytearray
    ) -> tuple[tuple[int, ...], bool, np.dtype]:
        read = (
            np.lib.format.read_array_header_1_0
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0
        )
        try:
            shape, fortran, dtype = read(io.BytesIO(text))
        # numpy parses the header with ast.literal_eval; whatever a hostile header makes
        # it raise (ValueError, SyntaxError, tokenize.TokenError, RecursionError, ...)
        # means the same: this is no valid blob.
        except Exception as err:
            raise self.fail(index, offset, f"invalid .npy header ({err!r})") from None
        if not (
            isinstance(shape, tuple)
            and all(type(d) is int and d >= 0 for d in shape)
            and isinstance(fortran, bool)
        ):
            raise self.fail(index, offset, f"invalid .npy shape {shape!r}")
        if dtype.itemsize == 0 or dtype.subdtype is not None:
            raise self.fail(index, offset, f"its dtype {dtype} holds no array data")
        if dtype.hasobject:
            raise self.fail(
                index,
                offset,
                f"the blob holds Python objects ({dtype}), which would need "
                "pickle; it is never unpickled",
            )
        return tuple(shape), fortran, dtype

    def array(self, blob: _Blob, key: str, dtype: np.dtype) -> np.ndarray:
        """The blob's data as an array of `dtype` (checked by `_read_dtype_for`)."""
        shape = blob.shape[::-1] if blob.fortran else blob.shape
        array = read_array(self.source, blob.data, shape, blob.dtype, key)
        if blob.fortran:
            array = array.transpose()
        if array.dtype == dtype:
            return array
        if array.dtype.kind == "V":
            return array.view(dtype)  # the same bytes, now with their meaning
        return array.astype(dtype)


def _read_dtype_for(stored: np.dtype, expected: np.dtype) -> bool:
    """Whether a blob of dtype `stored` can be read as `expected`."""
    if stored == expected:
        return True
    # np.save writes ml_dtypes arrays (bfloat16, float8, int4, ...) as void
    # ('|V2', '|V1'): same bytes, re-viewed from the template's dtype.
    if (
        stored.kind == "V"
        and stored.fields is None
        and stored.subdtype is None
        and stored.itemsize == expected.itemsize
        and expected.kind in "VW"
    ):
        return True
    return stored.byteorder in "<>" and stored.newbyteorder("=") == expected


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


def _fits(slot: _Slot, blob: _Blob, blobs: _Blobs, values: bool) -> bool:
    """Whether `blob` can be the template leaf `slot`; `values=False` ignores the
    stored values of static leaves (to explain a failed alignment)."""
    if slot.kinds:  # a Python scalar, whose dtype Equinox chose (int32 or int64)
        if blob.value is None:
            return False
        if not values:  # a value of another kind (1 for True) differs in value
            return True
        if blob.dtype.kind not in slot.kinds:
            return False
        return slot.loads_value or _same_value(blob.value, slot.leaf)
    if blob.shape != slot.shape or not _read_dtype_for(blob.dtype, slot.dtype):
        return False
    if slot.required or not values:
        return True
    stored = blobs.array(blob, slot.key, slot.dtype)
    return stored.tobytes() == slot.leaf.tobytes()


# --------------------------------------------------------------------------- alignment

# A bound on the states of the alignment, far above what real models need (a state per
# leaf, a few more around runs of stored Python values), so that no file can make the
# search itself expensive.
_MAX_STATES = 1_000_000


@dataclasses.dataclass(frozen=True)
class _Alignment:
    matched: dict[int, int]  # slot -> blob, preferring to match stored values
    ambiguous: list[int]  # slots that other full alignments treat differently


def _align(
    slots: list[_Slot], n_blobs: int, fits: Callable[[int, int], bool]
) -> _Alignment | tuple[int, set[int]]:
    """Aligns blobs to slots in order: each required slot takes one blob, an optional
    slot takes one or none, and every blob is taken. Returns the alignment, or where
    every partial alignment stopped: a slot index and the blobs reached there.

    `reach[i]` holds the blob positions that some alignment of the first `i` slots
    reaches; `alive[i]` those of them from which the rest of the file can be aligned.
    """
    reach: list[set[int]] = [{0}]
    states = 0
    for i, slot in enumerate(slots):
        after = {j for j in reach[i] if not slot.required}
        after |= {j + 1 for j in reach[i] if j < n_blobs and fits(i, j)}
        if not after:
            return i, reach[i]
        states += len(after)
        if states > _MAX_STATES:
            raise CheckpointError(
                f"the file can be aligned to the template in too many ways (over "
                f"{_MAX_STATES} partial alignments); load it into the eqx.Module it "
                "was saved from with eqx.tree_deserialise_leaves"
            )
        reach.append(after)
    if n_blobs not in reach[-1]:
        return len(slots), reach[-1]
    alive: list[set[int]] = [set() for _ in reach]
    alive[-1] = {n_blobs}
    choices: list[set[int | None]] = [set() for _ in slots]
    for i in reversed(range(len(slots))):
        for j in reach[i]:
            if not slots[i].required and j in alive[i + 1]:
                alive[i].add(j)
                choices[i].add(None)
            if j + 1 in alive[i + 1] and fits(i, j):
                alive[i].add(j)
                choices[i].add(j)
    matched, j = {}, 0
    for i in range(len(slots)):
        if j + 1 in alive[i + 1] and fits(i, j):
            matched[i] = j
            j += 1
    ambiguous = [i for i, options in enumerate(choices) if len(options) > 1]
    return _Alignment(matched, ambiguous)


def _place_blobs(slots: list[_Slot], blobs: _Blobs, name: str) -> dict[int, int]:
    """Which blob each slot takes; raises with the reason if there is no single one."""
    cache: dict[tuple[int, int, bool], bool] = {}

    def fits(values: bool) -> Callable[[int, int], bool]:
        def fit(i: int, j: int) -> bool:
            if (i, j, values) not in cache:
                cache[i, j, values] = _fits(slots[i], blobs.blobs[j], blobs, values)
            return cache[i, j, values]

        return fit

    found = _align(slots, len(blobs.blobs), fits(True))
    if isinstance(found, _Alignment):
        if any(slots[i].required for i in found.ambiguous):
            raise _ambiguous(slots, found.ambiguous, name)
        return found.matched
    relaxed = _align(slots, len(blobs.blobs), fits(False))
    if isinstance(relaxed, _Alignment):
        raise _values_differ(slots, blobs, relaxed.matched, fits(True), name)
    raise _no_fit(slots, blobs, *relaxed, name)


def _leaf_error(name: str, key: str, blob: _Blob | None, why: str, hint: str) -> str:
    where = f" (blob #{blob.index}, byte {blob.offset})" if blob else ""
    return f"{name}, leaf {show(key)}{where}: {why}. {hint}; nothing was loaded."


def _no_fit(
    slots: list[_Slot], blobs: _Blobs, i: int, reached: set[int], name: str
) -> CheckpointError:
    """Where the structure stops fitting, seen from the alignment that got furthest."""
    j = max(reached)
    hint = (
        "The file was not saved from a model with the structure of this template "
        "(or is corrupt)"
    )
    if i == len(slots):
        left = blobs.source.size - blobs.blobs[j].offset
        return CheckpointError(
            f"{name}: {left} bytes are left after the {j} blobs that the template "
            f"accounts for ({len(blobs.blobs) - j} more blobs). The file was saved "
            "from a model with more leaves than this template; nothing was loaded."
        )
    slot = slots[i]
    expected = repr(slot.leaf) if slot.kinds else describe(slot.dtype, slot.shape)
    if j == len(blobs.blobs):
        why = (
            f"the file ends here, but the template has more leaves that Equinox "
            f"saves (this one is {expected})"
        )
        return CheckpointError(_leaf_error(name, slot.key, None, why, hint))
    blob = blobs.blobs[j]
    why = f"the file has {blob.describe()} where the template has {expected}"
    if not slot.kinds and blob.shape == slot.shape:
        hint = (
            "Only the dtype differs: build the template with the saved dtypes (a "
            "template from `eqx.filter_eval_shape` holds a numpy float64 array as "
            "JAX's float32; call the model's constructor instead)"
        )
    return CheckpointError(_leaf_error(name, slot.key, blob, why, hint))


def _values_differ(
    slots: list[_Slot],
    blobs: _Blobs,
    matched: dict[int, int],
    fits: Callable[[int, int], bool],
    name: str,
) -> CheckpointError:
    """The stored values that differ from the template's static values, along the
    alignment that ignores values."""
    problems = []
    for i, j in matched.items():
        if not fits(i, j):
            slot, blob = slots[i], blobs.blobs[j]
            stored = blob.value.item() if blob.value is not None else blob.describe()
            problems.append(
                f"leaf {show(slot.key)} (blob #{j}, byte {blob.offset}): the file "
                f"stores {stored!r} where the template has the static value "
                f"{slot.leaf!r}"
            )
    return CheckpointError(
        format_problems(
            name,
            problems,
            "Build the template with the hyperparameters of the saved model; nothing "
            "was loaded.",
        )
    )


def _ambiguous(slots: list[_Slot], ambiguous: list[int], name: str) -> CheckpointError:
    keys = ", ".join(show(slots[i].key) for i in ambiguous)
    return CheckpointError(
        f"{name} fits the template in more than one way: the stored values may belong "
        f"to different leaves, which would load different arrays (ambiguous: {keys}). "
        "The file does not say which fields the saved model kept static. Load it into "
        "the eqx.Module it was saved from with eqx.tree_deserialise_leaves, then move "
        "the arrays across with save and load, which go by key path; nothing was "
        "loaded."
    )


# --------------------------------------------------------------------------- load_eqx


def _with_eqx_suffix(path: str | bytes | os.PathLike) -> pathlib.Path:
    # The rule of eqx.tree_serialise_leaves, so the same path finds the same file.
    path = pathlib.Path(os.fsdecode(os.fspath(path)))
    return path.with_suffix(".eqx") if path.suffix == "" else path


def _read(
    slots: list[_Slot],
    blobs: _Blobs,
    matched: dict[int, int],
    host: bool,
    placed: bool,
) -> dict[str, Any]:
    """The arrays of the required slots, by key, read and placed (`place`)."""
    required = [i for i, s in enumerate(slots) if s.required and not s.loads_value]
    for i in required:
        problem = jax_dtype_problem(slots[i].key, slots[i].dtype, slots[i].leaf, host)
        if problem is not None:
            raise CheckpointError(problem)
    loaded: dict[str, Any] = {}
    in_flight = InFlight()
    for i in required:
        slot, blob = slots[i], blobs.blobs[matched[i]]
        array = blobs.array(blob, slot.key, slot.dtype)
        loaded[slot.key] = in_flight.add(place(array, slot.leaf, host, placed))
        del array
    in_flight.wait()
    for i, slot in enumerate(slots):
        value = blobs.blobs[matched[i]].value if slot.loads_value else None
        if value is not None:  # as Equinox reads it: the template's type, the value
            loaded[slot.key] = type(slot.leaf)(value.item())
    return loaded


def load_eqx(file: PathOrFile, like: Any, *, host: bool = False) -> Any:
    """Loads a file written by `eqx.tree_serialise_leaves` into the template `like`.

    Equinox's format is positional: one `.npy` blob per leaf of the saved model, in
    depth-first order, Python bool/int/float/complex leaves included (e.g.
    `Dropout.p`, `inference` flags, unmarked int fields) and other non-array leaves
    skipped. In an AutoModule those Python values are static, and the saved
    `eqx.Module` may have marked some `eqx.field(static=True)` (then they were not
    saved). So the blobs are aligned to the template's *full* leaf order, static values
    included, with each static value present or absent: every array is checked against
    the template's shape and dtype, and every stored Python value must equal the
    template's static value. A difference, or a file that fits the template in two ways
    that would load different arrays, is an error naming the key paths, never a
    shifted load.

    **Arguments:**

    - `file`: a path (a path without suffix gets `.eqx`, as in Equinox) or a seekable
        binary file object positioned at the checkpoint.
    - `like`: the AutoModule (or any pytree) to load into, concrete or with
        `jax.ShapeDtypeStruct` arrays, built with the saved model's hyperparameters.
    - `host`: as for `load`, and so is where the arrays go.

    **Returns:**

    A copy of `like` with its arrays loaded; static values are those of `like`.
    """
    return _load_eqx(file, like, host=host, placed=True)


def load_eqx_unplaced(file: PathOrFile, like: Any) -> Any:
    """`load_eqx` with every array uncommitted on the default device, whatever the
    template's placement: where Equinox's own reader puts them."""
    return _load_eqx(file, like, host=False, placed=False)


def _load_eqx(file: PathOrFile, like: Any, *, host: bool, placed: bool) -> Any:
    slots = _slots(like)
    if isinstance(file, (str, bytes, os.PathLike)):
        file = _with_eqx_suffix(file)
    with open_source(file) as source:
        blobs = _Blobs(source, limit=len(slots))
        matched = _place_blobs(slots, blobs, source.name)
        loaded = _read(slots, blobs, matched, host, placed)
        source.seek_end()

    def fill(path: tuple, leaf: Any) -> Any:
        if not is_dynamic_leaf(leaf):
            return loaded.get(jtu.keystr(path), leaf)  # a Python scalar leaf's value
        key = jtu.keystr(path)
        if key not in loaded:  # expose keeps every array at its key path
            raise AssertionError(
                f"internal error: the array at {show(key)} was not met in the "
                "template's full leaf order. Please report this."
            )
        return loaded[key]

    return jtu.tree_map_with_path(fill, like)
