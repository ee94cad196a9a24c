"""Model surgery that can reach static values: `tree_at` and `inference_mode`.

`eqx.tree_at` only reaches pytree leaves and nodes, and an AutoModule keeps its
non-array values in aux data. These functions first *expose* every AutoModule in the
tree (a copy whose every field, static values included, is a pytree child), run the
Equinox operation on that, then decide the partition of every AutoModule afresh, so a
replaced value is classified by what it is now: an array put where a float was becomes
dynamic, a static submodule that gains arrays becomes dynamic.

`eqx.tree_at` and `eqx.nn.inference_mode` themselves are routed here (`_compat`), so
code written for Equinox gets the same results. `eqx.tree_at` keeps Equinox's own
speed where that is exact: every replacement is arrays only (an array, an array
sub-module, None) and every target is a node of the tree.
"""

from collections.abc import Callable, Sequence
from typing import Any

import jax.tree_util as jtu

from .._compat import original_inference_mode, original_tree_at
from ..core._carriers import carriers_as_attributes, is_carrier, real_layer
from ..core._exposed import holds_modules, on_exposed
from ..core._fields import has_partition
from ..core._partition import is_dynamic_leaf, with_carriers

_sentinel: Any = object()


def _decided_or_container(x: Any) -> bool:
    return has_partition(x) or isinstance(x, (list, dict, set))


def _arrays_only(tree: Any) -> bool:
    """Whether Equinox's own `tree_at` may put `tree` in place as it is: arrays, and
    modules with a partition of their own. A list, dict or set must be decided for
    its new place: the layers in it carried, its non-array items put in the aux."""
    return all(
        has_partition(x) or is_dynamic_leaf(x)
        for x in jtu.tree_leaves(tree, is_leaf=_decided_or_container)
    )


def _selected_nodes(where: Callable[[Any], Any], pytree: Any) -> Any:
    """`where(pytree)`, or `_sentinel` if it raises: Equinox's own call then reports
    the malformed `where`."""
    try:
        return where(pytree)
    except Exception:
        return _sentinel


def _holds_arrays(targets: Any) -> bool:
    """Whether a target holds an array: the tree is then a model, whose children are
    arrays. A tree mapped from one (a filter spec of bools, gradients with `None`s)
    holds other values where the arrays were, and keeps its structure when one is
    replaced, as with `eqx.Module`."""
    return targets is _sentinel or any(map(is_dynamic_leaf, jtu.tree_leaves(targets)))


def _is_model(tree: Any) -> bool:
    """Whether `tree` has leaves and every one is an array: a model, not a tree
    mapped from one (a filter spec, whose leaves are bools, or an `in_axes` tree
    mapped to `None`, which has none)."""
    leaves = jtu.tree_leaves(tree)
    return bool(leaves) and all(map(is_dynamic_leaf, leaves))


def _one_per_target(targets: Any, replace: Any, tree: Any) -> bool:
    """Whether `replace` is a sequence of replacements, one per target: `where` gave
    a sequence that is not itself a node of `tree` (Equinox's own test)."""
    if not (
        isinstance(targets, (tuple, list))
        and isinstance(replace, (tuple, list))
        and len(targets) == len(replace)
    ):
        return False
    leaves = jtu.tree_leaves(tree, is_leaf=lambda x: x is targets)
    return not any(x is targets for x in leaves)


def _replacements(replace: Any, replace_fn: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    if replace is not _sentinel:
        kwargs["replace"] = replace
    if replace_fn is not _sentinel:
        kwargs["replace_fn"] = replace_fn
    return kwargs


def tree_at(
    where: Callable[[Any], Any],
    pytree: Any,
    replace: Any | Sequence[Any] = _sentinel,
    replace_fn: Callable[[Any], Any] = _sentinel,
    is_leaf: Callable[[Any], bool] | None = None,
) -> Any:
    """`eqx.tree_at` that can also replace the static values of AutoModules.

    Same signature and semantics as `equinox.tree_at`; `where` may point at any
    attribute, array or not: `tree_at(lambda m: m.dropout.p, model, 0.2)`. The result's
    AutoModules are re-partitioned, so the replacement is static or dynamic according
    to what it is.
    """
    kwargs = _replacements(replace, replace_fn)
    return on_exposed(
        lambda exposed: original_tree_at(where, exposed, is_leaf=is_leaf, **kwargs),
        pytree,
    )


def _carriers_for(targets: Any, replace: Any) -> Any:
    """`replace` with each replacement of a carrier target made a carrier, so the
    result has the structure of a model built with it."""
    if is_carrier(targets):
        return with_carriers(replace)
    if isinstance(targets, (tuple, list)) and isinstance(replace, (tuple, list)):
        return type(replace)(
            with_carriers(r) if is_carrier(t) else r for t, r in zip(targets, replace)
        )
    return replace


def routed_tree_at(
    where: Callable[[Any], Any],
    pytree: Any,
    replace: Any | Sequence[Any] = _sentinel,
    replace_fn: Callable[[Any], Any] = _sentinel,
    is_leaf: Callable[[Any], bool] | None = None,
) -> Any:
    """`eqx.tree_at` as routed: Equinox's own, unless the tree holds AutoModules.
    Then Equinox's own still, on a copy of the tree whose attributes give the carriers
    of its layers (so a layer `where` points at is a node of the pytree), unless a
    target is static or a replacement is not arrays only; then `tree_at`."""
    if not holds_modules(pytree):
        kwargs = _replacements(replace, replace_fn)
        return original_tree_at(where, pytree, is_leaf=is_leaf, **kwargs)

    def where_in_pytree(tree: Any) -> Any:
        with carriers_as_attributes():
            return where(tree)

    copied = jtu.tree_map(lambda x: x, pytree)
    targets = _selected_nodes(where_in_pytree, copied)
    if replace is _sentinel:
        arrays_only = True
    elif _one_per_target(targets, replace, copied):
        arrays_only = all(map(_arrays_only, replace))
    else:
        arrays_only = _arrays_only(replace)
    user_replace_fn = replace_fn

    def checked_replace_fn(node: Any) -> Any:
        nonlocal arrays_only
        if is_carrier(node):
            new = with_carriers(user_replace_fn(real_layer(node)))
        else:
            new = user_replace_fn(node)
        arrays_only = arrays_only and _arrays_only(new)
        return new

    if replace_fn is not _sentinel:
        replace_fn = checked_replace_fn
    user_replace = replace
    if replace is not _sentinel and targets is not _sentinel:
        replace = _carriers_for(targets, replace)
    kwargs = _replacements(replace, replace_fn)
    try:
        out = original_tree_at(where_in_pytree, copied, is_leaf=is_leaf, **kwargs)
    except (TypeError, ValueError) as err:
        # A static target is not a node of the tree: Equinox says it is not a leaf.
        try:
            return tree_at(where, pytree, user_replace, user_replace_fn, is_leaf)
        except Exception as exposed_err:
            raise exposed_err from err
    if arrays_only or not (_holds_arrays(targets) or _is_model(copied)):
        return out
    # A non-array now sits where only arrays may be children (in place of a target
    # with no leaf, too: `None`, a `Dropout`, an empty container): decide it afresh.
    return tree_at(where, pytree, user_replace, user_replace_fn, is_leaf)


def inference_mode(pytree: Any, value: bool = True) -> Any:
    """`eqx.nn.inference_mode` for trees holding AutoModules.

    Inside an AutoModule the `inference` flags of `eqx.nn.Dropout`/`BatchNorm` are
    static values, out of `eqx.nn.inference_mode`'s sight; this sets them all.
    """
    return on_exposed(lambda exposed: original_inference_mode(exposed, value), pytree)


def routed_inference_mode(pytree: Any, value: bool = True) -> Any:
    if holds_modules(pytree):
        return inference_mode(pytree, value)
    return original_inference_mode(pytree, value)


routed_inference_mode.__doc__ = original_inference_mode.__doc__
routed_tree_at.__doc__ = original_tree_at.__doc__
