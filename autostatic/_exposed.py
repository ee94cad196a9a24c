"""The exposed form of a tree: every AutoModule with all its fields as children (as an
`eqx.Module` without static markers flattens), every carrier the layer it stands for.

Equinox's functions that look at non-array leaves (`eqx.tree_serialise_leaves`, its
checkpoint order, diagnostics comparing two models) work on this form; `decide_again`
makes AutoModules of an exposed tree again, deciding each partition from its values.
"""

from collections.abc import Callable
from typing import Any

import jax.tree_util as jtu

from ._carriers import real_layer
from ._fields import fields_of, has_partition
from ._layout import CHILD, layout_for, make_aux, materialise, STATIC, unflatten
from ._partition import new_decided


def _map_modules(fn: Callable[[Any], Any], tree: Any) -> Any:
    """`fn` on every AutoModule and carrier in `tree` (not inside them)."""
    return jtu.tree_map(
        lambda x: fn(x) if has_partition(x) else x, tree, is_leaf=has_partition
    )


def exposed_module(
    cls: type, values: dict[str, Any], *, keep_declared_static: bool = True
) -> Any:
    """A `cls` instance with these values, every field a child (as an `eqx.Module`
    without static markers flattens), except with `keep_declared_static` those
    declared `eqx.field(static=True)`, which Equinox keeps in its aux data too."""
    spec = fields_of(cls)
    kinds, children, entries = [], [], []
    for name, declared_static in zip(spec.names, spec.declared_static):
        if keep_declared_static and declared_static:
            kinds.append(STATIC)
            entries.append(values[name])
        else:
            kinds.append(CHILD)
            children.append(values[name])
    aux = make_aux(layout_for(cls, tuple(kinds)), tuple(entries))
    return unflatten(cls, aux, tuple(children))


def expose(tree: Any, *, keep_declared_static: bool = False) -> Any:
    """A copy of `tree` in which every AutoModule has all its fields as children
    (`exposed_module`), and every carrier is the layer it stands for."""

    def expose_module(module: Any) -> Any:
        cls = type(module)
        if fields_of(cls).carrier:
            return _map_modules(expose_module, real_layer(module))
        attrs = materialise(module)
        values = {
            n: _map_modules(expose_module, attrs[n]) for n in fields_of(cls).names
        }
        return exposed_module(cls, values, keep_declared_static=keep_declared_static)

    return _map_modules(expose_module, tree)


def decide_again(tree: Any) -> Any:
    """Decides the partition of every AutoModule in `tree` from its current values."""

    def decide_module(module: Any) -> Any:
        cls = type(module)
        if fields_of(cls).carrier:
            return module
        attrs = materialise(module)
        names = fields_of(cls).names
        return new_decided(
            cls, ((n, _map_modules(decide_module, attrs[n])) for n in names)
        )

    return _map_modules(decide_module, tree)
