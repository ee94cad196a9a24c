"""`eqx.tree_serialise_leaves` and `eqx.tree_deserialise_leaves` on AutoModules.

Equinox writes every leaf its filter spec accepts, in flatten order: for an
`eqx.Module` without static markers that includes the Python ints and floats of its
fields. An AutoModule keeps those in its aux data, so both functions are routed to
work on the exposed form (`_exposed.expose`, declared-static fields kept static):
the leaves Equinox sees are then those of the same model written as an
`eqx.Module`, and the files are the same, byte for byte, in both directions. A
loaded tree has its partition decided afresh from the values read. A file that
does not fit the exposed template, with Equinox's default filter spec, is read by
`load_eqx`: a file whose writer marked fields static (and so did not write them). Its
arrays go where Equinox's reader puts them, uncommitted on the default device whatever
the template's placement, so the result does not depend on which reader read the file.

A filter spec that is a pytree of functions above the AutoModules (`(spec, spec)`
for `(model, opt_state)`) is applied to each subtree exposed, as it is to an
`eqx.Module`'s; one made from the AutoModules themselves (a `tree_map` of the model)
fits their own form, and is applied to their arrays.
"""

import os
from collections.abc import Callable
from typing import Any

import jax.tree_util as jtu

from .._compat import (
    original_tree_deserialise_leaves,
    original_tree_serialise_leaves,
)
from ..checkpoint._eqx_format import load_eqx_unplaced
from ..checkpoint._errors import CheckpointError
from ..core._exposed import decide_again, expose, holds_modules


def _exposed_and_kwargs(tree: Any, filter_spec: Any) -> tuple[Any, dict[str, Any]]:
    """`tree` as Equinox's functions are to see it, and the filter spec to pass on
    (Equinox's default unless one was given)."""
    kwargs = {} if filter_spec is None else {"filter_spec": filter_spec}
    if not holds_modules(tree):
        return tree, kwargs
    spec = jtu.tree_structure(filter_spec)
    if jtu.treedef_is_leaf(spec):  # one function for every leaf
        return expose(tree, keep_declared_static=True), kwargs
    if holds_modules(filter_spec):  # made from the modules: it fits their arrays
        return tree, kwargs
    # A prefix of functions above the modules: each subtree it covers is exposed.
    try:
        covered = spec.flatten_up_to(tree)
    except (ValueError, TypeError):  # not a prefix: Equinox's call says so
        return tree, kwargs
    exposed = [expose(subtree, keep_declared_static=True) for subtree in covered]
    return spec.unflatten(exposed), kwargs


def tree_serialise_leaves(
    path_or_file: Any,
    pytree: Any,
    filter_spec: Any = None,
    is_leaf: Callable[[Any], bool] | None = None,
) -> None:
    pytree, kwargs = _exposed_and_kwargs(pytree, filter_spec)
    original_tree_serialise_leaves(path_or_file, pytree, is_leaf=is_leaf, **kwargs)


def tree_deserialise_leaves(
    path_or_file: Any,
    like: Any,
    filter_spec: Any = None,
    is_leaf: Callable[[Any], bool] | None = None,
) -> Any:
    exposed, kwargs = _exposed_and_kwargs(like, filter_spec)
    if exposed is like:  # no modules: Equinox's, as it is
        return original_tree_deserialise_leaves(
            path_or_file, like, is_leaf=is_leaf, **kwargs
        )
    start = _position(path_or_file)
    try:
        loaded = original_tree_deserialise_leaves(
            path_or_file, exposed, is_leaf=is_leaf, **kwargs
        )
    except Exception as err:
        if filter_spec is not None or is_leaf is not None or start is None:
            raise
        # Perhaps written by the `eqx.Module` before the port, which did not write
        # the fields it marked static: `load_eqx` aligns the file past them, checking
        # every array and stored value, and names what does not fit.
        if not isinstance(path_or_file, (str, os.PathLike)):
            path_or_file.seek(start)
        try:
            return load_eqx_unplaced(path_or_file, like)
        except CheckpointError as aligned:
            raise aligned from err
    return decide_again(loaded)  # decided afresh from the values read


def _position(path_or_file: Any) -> int | None:
    """Where a file object stands (`None` if it cannot seek back); 0 for a path."""
    if isinstance(path_or_file, (str, os.PathLike)):
        return 0
    try:
        return path_or_file.tell() if path_or_file.seekable() else None
    except (AttributeError, OSError):
        return None


tree_serialise_leaves.__doc__ = original_tree_serialise_leaves.__doc__
tree_deserialise_leaves.__doc__ = original_tree_deserialise_leaves.__doc__
