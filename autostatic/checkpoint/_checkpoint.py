"""Checkpoints addressed by key path: `save` and `load`.

Every array leaf is stored under `jax.tree_util.keystr` of its key path, which is the
same for an AutoModule and for the equivalent `eqx.Module` and does not depend on which
values are static, so checkpoints move between the two and a mismatch is reported by
name. Saving to a path is atomic. Loading checks the header against the template before
reading any tensor, then reads each tensor into its own buffer and places it as the
template leaf asks (`_loading.place`).
"""

import os
from collections.abc import Callable
from typing import Any, BinaryIO, Final

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax.core import Tracer

from ..core._leaves import is_dynamic_leaf
from ._dtypes import little_endian
from ._errors import CheckpointError, describe, show
from ._files import write_file
from ._header import Header, read_header, Tensor
from ._loading import (
    checked_dtype,
    format_problems,
    InFlight,
    jax_dtype_problem,
    place,
    read_array,
    template_shape_dtype,
)
from ._source import open_source, PathOrFile, require_binary, Source
from ._writing import file_writer, Planned

# A partial load (`strict=False`) parses at most this many entries the template does
# not need, which bounds the work a hostile header can cause (about 0.5 s).
MAX_UNNEEDED_TENSORS = 65_536

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
        if type(leaf) in NUMBER_KINDS:
            leaf = _number_array(key, leaf)
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


# The Python numbers that are leaves of a tree (a step counter in a field annotated to
# hold arrays, a plain dict's learning rate), each with the dtypes that may store it.
NUMBER_KINDS: Final = {
    bool: jnp.bool_,
    int: jnp.integer,
    float: jnp.floating,
    complex: jnp.complexfloating,
}


def _number_array(key: str, value: Any) -> np.ndarray:
    """A Python number leaf as the 0-d array `jnp.asarray` makes of it (int32,
    float32, ... unless 64-bit mode is on)."""
    dtype = jax.dtypes.canonicalize_dtype(np.asarray(value).dtype)
    try:
        return np.asarray(value, dtype=dtype)
    except OverflowError:
        raise CheckpointError(
            f"{show(key)} is the Python int {value}, which does not fit {dtype}. "
            "Enable jax_enable_x64, or store it as an array of a wider dtype."
        ) from None


def _writer(tree: Any) -> Callable[[BinaryIO], None]:
    """Checks `tree` and plans the file; the result writes it."""
    leaves = _array_leaves(tree)
    planned = [
        Planned(key, checked_dtype(key, leaf).name, tuple(map(int, np.shape(leaf))))
        for key, leaf in leaves
    ]
    return file_writer(planned, [leaf for _, leaf in leaves])


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
        `jax.tree_util.keystr` of its natural key path, e.g. `.layers[0].weight`, and
        so is every Python number that is a leaf (a step counter in a field annotated
        to hold arrays), as the 0-d array `jnp.asarray` makes of it. Other leaves and
        static data are not stored; `load` takes them from its template.
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
        write_file(file, write, durable=durable)
    else:
        require_binary(file, "wb")
        write(file)


# --------------------------------------------------------------------------- load


def _template_arrays(
    paths_and_leaves: list[tuple[Any, Any]],
) -> tuple[dict[str, tuple[int, Any]], dict[str, Any]]:
    """The template's array leaves by key (with their index), and its other leaves."""
    wanted: dict[str, tuple[int, Any]] = {}
    others: dict[str, Any] = {}
    for index, (path, leaf) in enumerate(paths_and_leaves):
        key = jtu.keystr(path)
        if not (is_dynamic_leaf(leaf) or type(leaf) in NUMBER_KINDS):
            others[key] = leaf
        elif key in wanted:
            raise CheckpointError(
                f"two array leaves of the template have the key path {key!r}; "
                "keys must be unique to load by name."
            )
        else:
            wanted[key] = (index, leaf)
    return wanted, others


def _differences(
    header: Header, wanted: dict[str, tuple[int, Any]], host: bool
) -> list[str]:
    """Each template array that the file lacks, or has with another shape or dtype,
    one line each."""
    problems = []
    for key, (_, leaf) in wanted.items():
        if type(leaf) in NUMBER_KINDS:
            problems += _number_difference(header.tensors.get(key), key, leaf)
            continue
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
    return problems


def _number_difference(tensor: Tensor | None, key: str, leaf: Any) -> list[str]:
    """Why the file's tensor cannot fill the template's Python number `leaf`: a file
    without it keeps the template's value (one saved before numbers were)."""
    if tensor is None:
        return []
    kind = type(leaf)
    if tensor.shape == () and jnp.issubdtype(tensor.dtype, NUMBER_KINDS[kind]):
        return []
    found = describe(tensor.dtype, tensor.shape)
    article = "an" if kind.__name__[0] in "aeiou" else "a"
    return [
        f"not {article} {kind.__name__}: {show(key)} (template: the Python "
        f"{kind.__name__} {leaf!r}, file: {found})"
    ]


def _extras(unexpected: tuple[Tensor, ...], others: dict[str, Any]) -> list[str]:
    """Each tensor of the file that the template has no array for, one line each."""
    problems = []
    for tensor in unexpected:
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


def _check_match(
    header: Header,
    wanted: dict[str, tuple[int, Any]],
    others: dict[str, Any],
    host: bool,
    strict: bool,
    name: str,
) -> None:
    """Raises one error listing every difference between the header and the template
    (its array leaves, `wanted`, and its other leaves); `strict=False` ignores the
    tensors the template does not have."""
    unexpected = header.unwanted if strict else ()
    problems = _differences(header, wanted, host) + _extras(unexpected, others)
    if not problems:
        return
    # Past MAX_LISTED unexpected tensors the header is only counted, not read.
    uncounted = header.unwanted_count - len(header.unwanted) if strict else 0
    hint = "Build the template with the hyperparameters of the saved model."
    if unexpected or uncounted:
        hint += " Pass strict=False to ignore tensors the template does not have."
    raise CheckpointError(format_problems(name, problems, hint, uncounted))


def _read_tensors(
    source: Source,
    header: Header,
    wanted: dict[str, tuple[int, Any]],
    leaves: list[Any],
    host: bool,
) -> list[Any]:
    """`leaves` with each wanted array read from the file and placed like it."""
    new_leaves = list(leaves)
    in_flight = InFlight()
    # In file order, so a path is read front to back.
    for tensor in sorted(header.tensors.values(), key=lambda t: t.begin):
        index, leaf = wanted[tensor.key]
        offset = header.data_start + tensor.begin
        stored = little_endian(tensor.dtype)
        array = read_array(source, offset, tensor.shape, stored, tensor.key)
        if type(leaf) in NUMBER_KINDS:  # as Equinox loads one: a number of its type
            new_leaves[index] = type(leaf)(array.item())
            continue
        new_leaves[index] = in_flight.add(place(array, leaf, host))
        del array
    in_flight.wait()
    return new_leaves


def load(
    file: PathOrFile, like: Any, *, host: bool = False, strict: bool = True
) -> Any:
    """Loads a file written by `save` into the structure of the template `like`.

    **Arguments:**

    - `file`: a path, or a seekable binary file object positioned at the checkpoint.
    - `like`: a tree of the same structure as the saved one: a concrete model, or an
        abstract one whose arrays are `jax.ShapeDtypeStruct`s (from
        `eqx.filter_eval_shape` or `jax.eval_shape`, which allocate nothing). Its array
        leaves are filled from the file by key path, and so are its Python number
        leaves where the file holds them (as numbers of their type, as Equinox loads
        them; a file without one keeps the template's); every other leaf and all
        static data are kept from `like`.
    - `host`: if `True`, every loaded leaf is a numpy array (bfloat16 etc. as ml_dtypes
        arrays) and nothing is allocated on any JAX device. If `False`, leaves whose
        template is a `jax.Array` or `ShapeDtypeStruct` become `jax.Array`s: with the
        template leaf's `.sharding` where it carries a placement (a
        `ShapeDtypeStruct` whose `.sharding` is set, or an array that is `.committed`
        to its devices), else uncommitted on the default device, as Equinox loads
        them (`jnp.asarray`), so that `jit` and `pmap` may move them. Leaves whose
        template is a numpy array stay numpy arrays, as in Equinox.
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
    leaves = [leaf for _, leaf in paths_and_leaves]
    with open_source(file) as source:
        header = read_header(source, wanted, None if strict else MAX_UNNEEDED_TENSORS)
        _check_match(header, wanted, others, host, strict, source.name)
        new_leaves = _read_tensors(source, header, wanted, leaves, host)
        source.seek_end()
    return jtu.tree_unflatten(treedef, new_leaves)
