"""`eqx.filter`, `eqx.partition` and `eqx.combine` on trees holding AutoModules.

An AutoModule's non-array values ride in its aux data, where Equinox's tree maps do
not see them: `eqx.partition(model, eqx.is_array)` would give two halves that both
carry the model's non-arrays, and `eqx.combine` of one model's arrays with another's
non-arrays would fail on their different aux data. So, as for an `eqx.Module`:

- a filter that keeps none of a module's non-array values (`eqx.is_array`: the
  array half) gives the module in its own form, with its own aux data: the half has
  the treedef of the model's gradients and optimiser states;
- a filter that keeps some (the static half, `inverse=True`) gives the module in
  the exposed form (`_exposed.exposed_module`): every field a child, each value
  kept or `replace`d leaf by leaf, as Equinox filters an `eqx.Module`;
- `combine` takes a module's arrays from every tree, and its non-array values from
  the exposed trees that hold them (from any tree if none does), and decides the
  combined module's partition afresh.

Fields declared `eqx.field(static=True)` are never filtered, as in Equinox. A filter
spec that is a pytree (a prefix of bools and callables) is applied as Equinox
applies it: to the arrays, the non-array values staying where they are.
"""

from collections.abc import Callable
from typing import Any, Final, Protocol

import equinox as eqx
import jax.tree_util as jtu

from .._compat import original_combine, original_filter, original_partition
from ..core._carriers import carrier_children, get_layer
from ..core._exposed import (
    array_half,
    dynamic_half,
    exposed_module,
    holds_exposed,
    holds_modules,
    is_exposed,
    is_ours,
    layer_static_leaves,
    new_module,
    static_leaves_of,
)
from ..core._fields import fields_of
from ..core._leaves import ARRAY, CARRIER, category, NODE, NONE
from ..core._node import flatten
from ..core._templates import template_aux


class _Keep(Protocol):
    """A filter function as `eqx.filter` applies it: whether it keeps a leaf, and
    whether it can keep only arrays (Equinox's array filters: no layer's non-array
    needs looking at)."""

    arrays_only: bool

    def __call__(self, x: Any, /) -> bool: ...


def _keeping(spec: Callable[[Any], Any], inverse: bool) -> _Keep:
    def keep(x: Any) -> bool:
        return bool(spec(x)) != inverse

    keep.arrays_only = any(spec is f for f in _ARRAY_FILTERS) and not inverse  # pyright: ignore[reportFunctionMemberAccess]
    return keep  # pyright: ignore[reportReturnType]


_ARRAY_FILTERS: Final = (eqx.is_array, eqx.is_inexact_array)


def _filter(
    tree: Any,
    keep: _Keep,
    replace: Any,
    is_leaf: Any,
    filtered: Callable[[Any], bool] = is_ours,
) -> Any:
    """Equinox's filter of `tree`, each node that is `filtered` (AutoModules and
    carriers) by `_filter_node`; other nodes are mapped through, as Equinox maps
    them."""

    def stop(x: Any) -> bool:
        return filtered(x) or (is_leaf is not None and is_leaf(x))

    def each(x: Any) -> Any:
        if filtered(x) and not (is_leaf is not None and is_leaf(x)):
            return _filter_node(x, keep, replace, is_leaf)
        return x if keep(x) else replace

    return jtu.tree_map(each, tree, is_leaf=stop)


def _is_module(x: Any) -> bool:
    return category(x) == NODE


def _filter_node(module: Any, keep: _Keep, replace: Any, is_leaf: Any) -> Any:
    if category(module) == CARRIER:  # exposed, a carrier is its layer
        return _filter(get_layer(module), keep, replace, is_leaf)
    statics = static_leaves_of(module)
    if not any(map(keep, statics)) and (
        keep.arrays_only or not any(map(keep, layer_static_leaves(module)))
    ):
        # The array side: the node in its own form, its children filtered.
        children, _ = flatten(fields_of(type(module)), module)
        return _array_side_node(module, children, statics, keep, replace, is_leaf)
    attrs = object.__getattribute__(module, "__dict__")
    return exposed_module(
        type(module), {n: _filter(v, keep, replace, is_leaf) for n, v in attrs.items()}
    )


def _array_side(
    children: tuple[Any, ...], keep: _Keep, replace: Any, is_leaf: Any
) -> tuple[Any, ...]:
    """A node's children filtered on its array side: its AutoModules by
    `_filter_node`, its layers' carriers mapped through (the layer comes back with its
    own aux data, as the model's flatten made it)."""

    def child(c: Any) -> Any:
        kind = category(c)
        if kind == ARRAY:  # most children: no tree to map
            return c if keep(c) else replace
        if kind == CARRIER:
            if is_leaf is not None and is_leaf(c):  # a layer the filter takes whole
                return c if keep(c) else replace
            return _layer_array_side(c, keep, replace, is_leaf)
        return c if kind == NONE else _filter(c, keep, replace, is_leaf, _is_module)

    return tuple(map(child, children))


def _array_side_node(
    node: Any,
    children: tuple[Any, ...],
    statics: list[Any],
    keep: _Keep,
    replace: Any,
    is_leaf: Any,
) -> Any:
    """`node` (a module or a carrier) unflattened from its `children` filtered,
    flattening as it did; holding `replace` for its `statics` where it has any, as
    Equinox's filter gives an `eqx.Module`."""
    structure = jtu.tree_structure(node, is_leaf=lambda x: x is not node)
    kept = _array_side(children, keep, replace, is_leaf)
    half = structure.unflatten(kept)
    if not statics:
        return half
    return array_half(half, structure.node_data()[1], kept, replace)


def _layer_array_side(carrier: Any, keep: _Keep, replace: Any, is_leaf: Any) -> Any:
    """A held layer's array side: as Equinox's filter gives the layer, `replace` for
    each non-array leaf of a field not declared static (an MLP's activations, which
    `lax.stop_gradient` of the layer cannot take), unless the filter keeps one."""
    statics = static_leaves_of(get_layer(carrier))
    if any(map(keep, statics)):
        statics = []
    return _array_side_node(
        carrier, carrier_children(carrier), statics, keep, replace, is_leaf
    )


def _is_function(spec: Any) -> bool:
    """A filter spec that is one callable, not a pytree of them (a module is
    callable and a pytree)."""
    return callable(spec) and jtu.treedef_is_leaf(jtu.tree_structure(spec))


def filter(
    pytree: Any,
    filter_spec: Any,
    inverse: bool = False,
    replace: Any = None,
    is_leaf: Callable[[Any], bool] | None = None,
) -> Any:
    """`eqx.filter` that treats an AutoModule's non-array values as leaves."""
    if not _is_function(filter_spec):
        return original_filter(pytree, filter_spec, inverse, replace, is_leaf)
    try:
        return original_filter(
            pytree, filter_spec, inverse, replace, _refusing_ours(is_leaf)
        )
    except _HoldsOurs:
        return _filter(pytree, _keeping(filter_spec, inverse), replace, is_leaf)


def partition(
    pytree: Any,
    filter_spec: Any,
    replace: Any = None,
    is_leaf: Callable[[Any], bool] | None = None,
) -> tuple[Any, Any]:
    """`eqx.partition` that puts an AutoModule's non-array values in the static
    half."""
    if not _is_function(filter_spec):
        return original_partition(pytree, filter_spec, replace, is_leaf)
    try:
        return original_partition(pytree, filter_spec, replace, _refusing_ours(is_leaf))
    except _HoldsOurs:
        return (
            _filter(pytree, _keeping(filter_spec, False), replace, is_leaf),
            _filter(pytree, _keeping(filter_spec, True), replace, is_leaf),
        )


class _HoldsOurs(Exception):
    """Stops Equinox's walk of a tree at an AutoModule or a carrier."""


def _refusing_ours(is_leaf: Callable[[Any], bool] | None) -> Callable[[Any], Any]:
    """The user's `is_leaf` for Equinox's own filter, which calls it at every node
    before it maps anything: a tree without an AutoModule or a carrier is then filtered
    by Equinox, walked once, and one with one is stopped at the first (an
    AutoModule's root at once) and filtered here. A search for them beforehand walks
    the tree twice: 1.3x Equinox's time on 256 `eqx.nn.Linear` in an `eqx.Module`."""

    def check(x: Any) -> Any:
        if is_ours(x):
            raise _HoldsOurs
        return False if is_leaf is None else is_leaf(x)

    return check


def _in_exposed_form(x: Any) -> bool:
    """An AutoModule in the exposed form (or one whose every field is a child
    anyway, not an array half holding `None`s for its model's static values), or an
    `eqx.nn` layer (a carrier's exposed form)."""
    if not is_ours(x) or is_exposed(x):
        return True
    return (
        category(x) != CARRIER and template_aux(x) is None and not static_leaves_of(x)
    )


def _combine_nodes(xs: tuple[Any, ...], is_leaf: Any) -> Any:
    """`combine` at a position holding AutoModules (or carriers and their layers)."""
    present = [x for x in xs if x is not None]
    exposed = any(map(_in_exposed_form, present))

    def side(x: Any) -> Any:
        if x is None or not is_ours(x):
            return x
        if category(x) == CARRIER:
            return get_layer(x)
        if not exposed or _in_exposed_form(x):
            return x
        return dynamic_half(x)

    sides = [side(x) for x in xs]
    first = next(x for x in present if is_ours(x))
    if category(first) == CARRIER:  # layers, combined as Equinox combines them
        return combine(*sides, is_leaf=is_leaf)
    cls = type(first)
    values = [
        None if s is None else (s if type(s) is dict else vars_of(s)) for s in sides
    ]
    names = fields_of(cls).names
    return new_module(cls, {n: _combine_field(values, n, is_leaf) for n in names})


def vars_of(module: Any) -> dict[str, Any]:
    return object.__getattribute__(module, "__dict__")


def _combine_field(values: list[Any], name: str, is_leaf: Any) -> Any:
    """One field of combined nodes: a side whose field is None (a field with no
    array, on the array side) contributes nothing, whatever the other sides hold
    there (a whole module, in Equinox's form of the non-array side)."""
    parts = [v[name] for v in values if v is not None and v.get(name) is not None]
    return combine(*parts, is_leaf=is_leaf) if parts else None


def combine(*pytrees: Any, is_leaf: Callable[[Any], bool] | None = None) -> Any:
    """`eqx.combine` that joins an AutoModule's arrays from one tree with its
    non-array values from another."""
    try:
        combined = original_combine(*pytrees, is_leaf=is_leaf)
    # JAX's message for mismatched trees can itself fail (an AttributeError).
    except (ValueError, TypeError, AttributeError):
        if not any(map(holds_modules, pytrees)):
            raise
    else:
        # Equinox joins exposed trees of one structure (two halves that each kept
        # some static values) into an exposed tree: decided afresh below instead.
        if not holds_exposed(combined):
            return combined

    def stop(x: Any) -> bool:
        return x is None or is_ours(x) or (is_leaf is not None and is_leaf(x))

    def each(*xs: Any) -> Any:
        present = [x for x in xs if x is not None]
        if not present:
            return None
        if any(map(is_ours, present)):
            return _combine_nodes(xs, is_leaf)
        return present[0]

    return jtu.tree_map(each, *pytrees, is_leaf=stop)


filter.__doc__ = original_filter.__doc__
partition.__doc__ = eqx.partition.__doc__
combine.__doc__ = original_combine.__doc__
