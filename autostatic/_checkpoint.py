"""Checkpoints addressed by key path: `save` and `load`.

Every array leaf is stored under `jax.tree_util.keystr` of its key path, which is the
same for an AutoModule and for the equivalent `eqx.Module` and does not depend on which
values are static, so checkpoints move between the two and a mismatch is reported by
name. Saving to a path is atomic. Loading checks the header against the template before
reading any tensor, then reads each tensor into its own buffer and places it where the
template leaf is.
"""

import contextlib
import functools
import math
import mmap
import os
import re
import secrets
import stat
import sys
import time
from collections.abc import Callable
from typing import Any, BinaryIO

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax.core import Tracer

from ._partition import is_dynamic_leaf
from ._safetensors import (
    CheckpointError,
    describe,
    encode_header,
    Header,
    invalid_bytes_message,
    known_dtype_name,
    KNOWN_DTYPES,
    little_endian,
    LITTLE_ENDIAN_HOST,
    MAX_LISTED,
    open_source,
    PathOrFile,
    Planned,
    read_header,
    require_binary,
    show,
    Source,
)

try:
    import fcntl
except ImportError:  # Windows: no advisory locks, so stale temporary files stay
    fcntl = None

# A partial load (`strict=False`) parses at most this many entries the template does
# not need, which bounds the work a hostile header can cause (about 0.5 s).
MAX_UNNEEDED_TENSORS = 65_536

# --------------------------------------------------------------------------- templates


def checked_dtype(key: str, leaf: Any, known_only: bool = True) -> np.dtype:
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


# --------------------------------------------------------------------------- save


def _array_leaves(tree: Any) -> list[tuple[str, Any]]:
    """Each array leaf of `tree` with the keystr of its path, which must be unique."""
    out: dict[str, Any] = {}
    for path, leaf in jtu.tree_flatten_with_path(tree)[0]:
        key = jtu.keystr(path)
        if isinstance(leaf, jax.ShapeDtypeStruct):
            raise CheckpointError(
                f"{show(key)} is a jax.ShapeDtypeStruct, which has no data to "
                "save. Save a tree of concrete arrays (abstract trees are for `like` "
                "in load)."
            )
        if not eqx.is_array(leaf):
            continue
        if isinstance(leaf, Tracer):
            raise CheckpointError(
                f"{show(key)} is a traced array: save cannot run inside jax.jit, "
                "jax.grad or other transformations. Call it outside them."
            )
        if isinstance(leaf, jax.Array) and leaf.is_deleted():
            raise CheckpointError(
                f"{show(key)} has been deleted (donated to a jitted function, or "
                "deleted with .delete()), so it has no data to save. Save the tree "
                "that function returned, or donate a copy."
            )
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            raise CheckpointError(
                f"{show(key)} is not fully addressable from this process (a "
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


def _write_tensor(f: BinaryIO, key: str, leaf: Any, nbytes: int) -> None:
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


def _writer(tree: Any) -> Callable[[BinaryIO], None]:
    """Checks `tree` and plans the file; the result writes it."""
    leaves = _array_leaves(tree)
    planned = [
        Planned(key, checked_dtype(key, leaf).name, tuple(map(int, np.shape(leaf))))
        for key, leaf in leaves
    ]
    header, order = encode_header(planned)

    def write(f: BinaryIO) -> None:
        f.write(len(header).to_bytes(8, "little"))
        f.write(header)
        for i in order:
            _write_tensor(f, planned[i].key, leaves[i][1], planned[i].nbytes)

    return write


# A durable save starts the disk writes of every this many bytes as soon as they are
# written, so that the disk works while later arrays are copied.
_WRITEBACK_CHUNK = 8 << 20
_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback, do not wait


@functools.cache
def _start_writeback() -> Callable[[int, int, int], None] | None:
    """Linux's `sync_file_range(fd, offset, nbytes, SYNC_FILE_RANGE_WRITE)`, which the
    `os` module lacks: starts writing a range of a file's dirty pages to disk and returns
    without waiting. `None` elsewhere (the fsync at the end then does all the work)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (ImportError, OSError, AttributeError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    function.restype = ctypes.c_int

    def start(fd: int, offset: int, nbytes: int) -> None:
        # A failure (a file system without it) is ignored: only the fsync is relied on.
        function(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)

    return start


class _WritebackFile:
    """The temporary file of a durable save. Writes go through in chunks of
    `_WRITEBACK_CHUNK` bytes, and the disk write of each chunk is started as soon as
    it is written, so the fsync at the end waits for the last chunk instead of the
    whole file (about 1.5x faster durable saves; design.md, "Saving")."""

    def __init__(self, f: BinaryIO, start: Callable[[int, int, int], None]) -> None:
        self.f, self.start, self.fd = f, start, f.fileno()
        self.written = self.started = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        for begin in range(0, len(view), _WRITEBACK_CHUNK):
            chunk = view[begin : begin + _WRITEBACK_CHUNK]
            self.f.write(chunk)
            self.written += len(chunk)
            if self.written - self.started >= _WRITEBACK_CHUNK:
                self.f.flush()
                self.start(self.fd, self.started, self.written - self.started)
                self.started = self.written
        return len(view)

    def flush(self) -> None:
        self.f.flush()


def _target(path: str | bytes | os.PathLike) -> str:
    """The file that saving to `path` replaces: through a symbolic link, its target,
    so the link stays a link (as `open(path, "wb")` would write through it)."""
    name = os.fsdecode(os.fspath(path))
    return os.path.realpath(name) if os.path.islink(name) else name


def _write_through(
    path: str | bytes | os.PathLike, write: Callable[[Any], None]
) -> bool:
    """Writes into `path` as it is, if it is a FIFO or a character device
    (`/dev/stdout` into a pipe, `/dev/null`), which a rename would replace by a
    regular file; returns whether it did. Refuses anything else that is not a
    regular file."""
    name = os.fsdecode(os.fspath(path))
    try:
        mode = os.stat(name).st_mode
    except OSError:  # a new path (or a broken link): the atomic write says why
        return False
    if stat.S_ISREG(mode):
        return False
    if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
        with open(name, "wb") as f:
            write(f)
        return True
    kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
    raise CheckpointError(
        f"cannot save to {name!r}: it is {kind}. Give the path of a file (it is "
        "created, or replaced whole)."
    )


_TEMP_NAME = re.compile(r"\.(.+)\.[0-9a-f]{12}\.tmp\Z", re.DOTALL)


def _create_temp(target: str) -> tuple[int, str]:
    """A new temporary file beside `target`, locked until its descriptor is closed."""
    folder, base = os.path.split(os.path.abspath(target))
    temp = os.path.join(folder, f".{base}.{secrets.token_hex(6)}.tmp")
    # os.open with 0o666 gives the final file the usual umask permissions.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    fd = os.open(temp, flags, 0o666)
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX)
    return fd, temp


def _remove_stale_temps(target: str) -> None:
    """Deletes the temporary files of earlier saves to `target` whose process died.

    A save holds an exclusive `flock` on its temporary file from just after creating it
    until after the rename, and the kernel drops a lock when its process dies, even by
    SIGKILL: a temporary file that can be locked is abandoned. The one exception is the
    instant between a live save's create and its lock, when its file is still empty, so
    an empty file is only deleted once it is a minute old.
    """
    if fcntl is None:
        return
    folder, base = os.path.split(os.path.abspath(target))
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        match = _TEMP_NAME.match(name)
        if match is None or match.group(1) != base:
            continue
        path = os.path.join(folder, name)
        with contextlib.suppress(OSError):  # vanished, in use, or not ours to delete
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                info = os.fstat(fd)
                if info.st_size or time.time() - info.st_mtime > 60:
                    os.unlink(path)
            finally:
                os.close(fd)


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


def _naming(err: OSError, target: str) -> OSError:
    """`err` with the path being saved in its message (a failed write names none)."""
    if err.filename is not None:
        return err
    why = f"{err.strerror or err} (saving failed; any earlier file there is unchanged)"
    if err.errno is None:
        return OSError(f"{why}: {target!r}")
    return OSError(err.errno, why, target)  # the errno picks the subclass


def _atomic_write(
    path: str | bytes | os.PathLike, write: Callable[[Any], None], durable: bool
) -> None:
    """Writes through `write` to a temporary file beside the target, then renames it
    over the target; `durable`: the file is fsynced before the rename and the folder
    after it. A failure at any point leaves an existing file untouched and removes the
    temporary file."""
    target = _target(path)
    try:
        fd, temp = _create_temp(target)
    except OSError as err:  # name the file asked for, not the temporary one
        raise OSError(
            err.errno, f"{err.strerror} (cannot create a file beside it)", target
        ) from err
    try:
        with contextlib.suppress(FileNotFoundError):  # keep a replaced file's mode
            os.chmod(fd, stat.S_IMODE(os.stat(target).st_mode))
        with open(fd, "wb", closefd=False) as f:
            start = _start_writeback() if durable else None
            write(f if start is None else _WritebackFile(f, start))
            f.flush()
            if durable:
                os.fsync(fd)
        if fcntl is None:  # Windows cannot rename an open file
            os.close(fd)
            fd = -1
        os.replace(temp, target)  # still locked, so no other save deletes it first
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        if isinstance(err, OSError):
            raise _naming(err, target) from err
        raise
    finally:
        if fd >= 0:
            os.close(fd)
    if durable:
        _fsync_folder(os.path.dirname(os.path.abspath(target)))
    _remove_stale_temps(target)


def save(file: PathOrFile, tree: Any, *, durable: bool = True) -> None:
    """Saves the arrays of `tree` as a safetensors file, each under its key path.

    **Arguments:**

    - `file`: a path (`str` or `os.PathLike`), or a binary file object open for
        writing. Saving to a path is atomic: the file is written next to it under a
        temporary name, flushed to disk and renamed, so a crash leaves any earlier file
        intact. A path that is a symbolic link is written through: the link's target
        is replaced and the link stays. The new file is a new inode: other hard links
        keep the earlier contents, and its owner is the saving user (its permission
        bits are kept). A FIFO or character device (`/dev/stdout`, `/dev/null`) is
        written into as it is, without a rename or fsync; a folder or any other
        special file is refused.
    - `tree`: any pytree (AutoModule, `eqx.Module`, dicts, ...). Every array leaf
        (`eqx.is_array`: JAX and numpy arrays and scalars) is stored under
        `jax.tree_util.keystr` of its natural key path, e.g. `.layers[0].weight`.
        Other leaves and static data are not stored; `load` takes them from its
        template.
    - `durable`: for a path, whether the file is on disk when `save` returns: it is
        fsynced before the rename, and its folder after. `durable=False` skips both,
        so the disk no longer bounds the save (faster, and nearer Equinox's save, which
        does not fsync: see the benchmark results). It is still atomic: other processes,
        and this program after it crashes, see the old file or the whole new one; but
        after a power loss or an operating-system crash the file may be the old one,
        or a truncated or empty one, depending on the file system. A file object is
        never fsynced.

    Arrays are copied to the host and written one at a time.
    """
    write = _writer(tree)
    if isinstance(file, (str, bytes, os.PathLike)):
        if not _write_through(file, write):
            _atomic_write(file, write, durable)
    else:
        require_binary(file, "wb")
        write(file)


# --------------------------------------------------------------------------- load

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


def place(array: np.ndarray, like: Any, host: bool) -> Any:
    """The loaded value for the template leaf `like`: numpy, or a placed jax.Array."""
    if isinstance(like, np.generic):
        return array[()]
    if host or _is_numpy(like):
        return array
    # Same placement as the template; ShapeDtypeStruct.sharding may be None (default
    # device). On CPU, JAX may alias `array`, which is ours alone, so no copy is made.
    return jax.device_put(array, getattr(like, "sharding", None))


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


def _template_arrays(
    paths_and_leaves: list[tuple[Any, Any]],
) -> tuple[dict[str, tuple[int, Any]], dict[str, Any]]:
    """The template's array leaves by key (with their index), and its other leaves."""
    wanted: dict[str, tuple[int, Any]] = {}
    others: dict[str, Any] = {}
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
    return wanted, others


def _problems(
    header: Header,
    wanted: dict[str, tuple[int, Any]],
    others: dict[str, Any],
    host: bool,
) -> list[str]:
    """Every difference between the header and the template, one line each."""
    problems = []
    for key, (_, leaf) in wanted.items():
        shape, dtype = template_shape_dtype(key, leaf)
        expected = describe(dtype, shape)
        tensor = header.tensors.get(key)
        if tensor is None:
            if header.complete:
                problems.append(
                    f"missing from the file: {show(key)} (template: {expected})"
                )
            continue
        found = describe(tensor.dtype, tensor.shape)
        if tensor.shape != shape:
            problems.append(
                f"shape differs: {show(key)} (template: {expected}, file: {found})"
            )
        elif tensor.dtype != dtype:
            problems.append(
                f"dtype differs: {show(key)} (template: {expected}, file: {found})"
            )
        elif (problem := jax_dtype_problem(key, dtype, leaf, host)) is not None:
            problems.append(problem)
    for tensor in header.unwanted:
        found = describe(tensor.dtype, tensor.shape)
        there = (
            f"; the template has a {type(others[tensor.key]).__name__} there"
            if tensor.key in others
            else ""
        )
        problems.append(
            f"not in the template: {show(tensor.key)} (file: {found}{there})"
        )
    return problems


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
        ignored (at most `MAX_UNNEEDED_TENSORS` of them). Tensors the template needs
        but the file lacks are always an error.

    **Returns:**

    A copy of `like` with its arrays loaded.

    **Raises:**

    `CheckpointError` (a `ValueError`) if the file is not a valid checkpoint, or, before
    anything is loaded, if it does not match the template: one error listing every
    missing key, unexpected key, and shape or dtype difference.
    """
    paths_and_leaves, treedef = jtu.tree_flatten_with_path(like)
    wanted, others = _template_arrays(paths_and_leaves)
    with open_source(file) as source:
        header = read_header(source, wanted, None if strict else MAX_UNNEEDED_TENSORS)
        if not strict:
            header.unwanted, header.unwanted_count = [], 0
        problems = _problems(header, wanted, others, host)
        if problems:
            # Past MAX_LISTED unexpected tensors the header is only counted, not read.
            uncounted = header.unwanted_count - len(header.unwanted)
            hint = (
                "Build the template with the hyperparameters of the saved model. "
                "Pass strict=False to ignore tensors the template does not have."
            )
            raise CheckpointError(
                format_problems(source.name, problems, hint, uncounted)
            )
        new_leaves = [leaf for _, leaf in paths_and_leaves]
        in_flight = InFlight()
        # In file order, so a path is read front to back.
        for tensor in sorted(header.tensors.values(), key=lambda t: t.begin):
            index, leaf = wanted[tensor.key]
            offset = header.data_start + tensor.begin
            stored = little_endian(tensor.dtype)
            array = read_array(source, offset, tensor.shape, stored, tensor.key)
            new_leaves[index] = in_flight.add(place(array, leaf, host))
            del array
        in_flight.wait()
        source.seek_end()
    return jtu.tree_unflatten(treedef, new_leaves)
