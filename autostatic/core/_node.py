"""A node's flatten and unflatten: what JAX calls for every AutoModule, and for every
carrier of an `eqx.nn` layer in one.

The one rule: **a node's flatten is the split of the field values it holds now.**
Nothing is stored per instance, so nothing can go stale: a container changed in
place, a field written by `object.__setattr__`, a module inside changed, are seen by
the next flatten as by an `eqx.Module`'s. What keeps that cheap is the plan found
per class and per tuple of the field values' types (`_plan`), and the code
generated for the types and plan a class's instances have (`_generated`). The one
exception is a template (`_templates`). Unflatten fills the attributes in at once.
"""

import functools
import threading
import weakref
from collections.abc import Callable
from typing import Any, Final

import jax.tree_util as jtu
import numpy as np
from jax.core import Tracer

from .._compat import FlattenFunctions
from . import _retrace
from ._carriers import (
    carrier_class,
    carriers_of,
    get_flat,
    get_layer,
    in_surgery,
    layer_of,
    new_carrier,
    stacks,
    surgeries,
)
from ._fields import fields_of, FieldSpec
from ._generated import (
    dispatcher,
    fast_flatten,
    fast_stack,
    fast_unflatten,
    specialise,
    STACKED,
    unflatten_dispatcher,
)
from ._leaves import as_is_types, CARRIER, category, LAYER, leaf_types, real_types
from ._plan import (
    Aux,
    entry_of,
    entry_types,
    new_signature,
    Plan,
    plan_for,
    Signature,
    UNSET,
    values_while_built,
)
from ._split import (
    FlatHoles,
    misfits,
    RAW,
    records,
    split,
    static_value,
    StaticSeq,
)
from ._static import hold
from ._templates import (
    flatten_template,
    real_items,
    settle,
    templates,
)
from ._ways import (
    CARRY,
    CHILD,
    ENTRY,
    HOLD,
    HOLD_FLOAT,
    item_way,
    ITEMS,
    KEEP,
    LAYERS,
    PART_OF,
    ROWS,
    SEQUENCE,
    SPLIT,
    TAKE,
    TREE,
    WHOLE,
)

_object_getattribute = object.__getattribute__
_object_new = object.__new__


def flatten(spec: FieldSpec, obj: Any) -> tuple[tuple[Any, ...], Aux]:
    """The node of `obj`, an instance of `spec`'s class: its children and aux."""
    return spec.flatten(obj)


def install_flatten(spec: FieldSpec) -> None:
    """Gives `spec`'s class its general flatten (`_general_flatten`), until one
    generated for the field types it meets replaces it (`_install_fast`)."""
    spec.flatten = spec.general_flatten = _general_flatten(spec)


def _install_fast(spec: FieldSpec, values: tuple[Any, ...], types: Any, aux: Aux):
    """Gives the class's flatten (the carrier maker of a layer class) one generated
    for these field types (of concrete arrays, static values kept as they are and
    lists or tuples of ints, bools and strings), with the plan of this instance's
    `aux`: the first replaces the general flatten, each later one is what the one
    before calls for other types. Called while fewer than `_MOST_GENERATED` are."""
    signature = spec.signatures.get(types)
    if not spec.names or signature is None or signature.tried >= _TRIES_PER_SIGNATURE:
        return
    if any(issubclass(t, Tracer) for t in types):  # met while tracing: not the model's
        return
    if in_surgery():  # the layers are nodes: their carrier makers may not exist yet
        return
    with _generating:
        tried, made = signature.tried, len(spec.generated)
        if tried < _TRIES_PER_SIGNATURE and made < _MOST_GENERATED:
            signature.tried += 1
            _generate(spec, signature, values, types, aux[0])


# Held while code is generated and installed: two threads meeting a new class's
# first instances at once would otherwise run one's code with the other's names.
_generating: Final = threading.RLock()


def _generate(
    spec: FieldSpec,
    signature: Signature,
    values: tuple[Any, ...],
    types: Any,
    plan: Plan,
) -> None:
    """`_install_fast`'s work, one thread at a time."""
    found = _generated_ways(spec, signature, values)
    if found is None:
        return
    ways, items = found
    namespace = _generated_scope(spec, plan)
    registered = _registered.get(spec.owner)
    carrier = registered is None  # a layer class: what `to_carrier` calls
    if carrier:
        namespace["general"] = spec.general_carrier
        namespace["new"] = _object_new
        namespace["carrier_class"] = carrier_class(spec.owner, _register_carrier)
    else:
        namespace["general"] = spec.general_flatten
    fast = fast_flatten(spec.owner, spec.names, types, ways, namespace, carrier, items)
    if spec.generated:
        _chain(spec, fast)
    elif registered is not None:
        specialise(registered, fast)
        spec.generated.append(registered.__globals__)
    else:
        _carried[spec.owner] = fast
        spec.generated.append(fast.__globals__)
        if STACKED.issuperset(ways):
            stacks[spec.owner] = fast_stack(
                spec.owner, spec.names, types, ways, {**namespace, "one": fast}
            )


def _generated_scope(spec: FieldSpec, plan: Plan) -> dict[str, Any]:
    """The names the code generated for `spec`'s class reads (`fast_flatten`)."""
    return {
        "templates": templates,
        "read": spec.read,
        "plan": plan,
        "aux": (plan,),
        "raw": RAW,
        "as_is": as_is_types,
        "leaf_types": leaf_types,
        "child_types": as_is_types,
        "sequence": StaticSeq,
        "hold": hold,
        "carried": _carried,
        "stack_of": stack_of,
        "flat_holes": FlatHoles,
        "records": records,
        **{f"a{i}": array for i, array in enumerate(spec.array_fields)},
        "surgeries": surgeries,
        "in_surgery": in_surgery,
    }


# Flattens generated per class: a class whose instances hold other field types (an
# activation that is a `custom_jvp` in one layer and a function in the next, a list
# of dicts in one model and a dict of dicts in another) takes generated code for
# each of the first few.
_MOST_GENERATED: Final = 4
# Flattens generated per tuple of field types: the ways follow from the types, but a
# list's contents may take another (a list of dicts, then one of records).
_TRIES_PER_SIGNATURE: Final = 2


def _chain(spec: FieldSpec, fast: Callable[..., Any]) -> None:
    """Makes `fast` (which calls the general flatten for other field types) the
    flatten that the last one generated for `spec`'s class calls for them."""
    spec.generated.append(fast.__globals__)
    spec.generated[-2]["general"] = fast


def _generated_ways(
    spec: FieldSpec, signature: Signature, values: tuple[Any, ...]
) -> tuple[tuple[str, ...], dict[int, Any]] | None:
    """The way the generated flatten takes each field (`_ways`: the signature's, or
    one narrower that these values allow), and the way and type of each item of a
    field taken `ITEMS`; None if the generated code takes a field no way."""
    ways, items = [], {}
    fields = zip(signature.ways, values, spec.array_fields)
    for i, (way, value, array_field) in enumerate(fields):
        sequence = type(value) in (list, tuple) and bool(value)
        if way in (TAKE, KEEP):
            ways.append(way)
        elif way == HOLD and type(value) is float:
            ways.append(HOLD_FLOAT)
        elif way == HOLD and _keyed_by_type(value):
            ways.append(HOLD)
        elif way == CARRY and category(value) == LAYER:
            ways.append(CARRY)
        elif way == SPLIT and as_is_types.issuperset(leaf_types(value)):
            ways.append(TREE)
        elif (
            way in (SPLIT, WHOLE)
            and sequence
            and not (array_field and way == SPLIT)
            and RAW.issuperset(map(type, value))
        ):
            ways.append(SEQUENCE)
        elif way == SPLIT and sequence and _all_carried(value):
            ways.append(LAYERS)
        elif way == SPLIT and sequence and (taken := _item_ways(value, array_field)):
            ways.append(ITEMS)
            items[i] = taken
        elif way == SPLIT and sequence and records(value, array_field) is not None:
            ways.append(ROWS)
        else:
            return None
    return tuple(ways), items


def _keyed_by_type(value: Any) -> bool:
    """Whether a plan keys a held static value by its type alone: not a class, which
    it keys as a dtype or not by its value (`np.float32` or `int`)."""
    return type(value) is not type


def _item_ways(value: Any, array_field: bool) -> tuple[tuple[str, type], ...] | None:
    """The way (`item_way`) and type of each item of a list or tuple whose items the
    generated flatten can take by place: `TAKE`, `CARRY` where the layer's carrier
    maker exists, `KEEP`, with at least one static item and one other; None for any
    other list or tuple."""
    taken = []
    for item in value:
        way = item_way(item, array_field)
        if way == CARRY and type(item) not in _carried:
            return None
        if way not in (TAKE, CARRY, KEEP) or type(item) is _NDARRAY:
            return None  # a numpy array's way follows from its dtype: per value
        taken.append((way, type(item)))
    found = {way for way, _ in taken}
    if KEEP not in found or found == {KEEP}:
        return None  # no static item, or no dynamic one: other ways
    return tuple(taken)


_NDARRAY: Final = np.ndarray


def _all_carried(items: Any) -> bool:
    """Whether every item is an `eqx.nn` layer whose carrier maker exists."""
    return all(category(x) == LAYER and type(x) in _carried for x in items)


def _general_flatten(spec: FieldSpec) -> Callable[[Any], tuple[tuple[Any, ...], Aux]]:
    """The flatten of `spec`'s class that takes any instance: the fields read at
    once, the plan found by the tuple of their types (`Signature`), the children
    and entries picked in C where every field is taken or kept as it is."""
    read, signatures = spec.read, spec.signatures
    # `obj.__dict__` is read in C on an AutoModule, whose `__getattribute__` is
    # object's; an `eqx.Module` has a Python one, passed by.
    direct = getattr(spec.owner, "__getattribute__", None) is _object_getattribute

    def flatten_one(obj: Any) -> tuple[tuple[Any, ...], Aux]:
        if templates:
            template = templates.get(id(obj))
            if template is not None and template[0]() is obj:
                return flatten_template(template, node_child_now())
        try:
            values = read(
                obj.__dict__ if direct else _object_getattribute(obj, "__dict__")
            )
        except KeyError:  # flattened from inside `__init__`
            values = values_while_built(spec, obj)
        types = tuple(map(type, values))
        signature = signatures.get(types)
        if signature is None:
            signature = new_signature(spec, types, values)
        children = signature.children
        if children is None:
            node = _flatten_by_ways(spec, signature, values)
        else:
            aux = signature.aux
            if aux is None:
                aux = (signature.plan, *signature.entries(values))  # pyright: ignore[reportOptionalCall]  # set with `children`
            node = children(values), aux
        if len(spec.generated) < _MOST_GENERATED:
            _install_fast(spec, values, types, node[1])
        return node

    return flatten_one


def _flatten_by_ways(
    spec: FieldSpec, signature: Signature, values: tuple[Any, ...]
) -> tuple[tuple[Any, ...], Aux]:
    node_child = node_child_now()
    children, entries, parts = [], [], []
    for i, (way, value) in enumerate(zip(signature.ways, values)):
        if way == TAKE:
            children.append(value)
        elif way == CARRY:
            children.append(node_child(value))
        elif way == SPLIT:
            part, child, entry = split(value, spec.array_fields[i], node_child)
            if part != ENTRY:
                children.append(child)
            if part != CHILD:
                entries.append(entry)
            parts.append(part)
            continue
        else:
            entries.append(entry_of(way, value))
        parts.append(PART_OF[way])
    plan = signature.plan
    if plan is None and signature.by_value:
        parts = tuple(parts)
        types = entry_types(parts, entries)
        plan = plan_for(spec, parts, types, False, signature.partial)
    elif plan is None:
        parts = tuple(parts)
        plan = signature.resolved.get(parts)
        if plan is None:
            types = entry_types(parts, entries)
            plan = plan_for(spec, parts, types, False, signature.partial)
            if len(signature.resolved) < _MOST_PARTS:
                signature.resolved[parts] = plan
    return tuple(children), (plan, *entries)


_MOST_PARTS: Final = 64  # plans kept per signature: its split fields' parts met


def node_child_now() -> Callable[[Any], Any]:
    """What a child holds for a node item in this flatten: a layer's carrier, or
    while this thread is in a surgery (`_carriers.layers_layer_ofs`) the layer."""
    return layer_of if in_surgery() else to_carrier


def to_carrier(x: Any) -> Any:
    """The carrier of layer `x` (or of a carrier's layer), its node decided now."""
    try:
        return _carried[type(x)](x)
    except KeyError:
        pass
    if category(x) == CARRIER:
        return to_carrier(get_layer(x))
    if category(x) != LAYER:
        return x  # an AutoModule: a node of its own
    spec = fields_of(type(x))
    install_flatten(spec)
    carrier = carrier_class(type(x), _register_carrier)

    def make(layer: Any) -> Any:
        return new_carrier(carrier, spec.flatten(layer), layer)

    spec.general_carrier = make
    return _carried.setdefault(type(x), make)(x)


# Per carried layer class (a few `eqx.nn` classes): what makes a layer's carrier.
_carried: dict[type, Callable[[Any], Any]] = {}


def stack_of(items: Any, types: set[type]) -> Any:
    """The carriers of the list or tuple `items` of layers (of `types`)."""
    return carriers_of(items, types, to_carrier)


def _register_carrier(carrier: type, layer_class: type) -> None:
    """Makes the new carrier class `carrier` a pytree node, whose unflatten gives a
    `layer_class` layer."""
    _registered_unflatten[layer_class] = unflatten_dispatcher(layer_class, unflatten)
    jtu.register_pytree_with_keys(
        carrier,
        with_keys(get_flat),
        functools.partial(_registered_unflatten[layer_class], layer_class),
        flatten_func=get_flat,
    )


def with_keys(
    flatten_one: Callable[[Any], tuple[tuple[Any, ...], Aux]],
) -> Callable[[Any], tuple[tuple[tuple[Any, Any], ...], Aux]]:
    """The flatten-with-keys of a node whose flatten is `flatten_one`."""

    def flatten_with_keys(obj: Any) -> tuple[tuple[tuple[Any, Any], ...], Aux]:
        children, aux = flatten_one(obj)
        return tuple(zip(aux[0].child_keys, children)), aux

    return flatten_with_keys


def unflatten(cls: type, aux: Aux, children: Any) -> Any:
    """A new `cls` instance whose attributes are the values `aux` and `children`
    stand for. One unflattened from leaves that are not all arrays is a template."""
    plan = aux[0]
    obj = _object_new(cls)
    attrs = _object_getattribute(obj, "__dict__")
    filled = misfits[0]
    if plan.order is not None:
        if type(children) is not tuple:
            children = tuple(children)
        attrs.update(zip(plan.names, plan.order(children + aux)))
    else:
        _fill(plan, attrs, aux, children)
    if (
        plan.exposed
        or not (real_types.issuperset(map(type, children)) or real_items(children))
        or misfits[0] != filled
    ):
        settle(obj, attrs, aux, children)
    elif not plan.partial and cls not in _fast_unflattens:
        _install_fast_unflatten(cls, plan, children)
    if plan.counted and plan.last_aux_id != id(aux):
        _noted(cls, aux, children)
    return obj


def _noted(cls: type, aux: Aux, children: Any) -> None:
    """The aux of a plan holding static numbers is not the last one met: while
    tracing, `_retrace` looks into it."""
    if _retrace.is_traced():
        aux[0].last_aux_id = id(aux)
        _retrace.note_new_aux(cls, aux, children)


# The classes whose registered unflatten is generated for a plan (`_generated`).
_fast_unflattens: "weakref.WeakSet[type]" = weakref.WeakSet()


def _install_fast_unflatten(cls: type, plan: Plan, children: Any) -> None:
    """Gives the registered unflatten of `cls` the code generated for `plan`, the
    first met with children of concrete arrays (not a trace's)."""
    registered = _registered_unflatten.get(cls)
    if registered is None or any(issubclass(type(c), Tracer) for c in children):
        return
    with _generating:
        if cls not in _fast_unflattens:
            _fast_unflattens.add(cls)
            specialise(registered, _unflatten_for(cls, plan))


def _unflatten_for(cls: type, plan: Plan) -> Callable[..., Any]:
    namespace = {
        "general": unflatten,
        "new": _object_new,
        "settle": settle,
        "real": real_types,
        "real_items": real_items,
        "noted": _noted,
        "static_value": static_value,
        "misfits": misfits,
    }
    return fast_unflatten(cls, plan, namespace)


def _fill(plan: Plan, attrs: dict[str, Any], aux: Aux, children: Any) -> None:
    """Puts the attribute values into `attrs`, in field order."""
    c, e = 0, 1
    for name, part in zip(plan.names, plan.parts):
        if part == CHILD:
            value = children[c]
            c += 1
        elif part == ENTRY:
            value = static_value(aux[e])
            e += 1
        else:
            value = aux[e].fill(children[c])
            c, e = c + 1, e + 1
        if value is not UNSET:
            attrs[name] = value


def flatten_functions(cls: type) -> FlattenFunctions:
    """Flatten, flatten-with-keys and unflatten for the new AutoModule class `cls`
    (Equinox registers them, with `cls` as the unflatten's first argument)."""
    spec = fields_of(cls)
    install_flatten(spec)
    spec.flatten = _registered[cls] = dispatcher(cls, spec.general_flatten)
    _registered_unflatten[cls] = unflatten_dispatcher(cls, unflatten)
    return spec.flatten, with_keys(spec.flatten), _registered_unflatten[cls]


# The flatten JAX holds for each AutoModule class, and the unflatten for each
# AutoModule and carried layer class, specialised in place.
_registered: "weakref.WeakKeyDictionary[type, Callable[[Any], Any]]" = (
    weakref.WeakKeyDictionary()
)
_registered_unflatten: "weakref.WeakKeyDictionary[type, Callable[..., Any]]" = (
    weakref.WeakKeyDictionary()
)
