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
from typing import Any

import equinox as eqx
import jax.tree_util as jtu

from .._compat import original_combine, original_filter
from ..core._carriers import carrier_classes, real_layer, with_layers
from ..core._exposed import exposed_module, holds_modules
from ..core._fields import fields_of, has_partition
from ..core._layout import CARRIED, HOLED, materialise, partition_of, STATIC
from ..core._partition import is_dynamic_leaf, new_decided

# Filters known to keep no non-array leaf: the tree keeps its own form.
_ARRAY_FILTERS = (eqx.is_array, eqx.is_inexact_array)

Keep = Callable[[Any], bool]


def _filterable_static_leaves(module: Any) -> list[Any]:
    """The non-array leaves of a module's own fields that Equinox's filter would
    see: those of its static and holed fields not declared static."""
    spec = fields_of(type(module))
    layout = partition_of(module)[1].layout
    attrs = materialise(module)
    declared = dict(zip(spec.names, spec.declared_static))
    return [
        leaf
        for name in layout.entry_names
        if not declared[name]
        for leaf in jtu.tree_leaves(attrs[name], is_leaf=has_partition)
        if not has_partition(leaf) and not is_dynamic_leaf(leaf)
    ]


def _filter(tree: Any, keep: Keep, replace: Any, is_leaf: Any) -> Any:
    """Equinox's filter of `tree`, each AutoModule and carrier in it by
    `_filter_node`."""

    def stop(x: Any) -> bool:
        return has_partition(x) or (is_leaf is not None and is_leaf(x))

    def each(x: Any) -> Any:
        if has_partition(x) and not (is_leaf is not None and is_leaf(x)):
            return _filter_node(x, keep, replace, is_leaf)
        return x if keep(x) else replace

    return jtu.tree_map(each, tree, is_leaf=stop)


def _filter_node(module: Any, keep: Keep, replace: Any, is_leaf: Any) -> Any:
    if not any(map(keep, _filterable_static_leaves(module))):
        # The array side: the node in its own form, its children filtered.
        children = partition_of(module)[0]
        node = jtu.tree_structure(module, is_leaf=lambda x: x is not module)
        return node.unflatten([_filter(c, keep, replace, is_leaf) for c in children])
    cls = type(module)
    if fields_of(cls).carrier:  # exposed, a carrier is its layer
        return _filter(real_layer(module), keep, replace, is_leaf)
    attrs = materialise(module)
    names = fields_of(cls).names
    return exposed_module(
        cls, {n: _filter(attrs[n], keep, replace, is_leaf) for n in names}
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
    if (
        not _is_function(filter_spec)
        or (filter_spec in _ARRAY_FILTERS and not inverse)
        or not holds_modules(pytree)
    ):
        return original_filter(pytree, filter_spec, inverse, replace, is_leaf)

    def keep(x: Any) -> bool:
        return bool(filter_spec(x)) != inverse

    return _filter(pytree, keep, replace, is_leaf)


def partition(
    pytree: Any,
    filter_spec: Any,
    replace: Any = None,
    is_leaf: Callable[[Any], bool] | None = None,
) -> tuple[Any, Any]:
    """`eqx.partition` that puts an AutoModule's non-array values in the static
    half."""
    return (
        filter(pytree, filter_spec, False, replace, is_leaf),
        filter(pytree, filter_spec, True, replace, is_leaf),
    )


def _is_exposed(x: Any) -> bool:
    """An AutoModule in the exposed form, or an `eqx.nn` layer (a carrier's exposed
    form)."""
    if not has_partition(x):
        return True
    kinds = partition_of(x)[1].layout.kinds
    spec = fields_of(type(x))
    return all(
        k not in (STATIC, HOLED, CARRIED) or d
        for k, d in zip(kinds, spec.declared_static)
    )


def _array_side(module: Any) -> dict[str, Any]:
    """A node's values with None for each non-array one not declared static: what
    a tree in the node's own form contributes beside exposed trees."""
    children, aux = partition_of(module)
    layout = aux.layout
    spec = fields_of(type(module))
    attrs = materialise(module)
    values = {
        n: (attrs[n] if d else None) for n, d in zip(spec.names, spec.declared_static)
    }
    for name, kind, child in zip(layout.child_names, layout.child_kinds, children):
        values[name] = with_layers(child) if kind in (CARRIED, HOLED) else child
    return values


def _as_layer(carrier: Any, values: dict[str, Any]) -> Any:
    layer = object.__new__(carrier_classes[type(carrier)])
    object.__getattribute__(layer, "__dict__").update(values)
    return layer


def _combine_nodes(xs: tuple[Any, ...], is_leaf: Any) -> Any:
    """`combine` at a position holding AutoModules (or carriers and their layers)."""
    present = [x for x in xs if x is not None]
    exposed = any(map(_is_exposed, present))

    def side(x: Any) -> Any:
        if x is None or not has_partition(x):
            return x
        if not exposed or _is_exposed(x):
            return x if not fields_of(type(x)).carrier else real_layer(x)
        values = _array_side(x)
        return _as_layer(x, values) if fields_of(type(x)).carrier else values

    sides = [side(x) for x in xs]
    first = next(x for x in present if has_partition(x))
    cls = type(first)
    if fields_of(cls).carrier:  # layers, combined as Equinox combines them
        return combine(*sides, is_leaf=is_leaf)
    names = fields_of(cls).names
    values = [
        None if s is None else (s if type(s) is dict else materialise(s)) for s in sides
    ]
    return new_decided(cls, {n: _combine_field(values, n, is_leaf) for n in names})


def _combine_field(values: list[Any], name: str, is_leaf: Any) -> Any:
    """One field of combined nodes: a side whose field is None (a field with no
    array, on the array side) contributes nothing, whatever the other sides hold
    there (a whole module, in Equinox's form of the non-array side)."""
    parts = [v[name] for v in values if v is not None and v[name] is not None]
    return combine(*parts, is_leaf=is_leaf) if parts else None


def combine(*pytrees: Any, is_leaf: Callable[[Any], bool] | None = None) -> Any:
    """`eqx.combine` that joins an AutoModule's arrays from one tree with its
    non-array values from another."""
    try:
        return original_combine(*pytrees, is_leaf=is_leaf)
    # JAX's message for mismatched trees can itself fail (an AttributeError).
    except (ValueError, TypeError, AttributeError):
        if not any(map(holds_modules, pytrees)):
            raise

    def stop(x: Any) -> bool:
        return x is None or has_partition(x) or (is_leaf is not None and is_leaf(x))

    def each(*xs: Any) -> Any:
        present = [x for x in xs if x is not None]
        if not present:
            return None
        if any(map(has_partition, present)):
            return _combine_nodes(xs, is_leaf)
        return present[0]

    return jtu.tree_map(each, *pytrees, is_leaf=stop)


filter.__doc__ = original_filter.__doc__
partition.__doc__ = eqx.partition.__doc__
combine.__doc__ = original_combine.__doc__
