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
from ..core._carriers import layers_as_carriers, layers_as_nodes
from ..core._exposed import (
    holds_modules,
    holds_none,
    holds_template_layers,
    keep_carrier_structure,
    keep_layer_structures,
    keep_module_structures,
    layers_by_markers,
    on_exposed,
)
from ..core._leaves import all_real, CARRIER, category, is_model
from ..core._templates import labels_only

_sentinel: Any = object()


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
    to what it is; in a tree mapped from a model (a vmap `in_axes`, a filter spec)
    what was not replaced keeps that model's structure, and a replaced field is a
    child, as in an `eqx.Module`.
    """
    kwargs = _replacements(replace, replace_fn)
    out = on_exposed(
        lambda exposed: original_tree_at(where, exposed, is_leaf=is_leaf, **kwargs),
        pytree,
    )
    keep_module_structures(pytree, out)
    return out


def routed_tree_at(
    where: Callable[[Any], Any],
    pytree: Any,
    replace: Any | Sequence[Any] = _sentinel,
    replace_fn: Callable[[Any], Any] = _sentinel,
    is_leaf: Callable[[Any], bool] | None = None,
) -> Any:
    """`eqx.tree_at` as routed: Equinox's own, unless the tree holds AutoModules
    (a subtree of labels mapped from a held layer keeps that layer's node). Then
    Equinox's own still, with every `eqx.nn` layer a node of the pytree as it is
    (so a layer `where` points at is found), unless a target is static; then
    `tree_at`, as for a model given a replacement that is not all arrays (a float
    where an array was)."""
    kwargs = _replacements(replace, replace_fn)
    if not holds_modules(pytree):
        out = original_tree_at(where, pytree, is_leaf=is_leaf, **kwargs)
        if holds_template_layers(pytree):  # labels mapped from a held layer
            keep_layer_structures(pytree, out, labelled=True)
        return out
    made: list[Any] = [] if replace is _sentinel else [replace]
    leaves = jtu.tree_leaves(pytree)
    if not (leaves or holds_none(pytree)):
        # A tree without leaves or `None`s: a model holding no array, not a tree of
        # labels mapped from one.
        return tree_at(where, pytree, replace, replace_fn, is_leaf)
    if replace_fn is not _sentinel:

        def noting_replace_fn(node: Any) -> Any:
            if not is_model(leaves):  # a tree of labels: Equinox rebuilt its layers
                layers_by_markers(node)
            with layers_as_carriers():  # as the user's function sees any model
                made.append(replace_fn(node))
            return made[-1]

        kwargs["replace_fn"] = noting_replace_fn
    try:
        with layers_as_nodes():
            out = original_tree_at(where, pytree, is_leaf=is_leaf, **kwargs)
    except (TypeError, ValueError) as err:
        # A static target is not a node of the tree: Equinox says it is not a leaf.
        try:
            return tree_at(where, pytree, replace, replace_fn, is_leaf)
        except Exception as exposed_err:
            raise exposed_err from err
    # The user's function is not called again: what it made is handed out anew,
    # in the order the same targets are met.
    again = replace_fn if replace_fn is _sentinel else _replayed(made)
    if not (leaves or labels_only(made)):
        # A function or a layer put in a tree without leaves: a model holding no
        # array, not a tree of labels mapped from one.
        return tree_at(where, pytree, replace, again, is_leaf)
    if not is_model(leaves):
        keep_layer_structures(pytree, out, labelled=bool(leaves))
        return out
    if all(map(all_real, made)):
        return out
    carrier = category(pytree) == CARRIER
    if carrier and labels_only(made) and keep_carrier_structure(pytree, out):
        return out  # labels at every array of a carrier, in an `is_leaf` callback
    # A non-array where a model holds arrays: decided afresh on the exposed form.
    return tree_at(where, pytree, replace, again, is_leaf)


def _replayed(made: list[Any]) -> Callable[[Any], Any]:
    values = iter(made)
    return lambda _: next(values)


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
