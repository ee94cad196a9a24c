"""Templates: instances unflattened from leaves that are not all arrays.

A node's flatten is the split of what its fields hold now (`_node`), but JAX's pytree
contract asks more of a node unflattened from any leaves: flattened again, it has the
same structure, whatever it holds (a tree of `0`s as a vmap `in_axes`, of
`ShapeDtypeStruct`s, of bools as a filter spec, of names as orbax makes them; deciding
from such leaves is what inox abandoned). Such an instance is a *template*: it
flattens as the aux and children it was unflattened with. It is told apart when
unflattened: a child's leaf that is no array. (A `None` is an empty child, as in an
`eqx.Module`, so a model's arrays mapped to `None`s split as the arrays did, and that
tree needs no template; but a mixed field's child that no split gives, `None` or
optax's `MaskedNode()` for the whole field or where a container item was, makes one:
its fill counts the misfit, `_split.misfits`.) The exposed form (`_exposed`) is a template whose plan
makes every field a child, and an array half (`_exposed.array_half`) one holding
Equinox's attributes.
"""

import operator
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Final

import equinox as eqx
import jax.tree_util as jtu

from ._carriers import layer_of
from ._fields import fields_of
from ._leaves import (
    all_real,
    ARRAY,
    BUILTIN_NODES,
    CARRIER,
    category,
    CONTAINER,
    is_array,
    LAYER,
    leaf_types,
    NDARRAY,
    NODES,
    NUMBER,
    REAL,
    real_types,
    SHAPE,
    stops,
)
from ._plan import Aux, entry_types, plan_for
from ._retrace import is_traced, note_held_numbers
from ._split import whole
from ._ways import BOTH, CHILD, ENTRY


def real_items(children: Any) -> bool:
    """Whether each child is of a type a real model holds, or a list, tuple or dict
    whose leaves are (`leaf_types`: a stack of layers, a dict of arrays)."""
    for child in children:
        kind = type(child)
        if kind in real_types:
            continue
        if kind not in BUILTIN_NODES or not real_types.issuperset(leaf_types(child)):
            return False
    return True


def settle(obj: Any, attrs: dict[str, Any], aux: Aux, children: Any) -> None:
    """For an instance whose children are not all of types a real model holds:
    carriers an `is_leaf` tree_map gave back become their layers, and if a leaf of
    the children is still not one a model holds there, the instance is a template.
    While tracing, the numbers in its fields annotated to hold arrays (held static
    by the caller) are counted."""
    leaves = jtu.tree_leaves(children, is_leaf=stops)
    lost = _holes_misfit(aux, children)
    if any(category(x) == CARRIER for x in leaves):
        for name, part in zip(aux[0].names, aux[0].parts):
            if part != ENTRY and name in attrs:
                attrs[name] = jtu.tree_map(layer_of, attrs[name], is_leaf=stops)
    if aux[0].exposed or lost or not _a_model_s(type(obj), aux, children, leaves):
        remember_template(obj, aux, children)
    if is_traced():
        note_held_numbers(type(obj), aux[0], children)


def _a_model_s(cls: type, aux: Aux, children: Any, leaves: list[Any]) -> bool:
    """Whether `children` (of `leaves`) are what a model's flatten gives: every leaf
    one a real model holds, or a Python number or `ShapeDtypeStruct` in a field
    annotated to hold arrays (loop state: `num_steps = 0`, a leaf there), where the
    node also holds an array or a module that is no template (a tree mapped from a
    model, as `eqx.apply_updates` maps one, not a tree of labels)."""
    kinds = set(map(category, leaves))
    if kinds <= REAL:
        return True
    if not kinds <= _IN_ARRAY_FIELDS or not any(map(_shows_a_model, leaves)):
        return False
    spec = fields_of(cls)
    array_field = dict(zip(spec.names, spec.array_fields))
    return all(
        array_field[name] or all_real(child)
        for name, part, child, _ in _node_fields(aux, children)
        if part != ENTRY
    )


# What a field annotated to hold arrays holds as leaves in a model.
_IN_ARRAY_FIELDS: Final = REAL | {NUMBER, SHAPE}


def _shows_a_model(x: Any) -> bool:
    kind = category(x)
    return kind in (ARRAY, NDARRAY) or (kind in NODES and _record(x) is None)


def _holes_misfit(aux: Aux, children: Any) -> bool:
    """Whether a mixed field's child is not shaped as its holes say (`None`, optax's
    `MaskedNode()` for the whole field or where a container item was): a tree mapped
    from one that held a leaf there, which no split of a value gives."""
    if BOTH not in aux[0].parts:
        return False
    return any(
        part == BOTH and not entry.fits(child)
        for _, part, child, entry in _node_fields(aux, children)
    )


def _node_fields(aux: Aux, children: Any) -> Iterator[tuple[str, int, Any, Any]]:
    """Each field of a node, `(name, part, child, entry)`: its child and its entry
    (`None` for a part without one), as the plan orders them."""
    child_of, entry_of = iter(children), iter(aux[1:])
    for name, part in zip(aux[0].names, aux[0].parts):
        child = next(child_of) if part != ENTRY else None
        entry = next(entry_of) if part != CHILD else None
        yield name, part, child, entry


# Templates, by id: each with a weak reference to it, and the aux and children it
# flattens as.
templates: dict[int, tuple["weakref.ref[Any]", Aux, tuple[Any, ...]]] = {}


def template_aux(obj: Any) -> Aux | None:
    """The aux a template flattens as; None for any other instance."""
    template = templates.get(id(obj))
    return template[1] if template is not None and template[0]() is obj else None


def remember_template(obj: Any, aux: Aux, children: tuple[Any, ...]) -> None:
    """Makes `obj` flatten as `aux` and `children`, whatever it holds, while it
    lives: a tree mapped from a model keeps the model's structure, exactly (JAX's
    pytree contract), even where it holds other values in the holes of a mixed
    field."""
    key = id(obj)
    try:
        ref = weakref.ref(obj, lambda _, forget=templates.pop: forget(key, None))
    except TypeError:  # not weakly referenceable: flattened from its values
        return
    templates[key] = (ref, aux, tuple(children))


def template_state(obj: Any) -> Any:
    """What makes `obj` or the layers it holds templates, for a copy of it: its aux
    and children (None where it is no template), and those of the layers among its
    children, or its attributes, that are templates (an `eqx.filter_eval_shape`
    skeleton of layers; a copy or a pickle carries them beside the attribute values:
    `restore_template`). None where neither is."""
    record = _record(obj)
    if record is None:
        start = list(object.__getattribute__(obj, "__dict__").values())
    else:
        start = record[1]
    layers, pending = [], [start]
    while pending:
        for x in jtu.tree_leaves(pending.pop(), is_leaf=stops):
            if category(x) != LAYER:
                continue
            inner = _record(x)
            if inner is None:  # an `MLP` or `Sequential` holding template layers
                pending.append(list(object.__getattribute__(x, "__dict__").values()))
            else:
                layers.append((x, *inner))
                pending.append(inner[1])
    if record is None and not layers:
        return None
    return record, tuple(layers)


def restore_template(obj: Any, state: Any) -> None:
    """Makes `obj`, a copy, and its copied layers the templates the originals are
    (`state` from `template_state`, copied with them)."""
    record, layers = state
    if record is not None:
        remember_template(obj, *record)
    for layer, layer_aux, layer_children in layers:
        remember_template(layer, layer_aux, layer_children)


def _record(obj: Any) -> tuple[Aux, tuple[Any, ...]] | None:
    template = templates.get(id(obj))
    if template is None or template[0]() is not obj:
        return None
    return template[1], template[2]


def take_structure(layer: Any, aux: Aux) -> bool:
    """Makes `layer`, put in a tree mapped from a model in place of a layer whose
    node's aux is `aux` (a subtree mapped from a standalone `eqx.nn` layer, whose
    function fields Equinox makes leaves), a template of that structure: its values
    where `aux` has children, the static values `aux` holds (the model's) elsewhere.
    Left as it is where it holds an array, or `aux` has a mixed field: False."""
    if BOTH in aux[0].parts or _holds_array(layer):
        return False
    _remember_as(layer, aux)
    return True


def changed_children_only(old: Any, new: Any, aux: Aux) -> bool:
    """Whether some field of layer `new` does not hold `old`'s value, and each such
    field is one that `old`'s node, of aux `aux`, has as a child."""
    before, after = (object.__getattribute__(x, "__dict__") for x in (old, new))
    plan = aux[0]
    changed = [
        part
        for name, part in zip(plan.names, plan.parts)
        if before.get(name) is not after.get(name)
    ]
    return bool(changed) and all(part == CHILD for part in changed)


def keep_shape(old: Any, new: Any, mapped: bool) -> None:
    """Makes `new`, made by `eqx.tree_at` in place of `old` in a tree of labels
    mapped from a model (axes, shardings, flags), a template of `old`'s node, so that
    the tree stays a prefix of the model: the same aux, each changed field's child
    its new value less the model's static leaves still in place, as a replaced
    subtree is in an `eqx.Module`; a label put at a static field stands for no
    array, and the model's static value stays. `old` is a template; or, with
    `mapped` (a tree without leaves, as an `in_axes` of `None`s starts, or a model
    holding no array), any AutoModule, left decided from its values where a static
    field changed or a value put is no label or sits where a static leaf was."""
    record = _record(old)
    if record is None and mapped:
        children, shape = jtu.tree_flatten(old, is_leaf=lambda x: x is not old)
        record = shape.node_data()[1], tuple(children)
    if record is None or record[0][0].exposed:
        return
    aux, children = record
    before, after = (object.__getattribute__(x, "__dict__") for x in (old, new))
    kept, changed = [], False
    for name, part, child, entry in _node_fields(aux, children):
        value = after.get(name, child)
        if name in after and not _same_leaves(before.get(name), value):
            changed = True
            if part == ENTRY:  # a label where the model has no array: nothing
                if mapped:  # a model holding no array, maybe: decided afresh
                    return
                continue
            child, clash = (
                (value, False) if part == CHILD else _without_holes(entry, value)
            )
            if mapped and (clash or not _labels_or_kept(child)):
                return
        if part != ENTRY:
            kept.append(child)
    if changed:  # else `new` is `old` unflattened from its flatten: its node already
        remember_template(new, aux, tuple(kept))


def _labels_or_kept(child: Any) -> bool:
    """Whether every leaf of `child` is a label or a node that is a template (a
    module or layer inside it kept so by the same `tree_at`, or mapped from one)."""
    leaves = jtu.tree_leaves(child, is_leaf=stops)
    return all(_is_label(x) or _record(x) is not None for x in leaves)


def labels_only(tree: Any) -> bool:
    """Whether every leaf of `tree` is a label (`_is_label`)."""
    return all(map(_is_label, jtu.tree_leaves(tree, is_leaf=stops)))


def _is_label(x: Any) -> bool:
    """An axis, a sharding, a flag: what a tree mapped from a model holds, never a
    function or an array a model would."""
    return category(x) not in (CONTAINER, *NODES) and not (callable(x) or is_array(x))


_MISSING: Any = object()


def _without_holes(entry: Any, value: Any) -> tuple[Any, bool]:
    """`value`, a mixed field's value changed by `tree_at`, with each static leaf
    of its `entry` (`Holes`, `FlatHoles`) still at its place put back to `None`: its
    child; and whether another value sits where a static leaf was."""
    place = entry.places()
    held = {place(i): leaf for i, leaf in entry.held()}
    clashes = []

    def child_leaf(path: Any, x: Any) -> Any:
        static = held.get(jtu.keystr(path), _MISSING)
        if static is _MISSING:
            return x
        if static is x or _equal(static, x):
            return None
        clashes.append(x)
        return x

    # A `None` is looked at too: put where a static leaf was, it is no hole.
    found = jtu.tree_map_with_path(child_leaf, value, is_leaf=_stops_or_none)
    return found, bool(clashes)


def _stops_or_none(x: Any) -> bool:
    return x is None or stops(x)


def _equal(static: Any, x: Any) -> bool:
    if type(static) is not type(x):
        return False
    try:
        return bool(static == x)
    except Exception:  # a comparison without a truth value: another value
        return False


def _same_leaves(a: Any, b: Any) -> bool:
    """Whether `a` and `b` have one structure and the very same leaves: a node
    inside that `tree_at` rebuilt without changing it is the same."""
    leaves_a, treedef_a = jtu.tree_flatten(a)
    leaves_b, treedef_b = jtu.tree_flatten(b)
    return treedef_a == treedef_b and all(map(operator.is_, leaves_a, leaves_b))


def take_markers(layer: Any) -> None:
    """Makes `layer`, put in a tree mapped from a model where the tree held no layer
    (a filter spec's `False` for a whole layer, replaced by the standalone layer
    mapped to `True`s), a template of the structure its class's static markers give,
    as in an `eqx.Module`: a real layer's, where every unmarked field holds arrays.
    Left as it is where it holds an array."""
    if not _holds_array(layer):
        remember_fields(layer)


def remember_fields(
    obj: Any, *, keep_declared_static: bool = True, exposed: bool = False
) -> None:
    """Makes `obj` a template whose every field is a child, as an `eqx.Module`
    without static markers flattens, except with `keep_declared_static` those its
    class declares `eqx.field(static=True)` (aux entries, as Equinox keeps them).
    `exposed`: the exposed form's (`_exposed`), whose layers flatten as the nodes
    they are, not as carriers."""
    spec = fields_of(type(obj))
    attrs = object.__getattribute__(obj, "__dict__")
    parts = tuple(
        ENTRY if keep_declared_static and marked else CHILD
        for marked in spec.declared_static
    )
    entries = [whole(attrs[n]) for n, part in zip(spec.names, parts) if part == ENTRY]
    plan = plan_for(spec, parts, entry_types(parts, entries), exposed)
    _remember_as(obj, (plan, *entries))


def _holds_array(layer: Any) -> bool:
    return any(map(eqx.is_array, jtu.tree_leaves(layer)))


def _remember_as(obj: Any, aux: Aux) -> None:
    """Makes `obj` a template of `aux`: its children the values of the fields `aux`'s
    plan has as children."""
    plan = aux[0]
    attrs = object.__getattribute__(obj, "__dict__")
    kept = [name for name, part in zip(plan.names, plan.parts) if part == CHILD]
    remember_template(obj, aux, tuple(attrs[name] for name in kept))


def flatten_template(
    template: tuple[Any, Aux, tuple[Any, ...]], node_child: Callable[[Any], Any]
) -> tuple[tuple[Any, ...], Aux]:
    """The node of a template: as it was unflattened, whatever it holds now (its
    layers made carriers again, unless it is in the exposed form)."""
    _, aux, children = template
    if aux[0].exposed:
        return children, aux
    return tuple(_with_nodes(c, node_child) for c in children), aux


def _with_nodes(value: Any, node_child: Callable[[Any], Any]) -> Any:
    """`value` with each node item in it as `node_child` gives it: the value itself
    if that changes none (it is then a node of the pytree, as `eqx.tree_at` needs)."""
    if category(value) in NODES:
        return node_child(value)
    if category(value) != CONTAINER:
        return value
    leaves, treedef = jtu.tree_flatten(value, is_leaf=stops)
    given = [node_child(x) if stops(x) else x for x in leaves]
    if all(map(operator.is_, given, leaves)):
        return value
    return treedef.unflatten(given)
