"""The exposed form of a tree: every AutoModule with all its fields as children (as an
`eqx.Module` without static markers flattens), every carrier the layer it stands for.

Equinox's functions that look at non-array leaves (`eqx.tree_at` on a static value,
`eqx.tree_serialise_leaves`, `eqx.nn.inference_mode`, a filter of non-arrays) work on
this form; `decide_again` makes AutoModules of an exposed tree again, each flattened
from its values from then on, and `keep_layer_structures` and `keep_module_structures`
give the layers and AutoModules that `eqx.tree_at` made in a tree mapped from a model
(a filter spec) that model's structure.
"""

import functools
from collections.abc import Callable
from typing import Any

import jax.tree_util as jtu

from .._compat import flatten_none_leaves
from ._carriers import carrier_aux, get_layer, layer_of, layers_as_nodes
from ._fields import fields_of
from ._leaves import (
    CARRIER,
    category,
    is_array,
    is_dynamic,
    is_dynamic_leaf,
    LAYER,
    NODE,
    SHAPE,
    snapshot,
    stops,
)
from ._node import to_carrier
from ._templates import (
    changed_children_only,
    keep_shape,
    remember_fields,
    remember_template,
    take_markers,
    take_structure,
    template_aux,
    templates,
)


def is_ours(x: Any) -> bool:
    """An AutoModule, or a carrier of an `eqx.nn` layer handed out by a flatten."""
    return category(x) in (NODE, CARRIER)


def holds_modules(tree: Any) -> bool:
    """Whether `tree` holds an AutoModule (or a carrier): a tree that Equinox's
    functions, routed, see in the exposed form."""
    return any(map(is_ours, jtu.tree_leaves(tree, is_leaf=is_ours)))


def _map_modules(fn: Callable[[Any], Any], tree: Any) -> Any:
    """`fn` on every AutoModule and carrier in `tree` (not inside them)."""
    return jtu.tree_map(lambda x: fn(x) if is_ours(x) else x, tree, is_leaf=is_ours)


def exposed_module(
    cls: type, values: dict[str, Any], *, keep_declared_static: bool = True
) -> Any:
    """A `cls` instance with these values, every field a child (as an `eqx.Module`
    without static markers flattens), except with `keep_declared_static` those
    declared `eqx.field(static=True)`, which Equinox keeps in its aux data too."""
    obj = new_module(cls, values)
    remember_fields(obj, keep_declared_static=keep_declared_static, exposed=True)
    return obj


def is_exposed(module: Any) -> bool:
    """Whether `module` is an AutoModule in the exposed form."""
    aux = template_aux(module)
    return aux is not None and aux[0].exposed


def holds_exposed(tree: Any) -> bool:
    """Whether `tree` holds an AutoModule in the exposed form (a template: none does
    while no template lives)."""
    if not templates:
        return False
    return any(map(is_exposed, jtu.tree_leaves(tree, is_leaf=is_ours)))


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
        if category(module) == CARRIER:
            return _map_modules(expose_module, get_layer(module))
        cls = type(module)
        attrs = object.__getattribute__(module, "__dict__")
        values = {
            n: _map_modules(expose_module, snapshot(attrs[n]))
            for n in fields_of(cls).names
            if n in attrs
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
    """Every AutoModule of `tree` made anew from its current values, flattened from
    them from then on; one that an operation on the exposed tree left unchanged is the
    module it was exposed from, unflattened from its own flatten as a tree operation
    gives an unchanged `eqx.Module` (`originals`; dicts in key order): deciding it
    again could give another structure (an optax `MaskedNode` where an array was)
    where nothing was changed."""

    def decide_module(module: Any) -> Any:
        if category(module) == CARRIER:
            return get_layer(module)
        if originals:
            original = originals.get(_identity_key(module))
            if original is not None:
                leaves, treedef = jtu.tree_flatten(original)
                return jtu.tree_unflatten(treedef, leaves)
        cls = type(module)
        attrs = object.__getattribute__(module, "__dict__")
        return new_module(
            cls, {n: _map_modules(decide_module, v) for n, v in attrs.items()}
        )

    return _map_modules(decide_module, tree)


def keep_layer_structures(tree: Any, out: Any, labelled: bool) -> None:
    """In a tree mapped from a model (a filter spec, optimiser labels), each
    `eqx.nn` layer that `eqx.tree_at` made anew in `out` keeps the structure of the
    layer at its place in `tree` (`_templates.take_structure`): a label put in a
    layer's field, or a subtree mapped from the standalone layer, still matches the
    model. One put where the tree held no layer takes its class's static markers
    (`_templates.take_markers`). A tree without leaves (not `labelled`) may be a
    model holding no array: there a layer whose static value changed is decided from
    its values (a spec's labels, in a tree without leaves, are only what `tree_at`
    put at the model's array places)."""
    with layers_as_nodes():
        before, after = _nodes_by_path(tree, LAYER), _nodes_by_path(out, LAYER)
    for path, new in after.items():
        old = before.get(path)
        if old is None:
            if labelled:
                take_markers(new)
        elif new is not old and type(new) is type(old):
            aux = carrier_aux(to_carrier(old))
            if labelled or changed_children_only(old, new, aux):
                take_structure(new, aux)


def keep_carrier_structure(carrier: Any, out: Any) -> bool:
    """Makes `out`, the layer `eqx.tree_at` made from `carrier` (in an `is_leaf`
    callback) with labels put at its arrays, a template of the carrier's node
    (`_templates.take_structure`), as a subtree mapped from the carrier is: a tree
    of labels per layer (shardings, a filter spec) keeps the model's structure.
    False where `out` still holds an array."""
    return take_structure(out, carrier_aux(carrier))


def holds_template_layers(tree: Any) -> bool:
    """Whether `tree` holds an `eqx.nn` layer that is a template: a subtree of labels
    mapped from a held layer's carrier (`jax.tree.map(f, carrier)` in an `is_leaf`
    callback), in the model's structure."""
    if not templates:
        return False
    with layers_as_nodes():
        layers = _nodes_by_path(tree, LAYER).values()
    return any(template_aux(layer) is not None for layer in layers)


def layers_by_markers(tree: Any) -> None:
    """Makes each `eqx.nn` layer in `tree` that holds no array (one Equinox's
    `tree_at` rebuilt from a tree of labels, to hand to a `replace_fn`) flatten by
    its class's static markers, as Equinox's node of it (`_templates.take_markers`):
    its labels are children, not static values."""
    with layers_as_nodes():
        layers = _nodes_by_path(tree, LAYER).values()
    for layer in layers:
        take_markers(layer)


def keep_module_structures(tree: Any, out: Any) -> None:
    """In a tree of labels mapped from a model (a vmap `in_axes`, a sharding or
    filter spec: templates, or a tree of `None`s), each AutoModule that `tree_at`
    made anew in `out` from the exposed form keeps the node of the one at its place
    in `tree`, with the new values as children (`_templates.keep_shape`), and so
    does each layer (`keep_layer_structures`). A tree holding arrays,
    `ShapeDtypeStruct`s or floats is a model (a template too where it holds a
    number for an array, or made by `eqx.filter_eval_shape`), and so is one without
    leaves or `None`s: decided from its values."""
    leaves = jtu.tree_leaves(tree)
    if any(is_array(x) or category(x) == SHAPE or type(x) is float for x in leaves):
        return
    mapped = not leaves  # `None`s: an `in_axes` being made
    if mapped and not holds_none(tree):  # a model holding no array
        return
    if not (templates or mapped):  # no template lives: nothing mapped from a model
        return
    keep_layer_structures(tree, out, labelled=not mapped)
    with layers_as_nodes():
        before, after = _nodes_by_path(tree, NODE), _nodes_by_path(out, NODE)
    for path, new in reversed(after.items()):  # inner modules first: kept or not
        old = before.get(path)
        if old is not None and new is not old and type(new) is type(old):
            keep_shape(old, new, mapped)


def holds_none(tree: Any) -> bool:
    """Whether `tree` holds a `None`: a tree without leaves that does not may be a
    model holding no array, but is no tree mapped to `None`s from a model's leaves."""
    leaves, _ = flatten_none_leaves(tree, False)
    return any(x is None for x in leaves)


def _nodes_by_path(tree: Any, kind: int) -> dict[Any, Any]:
    """Every `eqx.nn` layer (`kind` LAYER) or AutoModule (NODE) in `tree`, inside
    any node too, by key path, each before those inside it; in surgery mode, where
    each layer is a node of the tree."""
    found: dict[Any, Any] = {}
    pending = [((), [tree])]  # in a list: `tree` itself may be one
    while pending:
        prefix, top = pending.pop()
        inner = functools.partial(_is_inner, top, kind)
        for path, x in jtu.tree_flatten_with_path(top, is_leaf=inner)[0]:
            if inner(x):
                found[prefix + path] = x
                pending.append((prefix + path, x))
    return found


def _is_inner(top: Any, kind: int, x: Any) -> bool:
    return x is not top and category(x) == kind


def new_module(cls: type, attrs: dict[str, Any]) -> Any:
    """A new `cls` instance holding `attrs`, without `__init__`."""
    obj = object.__new__(cls)
    object.__getattribute__(obj, "__dict__").update(attrs)
    return obj


def dynamic_half(module: Any, replace: Any = None) -> dict[str, Any]:
    """A module's field values with `replace` for each static leaf, as
    `eqx.filter(module, eqx.is_array, replace=replace)` gives an `eqx.Module`'s
    without static markers; fields declared `eqx.field(static=True)` keep their
    values, as Equinox keeps them."""
    spec = fields_of(type(module))
    attrs = object.__getattribute__(module, "__dict__")
    out = {}
    for name, declared, array_field in zip(
        spec.names, spec.declared_static, spec.array_fields
    ):
        if name in attrs:
            value = attrs[name]
            out[name] = value if declared else _replaced(value, array_field, replace)
    return out


def _replaced(value: Any, array_field: bool, replace: Any) -> Any:
    def leaf(x: Any) -> Any:
        if stops(x):
            return layer_of(x)
        return x if is_dynamic(x, array_field) else replace

    return jtu.tree_map(leaf, value, is_leaf=stops)


def array_half(
    node: Any, aux: tuple, children: tuple[Any, ...], replace: Any = None
) -> Any:
    """`node`, unflattened from a module's arrays (`children`, with `aux`), holding
    what `eqx.filter(module, eqx.is_array, replace=replace)` gives an `eqx.Module`:
    `replace` for each static leaf. It flattens as it was unflattened, so its treedef
    is the model's (that of its gradients), and a static half made from it later
    holds no static value of the model (optimistix compares such halves of two
    `lax.cond` branches)."""
    object.__getattribute__(node, "__dict__").update(dynamic_half(node, replace))
    remember_template(node, aux, children)
    return node


def layer_static_leaves(module: Any) -> list[Any]:
    """The non-array leaves Equinox's filter would see in the `eqx.nn` layers a
    module's fields not declared static hold (a `Dropout`'s rate, an `MLP`'s
    activation)."""
    leaves = jtu.tree_leaves(_unmarked_values(module), is_leaf=stops)
    layers = [x for x in leaves if category(x) == LAYER]
    return [x for x in jtu.tree_leaves(layers) if not is_dynamic_leaf(x)]


def static_leaves_of(module: Any) -> list[Any]:
    """The non-array leaves of a module's own fields that Equinox's filter would see:
    those of its fields not declared static, nodes in them excluded."""
    leaves = jtu.tree_leaves(_unmarked_values(module), is_leaf=stops)
    return [x for x in leaves if not stops(x) and not is_dynamic_leaf(x)]


def _unmarked_values(module: Any) -> list[Any]:
    """The values of a module's fields not declared static, which Equinox's filter
    sees."""
    spec = fields_of(type(module))
    attrs = object.__getattribute__(module, "__dict__")
    return [
        attrs[name]
        for name, declared in zip(spec.names, spec.declared_static)
        if not declared and name in attrs
    ]
