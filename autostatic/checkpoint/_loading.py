"""What `load` and `load_eqx` share: template leaves checked, tensors read into fresh
aligned buffers, and placed as the template leaf asks.

A template leaf (a concrete array or a `jax.ShapeDtypeStruct`) says the shape and
dtype a tensor must have, and where the loaded array goes: numpy stays numpy; anything
else becomes a `jax.Array`, with the leaf's placement if it has one (a
`ShapeDtypeStruct` with a sharding, an array committed to its devices), else
uncommitted on the default device, as Equinox's reader (`jnp.asarray`) puts it. Each
tensor is read into memory of its own, so placing it on the CPU device needs no second
copy.
"""

import contextlib
import math
import mmap
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer

from ._dtypes import invalid_bytes_message, known_dtype_name, KNOWN_DTYPES
from ._errors import CheckpointError, show
from ._header import MAX_LISTED
from ._source import Source

# --------------------------------------------------------------------------- templates


def checked_dtype(key: str, leaf: Any, known_only: bool = True) -> np.dtype:
    """The numpy dtype of the array leaf `leaf`, refusing PRNG keys and (if
    `known_only`) dtypes that a checkpoint cannot hold; `save` checks its leaves alike,
    so that what it writes can be loaded."""
    if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        raise CheckpointError(
            f"{show(key)} is an array of PRNG keys, which has no portable bytes. "
            "Store jax.random.key_data(key) instead, and rebuild the key with "
            "jax.random.wrap_key_data after loading."
        )
    dtype = np.dtype(leaf.dtype)
    if known_only and known_dtype_name(dtype) is None:
        raise CheckpointError(
            f"{show(key)} has dtype {dtype}, which has no checkpoint format. "
            f"Supported: {', '.join(sorted(KNOWN_DTYPES))}. Cast it "
            "(x.astype(...)) first."
        )
    return dtype


def template_shape_dtype(
    key: str, leaf: Any, known_only: bool = True
) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and native-order dtype that the template leaf `leaf` asks for."""
    dtype = checked_dtype(key, leaf, known_only)
    if dtype.byteorder in "<>":  # a byte-swapped numpy template; the file is native
        dtype = dtype.newbyteorder("=")
    return tuple(int(d) for d in np.shape(leaf)), dtype


def _is_numpy(leaf: Any) -> bool:
    return isinstance(leaf, (np.ndarray, np.generic))


def jax_dtype_problem(key: str, dtype: np.dtype, like: Any, host: bool) -> str | None:
    """Why `dtype` cannot become the jax.Array that `like` asks for, if it cannot."""
    if host or _is_numpy(like):
        return None
    if jax.dtypes.canonicalize_dtype(dtype) != dtype:
        return (
            f"{show(key)}: {dtype} cannot become a jax.Array while 64-bit mode is "
            "off (JAX would silently convert it); enable jax_enable_x64 or load with "
            "host=True"
        )
    return None


def format_problems(
    name: str, problems: list[str], hint: str, uncounted: int = 0
) -> str:
    """One message for many problems, listing at most `MAX_LISTED` of them.

    `uncounted`: further problems known only by an estimate of their number.
    """
    total = len(problems) + uncounted
    lines = problems[:MAX_LISTED]
    about = "about " if uncounted else ""
    if total > len(lines):
        lines.append(f"... and {about}{total - len(lines)} more")
    listed = "\n  ".join(lines)
    return (
        f"{name} does not match the template ({about}{total} problem"
        f"{'s' if total != 1 else ''}):\n  {listed}\n{hint}"
    )


# --------------------------------------------------------------------------- reading

# XLA's CPU client aliases a numpy buffer aligned to this instead of copying it, so a
# tensor read into such a buffer becomes a device array without a second copy.
_ALIGNMENT = 64
# Tensors of at least one huge page get memory of their own, aligned to huge pages and
# marked for them (Linux transparent huge pages): reading into fresh memory costs a page
# fault per 4 KiB page otherwise, more than the copy itself (design.md, "Loading").
_HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)


def _aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    nbytes = math.prod(shape) * dtype.itemsize
    if _MADV_HUGEPAGE is not None and nbytes >= _HUGE_PAGE:
        with contextlib.suppress(OSError):  # no mapping to be had: numpy's allocator
            return _huge_page_empty(nbytes, _MADV_HUGEPAGE).view(dtype).reshape(shape)
    raw = np.empty(nbytes + _ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % _ALIGNMENT
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def _huge_page_empty(nbytes: int, advice: int) -> np.ndarray:
    """`nbytes` of fresh anonymous memory starting at a huge-page boundary, whose whole
    huge pages are marked for transparent huge pages. Only those: a partly used huge
    page at the end would hold up to 2 MiB that no tensor uses. The array keeps the
    mapping alive, and unmapping it when the array goes returns the memory at once."""
    size = nbytes + _HUGE_PAGE  # room to start at a boundary; the rest is never touched
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    mapping = mmap.mmap(-1, size, flags=flags)
    raw = np.frombuffer(mapping, np.uint8)
    start = -raw.ctypes.data % _HUGE_PAGE
    whole = nbytes // _HUGE_PAGE * _HUGE_PAGE
    with contextlib.suppress(OSError):  # a kernel without transparent huge pages
        mapping.madvise(advice, start, whole)
    return raw[start : start + nbytes]


def read_array(
    source: Source, offset: int, shape: tuple[int, ...], stored: np.dtype, key: str
) -> np.ndarray:
    """Reads a C-ordered tensor whose bytes are `stored` (with its byte order) into a
    fresh aligned array in native byte order, refusing bytes that are no values of its
    dtype."""
    array = _aligned_empty(shape, stored)
    if array.nbytes:
        view = array.reshape(-1).view(np.uint8).data
        source.read_into(offset, view, f"tensor {key!r}")
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    problem = invalid_bytes_message(key, array)
    if problem is not None:
        raise CheckpointError(f"{source.name}: {problem}.")
    return array


# --------------------------------------------------------------------------- placing


class InFlight:
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


def placement(like: Any) -> Any:
    """The placement the template leaf `like` carries: the sharding of a
    `ShapeDtypeStruct` that has one (`eval_shape` gives none) or of an array committed
    to its devices; `None` for any other leaf, an uncommitted array included (JAX
    chose its device, so JAX may move it)."""
    if isinstance(like, jax.ShapeDtypeStruct):
        return like.sharding
    # A tracer has no placement to read (`.committed` raises on one).
    if isinstance(like, jax.Array) and not isinstance(like, Tracer) and like.committed:
        return like.sharding
    return None


def place(array: np.ndarray, like: Any, host: bool, placed: bool = True) -> Any:
    """The loaded value for the template leaf `like`: numpy, or a jax.Array with the
    template's placement (if `placed` and it has one), else uncommitted on the default
    device."""
    if isinstance(like, np.generic):
        return array[()]
    if host or _is_numpy(like):
        return array
    # `device_put` to `None` makes an uncommitted array, as `jnp.asarray` does, so a
    # later `pmap` or `jit` may move it. On one CPU device, committed or not, JAX
    # adopts `array` (ours alone) instead of copying it.
    return jax.device_put(array, placement(like) if placed else None)
