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


def holds_modules(tree: Any) -> bool:
    """Whether `tree` holds an AutoModule or a carrier of an `eqx.nn` layer: a tree
    that Equinox's functions, routed, see in the exposed form."""
    return any(map(has_partition, jtu.tree_leaves(tree, is_leaf=has_partition)))


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


# Each exposed module of a tree, by `_identity_key`, and the module it was made from.
Originals = dict[tuple[Any, tuple[int, ...]], Any]


def _identity_key(exposed: Any) -> tuple[Any, tuple[int, ...]]:
    """The structure of an exposed module and the identities of its leaves: equal for
    an exposed module that a tree operation rebuilt without changing anything in it
    (while the exposed tree, which holds those leaves, is alive)."""
    leaves, treedef = jtu.tree_flatten(exposed)
    return treedef, tuple(map(id, leaves))


def expose(
    tree: Any, *, keep_declared_static: bool = False, originals: Originals | None = None
) -> Any:
    """A copy of `tree` in which every AutoModule has all its fields as children
    (`exposed_module`), and every carrier is the layer it stands for. With
    `originals`, each exposed AutoModule is recorded in it (for `decide_again`)."""

    def expose_module(module: Any) -> Any:
        cls = type(module)
        if fields_of(cls).carrier:
            return _map_modules(expose_module, real_layer(module))
        attrs = materialise(module)
        values = {
            n: _map_modules(expose_module, attrs[n]) for n in fields_of(cls).names
        }
        exposed = exposed_module(cls, values, keep_declared_static=keep_declared_static)
        if originals is not None:
            originals[_identity_key(exposed)] = module
        return exposed

    return _map_modules(expose_module, tree)


def on_exposed(operation: Callable[[Any], Any], tree: Any) -> Any:
    """`operation` (an Equinox function) on the exposed form of `tree`, its result's
    AutoModules decided again where it changed them (`decide_again`)."""
    originals: Originals = {}
    exposed = expose(tree, originals=originals)  # alive: `originals` holds its ids
    return decide_again(operation(exposed), originals)


def decide_again(tree: Any, originals: Originals | None = None) -> Any:
    """Decides the partition of every AutoModule in `tree` from its current values;
    one that an operation on the exposed tree left unchanged is the module it was
    exposed from, as it was (`originals`): deciding it again could give another
    partition (an optax `MaskedNode` where an array was), and the tree another
    structure where nothing was changed."""

    def decide_module(module: Any) -> Any:
        cls = type(module)
        if fields_of(cls).carrier:
            return module
        if originals:
            original = originals.get(_identity_key(module))
            if original is not None:
                return original
        attrs = materialise(module)
        names = fields_of(cls).names
        return new_decided(
            cls, ((n, _map_modules(decide_module, attrs[n])) for n in names)
        )

    return _map_modules(decide_module, tree)
