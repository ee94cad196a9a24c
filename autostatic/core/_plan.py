"""How an instance's field values become its pytree node, at every flatten, and back.

The one rule: **a node's flatten is the split of the field values it holds now.**
Nothing is stored per instance, so nothing can go stale: a container changed in
place, a field written by `object.__setattr__`, a module inside changed, are seen by
the next flatten as by an `eqx.Module`'s. What makes that cheap is the `Plan`, kept
per class and per tuple of the field values' types: which field is a child, a static
entry, or to be split (`_split`), found once for those types.

One exception keeps JAX's pytree contract (unflattening any leaves and flattening
again gives the same structure): a *template*, an instance unflattened from leaves
that are not all arrays (`jax.tree.map(lambda x: 0, model)` as a vmap `in_axes`, a
`ShapeDtypeStruct` template, a filter spec of bools), is flattened as the aux it was
unflattened with says, whatever its leaves are (deciding from them is what inox
abandoned). The exposed form (`_exposed`) is a template whose plan makes every field
a child.
"""

import functools
import operator
import types
import weakref
from collections.abc import Callable
from typing import Any, Final

import jax.tree_util as jtu
from jax.core import Tracer

from .._compat import FlattenFunctions
from . import _retrace
from ._carriers import (
    carrier_class,
    get_flat,
    get_layer,
    in_surgery,
    new_carrier,
)
from ._fields import fields_of, FieldSpec
from ._generated import (
    dispatcher,
    fast_flatten,
    fast_unflatten,
    specialise,
    unflatten_dispatcher,
)
from ._leaves import (
    ARRAY,
    CARRIER,
    category,
    CONTAINER,
    LAYER,
    NDARRAY,
    NODE,
    NODES,
    NONE,
    NUMBER,
    REAL,
    real_types,
    SHAPE,
    stops,
)
from ._split import (
    CHILD,
    Holes,
    MIXED,
    RECORDS,
    split,
    STATIC,
    value_of,
    whole,
)
from ._static import hold, natural

# How a field's value of one type becomes part of the node (`Signature.actions`).
TAKE: Final = 0  # the child, as it is
CARRY: Final = 1  # the child, a layer's carrier
KEEP: Final = 2  # a static entry, as it is
HOLD: Final = 3  # a static entry, as `hold` holds it
SPLIT: Final = 4  # split by `_split.split`: its kind follows from its value
WHOLE: Final = 5  # declared `eqx.field(static=True)`: a static entry, whole


class Plan:
    """Which field is a child, a static entry, or both (`_split`'s kinds), with the
    types of the static values that stand alone: `1`, `1.0` and `True` are equal
    under `==` but compile different programs, so their plans differ, and a plan is
    compared by identity (one object per class and key)."""

    __slots__ = (
        "cls",
        "kinds",
        "types",
        "exposed",
        "names",
        "child_keys",
        "entry_names",
        "counted",
        "last_aux_id",
        "order",
        "partial",
        "__weakref__",
    )

    def __init__(self, spec: FieldSpec, kinds: tuple[int, ...], types: Any, exposed):
        self.cls = spec.owner
        self.kinds, self.types, self.exposed = kinds, types, exposed
        self.names = spec.names
        self.child_keys = tuple(
            key for key, kind in zip(spec.keys, kinds) if kind != STATIC
        )
        self.entry_names = tuple(n for n, k in zip(spec.names, kinds) if k != CHILD)
        # Whether a new static number or function in its aux is worth noting
        # (`_retrace`: not in a field declared static, whose values Equinox also
        # compiles anew), and the id of the last aux noted (nothing kept alive).
        declared = [d for d, k in zip(spec.declared_static, kinds) if k == STATIC]
        self.counted = any(
            t in _retrace.COUNTED_TYPES and not d for t, d in zip(types, declared)
        )
        self.last_aux_id = 0
        self.partial = False
        # Where every static entry is its own value (no record, nothing held): the
        # field values in field order, picked out of `children + aux` in one C call.
        self.order = None
        if MIXED not in kinds and all(t in _RAW for t in types):
            n_children = sum(k == CHILD for k in kinds)
            at, c, e = [], 0, n_children + 1
            for kind in kinds:
                at.append(c if kind == CHILD else e)
                c, e = c + (kind == CHILD), e + (kind != CHILD)
            self.order = picker(at)

    def key(self) -> tuple[Any, ...]:
        return (self.kinds, self.types, self.exposed)

    def __eq__(self, other: object) -> bool:
        return self is other or (
            type(other) is Plan and self.cls is other.cls and self.key() == other.key()
        )

    def __hash__(self) -> int:
        return hash((self.cls, self.kinds))

    def __repr__(self) -> str:
        static = ", ".join(self.entry_names)
        return (
            f"{self.cls.__qualname__}[static {static}]"
            if static
            else self.cls.__qualname__
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # As the live plan of the class: found again by its key, the types of the
        # `types` module by name.
        types = tuple(_NAMES_OF_TYPES.get(t, t) for t in self.types)
        return (_plan_again, (self.cls, self.kinds, types, self.exposed, self.partial))


# Types whose static values the aux holds as they are (never wrapped by `hold`), so
# that they are the attribute values themselves.
_RAW: Final = frozenset({int, bool, str, bytes, type(None)})


# A node's aux data: `(plan, *entries)`, one entry per field with static data. A
# flat tuple, compared in C on every jit cache lookup: the plan by identity, then each
# entry with `==`; it prints as `(Counted[static step], 1)`.
Aux = tuple


def _plan_again(
    cls: type, kinds: Any, types: Any, exposed: bool, partial: bool
) -> "Plan":
    return plan_for(
        fields_of(cls), kinds, tuple(map(_type_of, types)), exposed, partial
    )


# The types of the `types` module (a function's, a builtin's, ...), which pickle
# cannot name: a plan holds them by name.
_UNNAMED_TYPES: Final = {
    f"types.{name}": value
    for name, value in vars(types).items()
    if isinstance(value, type) and not name.startswith("_")
}
_NAMES_OF_TYPES: Final = {value: name for name, value in _UNNAMED_TYPES.items()}


def _type_of(named: Any) -> Any:
    return _UNNAMED_TYPES.get(named, named) if type(named) is str else named


def entry_types(kinds: tuple[int, ...], entries: Any) -> tuple[Any, ...]:
    """The types a plan keys: of each entry's value where it stands alone."""
    out, j = [], 0
    for kind in kinds:
        if kind == STATIC:
            entry = entries[j]
            out.append(None if _is_record(entry) else type(natural(entry)))
        if kind != CHILD:
            j += 1
    return tuple(out)


def _is_record(entry: Any) -> bool:
    return type(entry) in RECORDS


# Plans are cached per class (`FieldSpec.plans`); bounded, as a class can meet many
# types (a field given a new class each time): past this, the cache starts again.
_MOST_PLANS: Final = 256


def plan_for(
    spec: FieldSpec,
    kinds: tuple[int, ...],
    types: tuple[Any, ...],
    exposed: bool,
    partial: bool = False,
) -> Plan:
    """The plan of `spec`'s class for these kinds and entry types (`partial`: of an
    instance still in `__init__`, some fields unset)."""
    key = (kinds, types, exposed, partial)
    try:
        return spec.plans[key]
    except KeyError:
        _bound(spec.plans)
        plan = Plan(spec, kinds, types, exposed)
        if partial:
            plan.partial = True
            plan.order = None  # `_fill` leaves the unset fields out
        return spec.plans.setdefault(key, plan)


def _bound(cache: dict[Any, Any]) -> None:
    if len(cache) >= _MOST_PLANS:
        cache.clear()


class Signature:
    """What a class's instances whose field values have one tuple of types need:
    each field's action, and where every field is taken or kept as it is, the plan,
    the C calls that pick the children and entries, and the aux itself where there
    is no entry."""

    __slots__ = ("actions", "plan", "children", "entries", "aux")

    def __init__(self, actions: tuple[int, ...], plan: Plan | None, simple: bool):
        self.actions, self.plan = actions, plan
        self.children: Callable[[tuple[Any, ...]], tuple[Any, ...]] | None = None
        self.entries: Callable[[tuple[Any, ...]], tuple[Any, ...]] | None = None
        self.aux: Aux | None = None
        if simple:
            self.children = picker([i for i, a in enumerate(actions) if a == TAKE])
            kept = [i for i, a in enumerate(actions) if a == KEEP]
            self.entries = picker(kept)
            if not kept:
                self.aux = (plan,)


def picker(at: list[int]) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """The items of a tuple at `at`, as a tuple, in one C call."""
    if not at or at == list(range(at[0], at[-1] + 1)):
        return operator.itemgetter(slice(at[0], at[-1] + 1) if at else slice(0, 0))
    if len(at) == 1:
        return operator.itemgetter(slice(at[0], at[0] + 1))
    return operator.itemgetter(*at)


def _action(value: Any, declared_static: bool, array_field: bool) -> int:
    """What becomes of a field value of this type (see `TAKE` ...)."""
    cat = category(value)
    if declared_static:
        if cat == CONTAINER:
            return WHOLE
        return KEEP if hold(value) is value else HOLD
    if cat in (ARRAY, NONE, NODE):
        return TAKE
    if cat in (LAYER, CARRIER):
        return CARRY
    if cat in (NUMBER, SHAPE):
        if array_field:
            return TAKE
        return KEEP if type(value) in (int, bool) else HOLD
    if cat in (NDARRAY, CONTAINER):
        return SPLIT
    return KEEP if hold(value) is value else HOLD


def _new_signature(spec: FieldSpec, types: tuple[type, ...], values: Any) -> Signature:
    actions = tuple(
        map(_action, values, spec.declared_static, spec.array_fields),
    )
    plan = None
    if _Unset in types:  # flattened inside `__init__`: not cached
        return Signature(actions, None, False)
    if SPLIT not in actions:
        kinds = tuple(CHILD if a in (TAKE, CARRY) else STATIC for a in actions)
        entries = [_entry(a, v) for a, v in zip(actions, values) if a >= KEEP]
        plan = plan_for(spec, kinds, entry_types(kinds, entries), False)
    signature = Signature(actions, plan, set(actions) <= {TAKE, KEEP})
    _bound(spec.signatures)
    return spec.signatures.setdefault(types, signature)


def _entry(action: int, value: Any) -> Any:
    if action == KEEP:
        return value
    return hold(value) if action == HOLD else whole(value)


class _Unset:
    """The value of a field not yet set, flattened from inside `__init__`: an empty
    child, as Equinox's flatten gives one."""


UNSET: Final = _Unset()
jtu.register_pytree_node(_Unset, lambda _: ((), None), lambda _, __: UNSET)


def _values(spec: FieldSpec, obj: Any) -> tuple[Any, ...]:
    attrs = _object_getattribute(obj, "__dict__")
    return tuple(attrs.get(name, UNSET) for name in spec.names)


_object_getattribute = object.__getattribute__
_object_new = object.__new__


def flatten(spec: FieldSpec, obj: Any) -> tuple[tuple[Any, ...], Aux]:
    """The node of `obj`, an instance of `spec`'s class: its children and aux."""
    return spec.flatten(obj)


def install_flatten(spec: FieldSpec) -> None:
    """Gives `spec`'s class its general flatten (`_general_flatten`), until one
    generated for the field types it meets replaces it (`_install_fast`)."""
    spec.flatten = spec.general_flatten = _general_flatten(spec)


def _install_fast(spec: FieldSpec, signature: Signature, types: tuple[type, ...]):
    """Replaces the class's flatten (the carrier maker of a layer class) by one
    generated for these field types, the first met of concrete arrays and static
    values taken and kept as they are."""
    if spec.specialised or not spec.names:
        return
    if any(issubclass(t, Tracer) for t in types):  # met while tracing: not the model's
        return
    spec.specialised = True
    taken = tuple(a == TAKE for a in signature.actions)
    registered = _registered.get(spec.owner)
    if registered is None:  # a layer class: what `to_carrier` calls
        _carried[spec.owner] = _carrier_maker(spec, signature, types, taken)
        return
    namespace = _generated_names(spec, signature, spec.general_flatten)
    specialise(
        registered, fast_flatten(spec.owner, spec.names, types, taken, namespace)
    )


def _generated_names(
    spec: FieldSpec, signature: Signature, general: Callable[[Any], Any]
) -> dict[str, Any]:
    """The names a generated flatten reads (`_generated.fast_flatten`)."""
    return {
        "templates": _templates,
        "general": general,
        "read": spec.read,
        "plan": signature.plan,
        "aux": signature.aux,
        "get_dict": _object_getattribute,
    }


def _carrier_maker(
    spec: FieldSpec,
    signature: Signature,
    types: tuple[type, ...],
    taken: tuple[bool, ...],
) -> Callable[[Any], Any]:
    """What makes the carriers of `spec`'s layer class, generated for these types."""
    namespace = _generated_names(spec, signature, spec.general_carrier)
    namespace["new"] = _object_new
    namespace["carrier_class"] = carrier_class(spec.owner, _register_carrier)
    return fast_flatten(spec.owner, spec.names, types, taken, namespace, True)


def _general_flatten(spec: FieldSpec) -> Callable[[Any], tuple[tuple[Any, ...], Aux]]:
    """The flatten of `spec`'s class that takes any instance: the fields read at
    once, the plan found by the tuple of their types (`Signature`), the children
    and entries picked in C where every field is taken or kept as it is."""
    read, signatures = spec.read, spec.signatures
    # `obj.__dict__` is read in C on an AutoModule, whose `__getattribute__` is
    # object's; an `eqx.Module` has a Python one, passed by.
    direct = getattr(spec.owner, "__getattribute__", None) is _object_getattribute

    def flatten_one(obj: Any) -> tuple[tuple[Any, ...], Aux]:
        if _templates:
            template = _templates.get(id(obj))
            if template is not None and template[0]() is obj:
                return _flatten_template(obj, template[1], template[2])
        try:
            values = read(
                obj.__dict__ if direct else _object_getattribute(obj, "__dict__")
            )
        except KeyError:  # flattened from inside `__init__`
            values = _values(spec, obj)
        types = tuple(map(type, values))
        signature = signatures.get(types)
        if signature is None:
            signature = _new_signature(spec, types, values)
            if signature.children is not None:
                _install_fast(spec, signature, types)
        children = signature.children
        if children is None:
            return _flatten_by_actions(spec, signature, values)
        aux = signature.aux
        if aux is None:
            aux = (signature.plan, *signature.entries(values))  # pyright: ignore[reportOptionalCall]  # set with `children`
        return children(values), aux

    return flatten_one


def _flatten_by_actions(
    spec: FieldSpec, signature: Signature, values: tuple[Any, ...]
) -> tuple[tuple[Any, ...], Aux]:
    node_child = node_child_now()
    children, entries, kinds = [], [], []
    for i, (action, value) in enumerate(zip(signature.actions, values)):
        if action == TAKE:
            children.append(value)
        elif action == CARRY:
            children.append(node_child(value))
        elif action == SPLIT:
            kind, child, entry = split(value, spec.array_fields[i], node_child)
            if kind != STATIC:
                children.append(child)
            if kind != CHILD:
                entries.append(entry)
            kinds.append(kind)
            continue
        else:
            entries.append(_entry(action, value))
        kinds.append(STATIC if action >= KEEP else CHILD)
    plan = signature.plan
    if plan is None:
        kinds = tuple(kinds)
        partial = any(v is UNSET for v in values)
        plan = plan_for(spec, kinds, entry_types(kinds, entries), False, partial)
    return tuple(children), (plan, *entries)


def node_child_now() -> Callable[[Any], Any]:
    """What a child holds for a node item in this flatten: a layer's carrier, or
    while this thread is in a surgery (`_carriers.layers_as_nodes`) the layer."""
    return as_node if in_surgery() else to_carrier


def as_node(x: Any) -> Any:
    """A node item as the node it is: a carrier handed out is its layer."""
    return get_layer(x) if category(x) == CARRIER else x


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
    if plan.order is not None:
        if type(children) is not tuple:
            children = tuple(children)
        attrs.update(zip(plan.names, plan.order(children + aux)))
    else:
        _fill(plan, attrs, aux, children)
    if plan.exposed or not (
        real_types.issuperset(map(type, children)) or _real_items(children)
    ):
        _settle(obj, attrs, aux, children)
    elif plan.order is not None and cls not in _fast_unflattens:
        _install_fast_unflatten(cls, plan, children)
    if plan.counted and plan.last_aux_id != id(aux):
        _noted(cls, aux, children)
    return obj


def _noted(cls: type, aux: Aux, children: Any) -> None:
    """The aux of a plan holding static numbers or functions is not the last one
    met: while tracing, `_retrace` looks into it."""
    if _retrace.is_traced(children):
        aux[0].last_aux_id = id(aux)
        _retrace.note_new_aux(cls, aux)


# The classes whose registered unflatten is generated for a plan (`_generated`).
_fast_unflattens: "weakref.WeakSet[type]" = weakref.WeakSet()


def _install_fast_unflatten(cls: type, plan: Plan, children: Any) -> None:
    """Gives the registered unflatten of `cls` the code generated for `plan`, the
    first met with children of concrete arrays (not a trace's)."""
    registered = _registered_unflatten.get(cls)
    if registered is None or any(issubclass(type(c), Tracer) for c in children):
        return
    _fast_unflattens.add(cls)
    namespace = {
        "general": unflatten,
        "new": _object_new,
        "settle": _settle,
        "real": real_types,
        "real_items": _real_items,
        "noted": _noted,
    }
    specialise(registered, fast_unflatten(cls, plan, namespace))


def _real_items(children: Any) -> bool:
    """Whether each child is of a type a real model holds, or a list or tuple of
    such items (a stack of layers)."""
    for child in children:
        kind = type(child)
        if kind in real_types:
            continue
        if kind is not list and kind is not tuple:
            return False
        if not real_types.issuperset(map(type, child)):
            return False
    return True


def _fill(plan: Plan, attrs: dict[str, Any], aux: Aux, children: Any) -> None:
    """Puts the attribute values into `attrs`, in field order."""
    c, e = 0, 1
    for name, kind in zip(plan.names, plan.kinds):
        if kind == CHILD:
            value = children[c]
            c += 1
        elif kind == STATIC:
            value = value_of(STATIC, None, aux[e])
            e += 1
        else:
            value = aux[e].fill(children[c])
            c, e = c + 1, e + 1
        if value is not UNSET:
            attrs[name] = value


def _settle(obj: Any, attrs: dict[str, Any], aux: Aux, children: Any) -> None:
    """For an instance whose children are not all of types a real model holds:
    carriers an `is_leaf` tree_map gave back become their layers, and if a leaf of
    the children is still not an array, the instance is a template."""
    leaves = jtu.tree_leaves(children, is_leaf=stops)
    if any(category(x) == CARRIER for x in leaves):
        for name, kind in zip(aux[0].names, aux[0].kinds):
            if kind != STATIC and name in attrs:
                attrs[name] = jtu.tree_map(as_node, attrs[name], is_leaf=stops)
    if (
        aux[0].exposed
        or not all(category(x) in REAL for x in leaves)
        or _holes_lost(aux, children)
    ):
        remember_template(obj, aux, children)


def _holes_lost(aux: Aux, children: tuple[Any, ...]) -> bool:
    """Whether a mixed field's child holds `None` where its value held an array (a
    tree mapped to `None`s): decided from its value, the field would lose those
    leaves from its structure, where the tree must keep the model's."""
    c, e = 0, 1
    for kind in aux[0].kinds:
        if kind == MIXED and type(aux[e]) is Holes:
            treedef, positions = aux[e][0], aux[e][1]
            try:
                parts = treedef.flatten_up_to(children[c])
            except (ValueError, TypeError):
                return True
            if any(x is None for i, x in enumerate(parts) if i not in positions):
                return True
        c += kind != STATIC
        e += kind != CHILD
    return False


# Templates, by id: each with a weak reference to it, and the aux and children it
# flattens as.
_templates: dict[int, tuple["weakref.ref[Any]", Aux, tuple[Any, ...]]] = {}


def template_aux(obj: Any) -> Aux | None:
    """The aux a template flattens as; None for any other instance."""
    template = _templates.get(id(obj))
    return template[1] if template is not None and template[0]() is obj else None


def remember_template(obj: Any, aux: Aux, children: tuple[Any, ...]) -> None:
    """Makes `obj` flatten as `aux` and `children`, whatever it holds, while it
    lives: a tree mapped from a model keeps the model's structure, exactly (JAX's
    pytree contract), even where it holds other values in the holes of a mixed
    field."""
    key = id(obj)
    try:
        ref = weakref.ref(obj, lambda _: _templates.pop(key, None))
    except TypeError:  # not weakly referenceable: flattened from its values
        return
    _templates[key] = (ref, aux, tuple(children))


def _flatten_template(
    obj: Any, aux: Aux, children: tuple[Any, ...]
) -> tuple[tuple[Any, ...], Aux]:
    """The node of a template: as it was unflattened, whatever it holds now (its
    layers made carriers again, unless it is in the exposed form)."""
    if aux[0].exposed:
        return children, aux
    node_child = node_child_now()
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
