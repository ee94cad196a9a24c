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

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax.tree_util as jtu

from .._compat import original_inference_mode, original_tree_at
from ..core._carriers import get_flat, layers_as_carriers, layers_as_nodes
from ..core._exposed import holds_modules, on_exposed
from ..core._leaves import category, is_dynamic_leaf, LAYER, REAL, stops
from ..core._node import to_carrier
from ..core._templates import changed_children_only, take_markers, take_structure

_sentinel: Any = object()


def _all_real(tree: Any) -> bool:
    """Whether every leaf of `tree` is what a model's children hold (arrays, `None`,
    AutoModules, `eqx.nn` layers): put in place as it is, it needs nothing decided."""
    return all(category(x) in REAL for x in jtu.tree_leaves(tree, is_leaf=stops))


def _is_model(leaves: list[Any]) -> bool:
    """Whether a tree of these leaves has leaves and every one is an array: a model,
    not a tree mapped from one (a filter spec, whose leaves are bools, or an
    `in_axes` tree mapped to `None`, which has none)."""
    return bool(leaves) and all(map(is_dynamic_leaf, leaves))


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


def routed_tree_at(
    where: Callable[[Any], Any],
    pytree: Any,
    replace: Any | Sequence[Any] = _sentinel,
    replace_fn: Callable[[Any], Any] = _sentinel,
    is_leaf: Callable[[Any], bool] | None = None,
) -> Any:
    """`eqx.tree_at` as routed: Equinox's own, unless the tree holds AutoModules.
    Then Equinox's own still, with every `eqx.nn` layer a node of the pytree as it is
    (so a layer `where` points at is found), unless a target is static; then
    `tree_at`, as for a model given a replacement that is not all arrays (a float
    where an array was)."""
    kwargs = _replacements(replace, replace_fn)
    if not holds_modules(pytree):
        return original_tree_at(where, pytree, is_leaf=is_leaf, **kwargs)
    made: list[Any] = [] if replace is _sentinel else [replace]
    if replace_fn is not _sentinel:

        def noting_replace_fn(node: Any) -> Any:
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
    leaves = jtu.tree_leaves(pytree)
    if not _is_model(leaves):
        _keep_layer_structures(pytree, out, labelled=bool(leaves))
        return out
    if all(map(_all_real, made)):
        return out
    # A non-array where a model holds arrays: decided afresh on the exposed form.
    return tree_at(where, pytree, replace, replace_fn, is_leaf)


def _keep_layer_structures(tree: Any, out: Any, labelled: bool) -> None:
    """In a tree mapped from a model (a filter spec, optimiser labels), each
    `eqx.nn` layer `eqx.tree_at` made anew keeps the structure of the layer at its
    place before (`_templates.take_structure`): a label put in a layer's field, or
    a subtree mapped from the standalone layer, still matches the model. One put
    where the tree held no layer takes its class's static markers
    (`_templates.take_markers`). A tree without leaves (not `labelled`) may be a
    model holding no array: there a layer whose static value changed is decided from
    its values (a spec's labels, in a tree without leaves, are only what `tree_at`
    put at the model's array places)."""
    with layers_as_nodes():
        before, after = _layers_by_path(tree), _layers_by_path(out)
    for path, new in after.items():
        old = before.get(path)
        if old is None:
            if labelled:
                take_markers(new)
        elif new is not old and type(new) is type(old):
            aux = get_flat(to_carrier(old))[1]
            if labelled or changed_children_only(old, new, aux):
                take_structure(new, aux)


def _layers_by_path(tree: Any) -> dict[Any, Any]:
    """Every `eqx.nn` layer in `tree` (inside layers too), by key path; in surgery
    mode, where each is a node of the tree."""
    found: dict[Any, Any] = {}
    pending = [((), tree)]
    while pending:
        prefix, top = pending.pop()
        inner = functools.partial(_is_inner_layer, top)
        for path, x in jtu.tree_flatten_with_path(top, is_leaf=inner)[0]:
            if inner(x):
                found[prefix + path] = x
                pending.append((prefix + path, x))
    return found


def _is_inner_layer(top: Any, x: Any) -> bool:
    return x is not top and category(x) == LAYER


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
