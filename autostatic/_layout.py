"""How a node's partition is stored and read back: the layout module of AutoModule.

Each AutoModule (and each twin of an Equinox layer, `_twins`) keeps `(children, aux)`
in the slot of `Partitioned`, so flattening is one slot read, and unflattening only
creates the instance and fills that slot; the attributes are filled in from it on
first access (`materialise`). `_partition` decides what goes where; this module owns
the formats: the per-class `FieldSpec`, the interned `Layout` (which field is which
kind, and the types of the static values), the aux tuple `Aux`, `StaticLeaf`, the
wrapper of a non-array leaf inside a child, and `MixedFrozenList` /
`MixedFrozenDict`, the lists and dicts that carry their non-array items themselves.
"""

import dataclasses
import types
import weakref
from collections.abc import Callable
from typing import Any, Final, NamedTuple

import jax.tree_util as jtu

from ._containers import format_path, FrozenDict, FrozenList

# The kind of a field, decided per instance at the end of construction.
DYNAMIC: Final = 0  # every leaf is an array (or it has no leaves): a child
STATIC: Final = 1  # no leaf is an array: a static value in the aux data
MIXED: Final = 2  # both: a child whose non-array leaves are `StaticLeaf`s
# Static, but its `==` runs in Python (and may raise), so the value sits in a
# `StaticLeaf` that names the attribute if the comparison fails (see `Aux`).
STATIC_COMPARED_IN_PYTHON: Final = 3
CHILD_KINDS: Final = (DYNAMIC, MIXED)

_object_getattribute = object.__getattribute__
_object_setattr = object.__setattr__
_object_new = object.__new__


class FieldSpec(NamedTuple):
    """What the class declares about its fields, fixed when the class is created."""

    names: tuple[str, ...]
    declared_static: tuple[bool, ...]  # `eqx.field(static=True)`
    defaults: dict[str, Any]  # dataclass defaults, moved off the class
    # A twin of an Equinox layer (`_twins`), not an AutoModule.
    twin: bool
    # Per tuple of field value types that are all plain (numbers, strings, jax
    # arrays): the typed layout and the field positions of the children and of the
    # static values, so such an instance is decided without a loop (`_partition`).
    plain_splits: "dict[tuple[type, ...], PlainSplit]"


_SPEC: Final = "_autostatic_fields"  # the class attribute holding a `FieldSpec`
_SLOT: Final = "_autostatic_flat"  # the instance slot holding `(children, aux)`


def check_reserved_names(class_name: str, namespace: dict[str, Any]) -> None:
    """Refuses a class body that names what an AutoModule keeps on its class and
    instances (the field spec, the partition slot): either would be shadowed."""
    names = {*namespace, *namespace.get("__annotations__", {})}
    for name in sorted(names & {_SPEC, _SLOT}):
        raise TypeError(
            f"{class_name}.{name}: this name is reserved by autostatic (it holds the "
            "partition of every AutoModule); rename the attribute."
        )


def fields_of(cls: type) -> FieldSpec:
    return getattr(cls, _SPEC)


def is_automodule_class(cls: type) -> bool:
    """An AutoModule class (not a twin of an Equinox layer)."""
    spec = getattr(cls, _SPEC, None)
    return spec is not None and not spec.twin


def is_automodule(x: Any) -> bool:
    return is_automodule_class(type(x))


def has_partition(x: Any) -> bool:
    """An AutoModule or a twin of an Equinox layer: a node whose partition is ours."""
    return hasattr(type(x), _SPEC)


def prepare_class(cls: type, *, twin: bool = False) -> None:
    """Records the fields of a new AutoModule class and moves its dataclass defaults
    off the class: a lazily unflattened instance fills its attributes in through
    `__getattr__`, which a class attribute of the same name would shadow."""
    fields = dataclasses.fields(cls)  # pyright: ignore[reportArgumentType]  # a dataclass by now
    for name in moved_defaults(cls):
        delattr(cls, name)
    spec = FieldSpec(
        names=tuple(f.name for f in fields),
        declared_static=tuple(bool(f.metadata.get("static", False)) for f in fields),
        defaults={
            f.name: f.default for f in fields if f.default is not dataclasses.MISSING
        },
        twin=twin,
        plain_splits={},
    )
    setattr(cls, _SPEC, spec)


class Layout:
    """Which field is which kind, shared by every instance of a class with that split."""

    __slots__ = (
        "cls",
        "kinds",
        "child_names",
        "child_keys",
        "mixed",
        "static_names",
        "compared_in_python",
        "plain",
        "static_types",
        "untyped",
        "typed",
        "fill",
    )

    def __init__(
        self,
        cls: type,
        kinds: tuple[int, ...],
        static_types: tuple[type, ...] | None = None,
    ):
        names = [f.name for f in dataclasses.fields(cls)]  # pyright: ignore[reportArgumentType]  # a dataclass by now
        child_kinds = [k for k in kinds if k in CHILD_KINDS]
        static_kinds = [k for k in kinds if k not in CHILD_KINDS]
        self.cls = cls
        self.kinds = kinds
        self.child_names = tuple(n for n, k in zip(names, kinds) if k in CHILD_KINDS)
        self.child_keys = tuple(jtu.GetAttrKey(n) for n in self.child_names)
        # Positions among the children / among the static values.
        self.mixed = tuple(i for i, k in enumerate(child_kinds) if k == MIXED)
        self.static_names = tuple(
            n for n, k in zip(names, kinds) if k not in CHILD_KINDS
        )
        self.compared_in_python = tuple(
            i for i, k in enumerate(static_kinds) if k == STATIC_COMPARED_IN_PYTHON
        )
        # Children and static values are the attribute values as they are.
        self.plain = not (self.mixed or self.compared_in_python)
        # None for the layout of a split; the types of the static values for each
        # layout an instance's aux holds, one per distinct types tuple (`typed`).
        self.static_types = static_types
        self.untyped: Layout = self
        self.typed: dict[tuple[type, ...], Layout] = {}
        self.fill: Callable[[type, Aux, tuple[Any, ...]], Any] | None = None

    def with_types(self, static_types: tuple[type, ...]) -> "Layout":
        """This split with these static value types, one object per types tuple."""
        untyped = self.untyped
        try:
            return untyped.typed[static_types]
        except KeyError:
            typed = Layout(self.cls, self.kinds, static_types)
            typed.untyped = untyped
            return untyped.typed.setdefault(static_types, typed)

    def __reduce__(self):
        # The split only: `type(f)` of a function cannot be pickled, and an Aux
        # recomputes the types from its values (`Aux.__reduce__`).
        return (layout_for, (self.cls, self.kinds))

    def __repr__(self) -> str:
        types = self.static_types
        typed = "" if types is None else f", types={tuple(t.__name__ for t in types)}"
        return (
            f"Layout({self.cls.__qualname__}, children={self.child_names}, "
            f"static={self.static_names}{typed})"
        )


class PlainSplit(NamedTuple):
    layout: "Layout"  # typed
    children: tuple[int, ...]  # field positions
    static: tuple[int, ...]


_layouts: "weakref.WeakKeyDictionary[type, dict[tuple[int, ...], Layout]]" = (
    weakref.WeakKeyDictionary()
)


def layout_for(cls: type, kinds: tuple[int, ...]) -> Layout:
    per_class = _layouts.setdefault(cls, {})
    try:
        return per_class[kinds]
    except KeyError:
        # setdefault: threads constructing the first instances at once share one.
        return per_class.setdefault(kinds, Layout(cls, kinds))


class Aux(tuple):
    """The aux data of an AutoModule node: `(layout, *static_values)`.

    A flat tuple, so that JAX's treedef comparison (what every jit cache lookup does,
    as a treedef hash ignores aux data) runs in C: the layout by identity, which
    also compares the static values' types (one layout object per class, split and
    types, so that `1`, `1.0` and `True`, equal under `==`, do not share a compiled
    program), then each static value with `==`. A subclass adds the names
    without changing that comparison (measured in design.md; a NamedTuple would
    need the static values nested in a tuple of their own, 13% slower to compare).
    A static value whose type compares in Python is kept in a `StaticLeaf`, whose
    `__eq__` names the attribute if the comparison fails.
    """

    __slots__ = ()

    @property
    def layout(self) -> Layout:
        return self[0]

    @property
    def static_types(self) -> tuple[type, ...]:
        types = self[0].static_types
        assert types is not None  # made by `make_aux`
        return types

    @property
    def static_values(self) -> tuple[Any, ...]:
        return self[1:]

    def __reduce__(self):
        # `type(f)` of a function is not picklable, and the types follow from the
        # values anyway.
        return (make_aux, (self.layout, self.static_values))


def make_aux(layout: Layout, static_values: tuple[Any, ...]) -> Aux:
    """The aux data of a node of `layout` (a split, or a typed layout of that split)
    holding `static_values`."""
    typed = layout.with_types(tuple(map(type, static_values)))
    return Aux((typed, *static_values))


def _uncomparable(where: str, a: Any, b: Any, err: Exception) -> TypeError:
    return TypeError(
        f"{where}: static values {a!r} and {b!r} cannot be compared with == "
        f"({type(err).__name__}: {err}). JAX compares static values to decide whether "
        "a compiled function can be reused. Give the value's type a boolean __eq__, or "
        "store the data as a jax/numpy array so that it becomes dynamic."
    )


def static_equal(a: Any, b: Any) -> bool:
    """Static values as the jit cache compares them: same type, then `==`."""
    return a is b or (type(a) is type(b) and bool(a == b))


_identity_eq: Final = object.__eq__


def compares_in_python(value: Any) -> bool:
    return isinstance(getattr(type(value), "__eq__", None), types.FunctionType)


class StaticLeaf:
    """A non-array leaf of a mixed field: an empty pytree node carrying the value.

    Its aux data, which JAX compares on every jit cache lookup that does not hold the
    very same treedef, is compared in C: the value itself when its type's `==` is
    `object`'s (a function: equal only to itself), else `(type, value)` (numbers,
    strings: `1 == 1.0` must not share a compiled program). A value whose `==` runs
    in Python (and may raise) has the node itself as aux data, whose `__eq__` names
    the attribute. The value object stays the same (`is`) through any tree_map.
    """

    __slots__ = ("value", "where", "aux")

    def __init__(self, value: Any, where: str, aux: Any = None):
        self.value = value
        self.where = where
        if aux is None:
            if compares_in_python(value):
                aux = self
            elif type(value).__eq__ is _identity_eq:
                aux = value  # equal only to itself, so of the same type too
            else:
                aux = (type(value), value)
        self.aux = aux

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(other) is not StaticLeaf:
            return False
        a, b = self.value, other.value
        try:
            return static_equal(a, b)
        except Exception as err:
            raise _uncomparable(self.where, a, b, err) from err

    def __hash__(self) -> int:
        return 0

    def __reduce__(self) -> tuple[Any, ...]:
        # The aux holds `type(value)`, and `<class 'function'>` cannot be pickled.
        return (StaticLeaf, (self.value, self.where))

    def __repr__(self) -> str:
        return f"StaticLeaf({self.value!r})"


def _static_leaf_unflatten(aux: Any, _: Any) -> StaticLeaf:
    # The aux is passed on as it is: no second type check, and the unflattened
    # node's aux is the same object, compared by identity.
    if type(aux) is StaticLeaf:
        return aux
    return StaticLeaf(_leaf_value(aux), "", aux)


jtu.register_pytree_node(StaticLeaf, lambda s: ((), s.aux), _static_leaf_unflatten)


def _leaf_value(aux: Any) -> Any:
    """The value of a `StaticLeaf` aux: the node, a `(type, value)` pair or the value."""
    if type(aux) is StaticLeaf:
        return aux.value
    return aux[1] if type(aux) is tuple else aux


class MixedAux(tuple):
    """The aux data of a `MixedFrozenList` / `MixedFrozenDict`: `(path, keys, static
    positions, *aux of each static item)`, `keys` the sorted keys of a dict (None for
    a list), each item's aux compared as a `StaticLeaf`'s. A flat tuple compared in
    C, like `Aux`."""

    __slots__ = ()

    @property
    def path(self) -> Any:
        return self[0]

    @property
    def keys(self) -> tuple[Any, ...] | None:
        return self[1]

    @property
    def dict_keys(self) -> tuple[Any, ...]:
        """`keys`, for the aux of a dict."""
        return self[1]

    @property
    def static(self) -> tuple[int, ...]:
        return self[2]

    @property
    def leaf_auxes(self) -> tuple[Any, ...]:
        return self[3:]

    def __reduce__(self):
        # The items' aux may hold `type(f)` of a function, which cannot be pickled:
        # made again from the static values.
        values = tuple(map(_leaf_value, self.leaf_auxes))
        return (_remade_mixed_aux, (self.path, self.keys, self.static, values))


def _remade_mixed_aux(
    path: Any, keys: tuple[Any, ...] | None, static: tuple[int, ...], values: Any
) -> MixedAux:
    where = format_path(path)
    key_text = (lambda i: f"[{i}]") if keys is None else (lambda i: f"[{keys[i]!r}]")
    auxes = (StaticLeaf(v, where + key_text(i)).aux for i, v in zip(static, values))
    return MixedAux((path, keys, static, *auxes))


class MixedFrozenList(FrozenList):
    """A frozen list of arrays, modules, non-array leaves and such lists and dicts (a
    stack of layers and activations), whose non-array leaf items ride in its own aux
    data (`MixedAux`).

    The attribute value is the pytree node itself: reading it unwraps nothing. Its
    children are the items, with `None` (an empty node, compared in C) in place of
    each static item, so key paths are the list's and contiguous, as tools that
    rebuild lists from key paths (orbax) need; there is no `StaticLeaf` node per item
    to visit when treedefs are compared. Made only for a field's value and the lists
    and dicts in it (`_partition`); freezing it again gives a plain `FrozenList`.
    """

    __slots__ = ("_children", "_aux", "__weakref__")

    def __init__(self, items: Any, path: Any, static: tuple[int, ...]):
        FrozenList.__init__(self, items, path)
        self._children = _placeholders(self, static)
        self._aux = _mixed_aux(self, None, self, static)

    def __reduce__(self) -> tuple[Any, ...]:
        return (MixedFrozenList, (list(self), self._path, self._aux.static))


class MixedFrozenDict(FrozenDict):
    """A frozen dict like `MixedFrozenList`: its children are the values in sorted key
    order, with `None` for each static one."""

    __slots__ = ("_children", "_aux", "__weakref__")

    def __init__(self, items: Any, path: Any, static: tuple[int, ...]):
        FrozenDict.__init__(self, items, path)
        keys = self._sorted_keys
        values = [dict.__getitem__(self, k) for k in keys]
        self._children = _placeholders(values, static)
        self._aux = _mixed_aux(self, keys, values, static)

    def __reduce__(self) -> tuple[Any, ...]:
        return (MixedFrozenDict, (dict(self), self._path, self._aux.static))


def _placeholders(values: Any, static: tuple[int, ...]) -> tuple[Any, ...]:
    children = list(values)
    for i in static:
        children[i] = None
    return tuple(children)


# The container last built per kind and path, held weakly: the lists of a stack of
# blocks hold the very same static items (one `relu`), so they share its aux object,
# and two models built apart compare it by identity. Nothing is kept alive once the
# container is gone.
_recent_mixed: "weakref.WeakValueDictionary[tuple[type, Any], Any]" = (
    weakref.WeakValueDictionary()
)


def _exactly_equal(a: tuple[Any, ...] | None, b: tuple[Any, ...] | None) -> bool:
    # Type by type: `0 == 0.0 == False` must not let one dict's keys stand in for
    # another's.
    if a is None or b is None:
        return a is b
    return len(a) == len(b) and all(
        x is y or (type(x) is type(y) and x == y) for x, y in zip(a, b)
    )


def _mixed_aux(
    container: Any, keys: tuple[Any, ...] | None, values: Any, static: tuple[int, ...]
) -> MixedAux:
    """The `MixedAux` of a new `container` holding `values` (in key order): that of
    the last one of the same kind and path if it holds the very same static values."""
    path = container._path
    last = _recent_mixed.get((type(container), path))
    recent = None if last is None else last._aux
    if (
        recent is not None
        and recent.static == static
        and len(recent.leaf_auxes) == len(static)
        and _exactly_equal(recent.path, path)
        and _exactly_equal(recent.keys, keys)
        and all(
            type(a) is not StaticLeaf and _leaf_value(a) is values[i]
            for i, a in zip(static, recent.leaf_auxes)
        )
    ):
        return recent
    aux = _remade_mixed_aux(path, keys, static, [values[i] for i in static])
    _recent_mixed[type(container), path] = container
    return aux


def _unflattened_values(
    aux: MixedAux, children: Any
) -> tuple[list[Any], tuple[Any, ...]]:
    """The item values, and the children as given: what a tree puts in a static
    item's place is kept as a child (orbax maps `None` nodes to its own metadata and
    reads it back), while the attribute gives the static item."""
    children = tuple(children)
    values = list(children)
    for i, leaf_aux in zip(aux.static, aux.leaf_auxes):
        values[i] = _leaf_value(leaf_aux)
    return values, children


# Unflatten runs for every such container on every unflatten: without `__init__`.


def _mixed_list_unflatten(aux: MixedAux, children: Any) -> MixedFrozenList:
    values, children = _unflattened_values(aux, children)
    obj = list.__new__(MixedFrozenList)
    list.extend(obj, values)
    obj._path, obj._children, obj._aux, obj._sealed = aux.path, children, aux, True
    return obj


def _mixed_dict_unflatten(aux: MixedAux, children: Any) -> MixedFrozenDict:
    values, children = _unflattened_values(aux, children)
    obj = dict.__new__(MixedFrozenDict)
    keys = aux.dict_keys
    dict.update(obj, zip(keys, values))
    obj._path, obj._sorted_keys, obj._children, obj._aux = aux.path, keys, children, aux
    obj._sealed = True
    return obj


jtu.register_pytree_with_keys(
    MixedFrozenList,
    lambda x: (
        tuple((jtu.SequenceKey(i), c) for i, c in enumerate(x._children)),
        x._aux,
    ),
    _mixed_list_unflatten,
    flatten_func=lambda x: (x._children, x._aux),
)
jtu.register_pytree_with_keys(
    MixedFrozenDict,
    lambda x: (tuple(zip(map(jtu.DictKey, x._sorted_keys), x._children)), x._aux),
    _mixed_dict_unflatten,
    flatten_func=lambda x: (x._children, x._aux),
)


# How deep in a field's lists and dicts non-array leaves are carried by their
# containers; a deeper nest keeps `StaticLeaf` wrappers (walked without recursion).
MIXED_DEPTH: Final = 16


def unmixed(value: Any, depth: int = 0) -> Any:
    """`value` with every item of its lists and dicts a pytree child again: each
    `MixedFrozenList` / `MixedFrozenDict` in it as a plain frozen container."""
    kind = type(value)
    if depth > MIXED_DEPTH:
        return value
    if kind is MixedFrozenList or kind is FrozenList:
        items = [unmixed(x, depth + 1) for x in value]
        if kind is FrozenList and all(a is b for a, b in zip(items, value)):
            return value
        return FrozenList(items, value._path)
    if kind is MixedFrozenDict or kind is FrozenDict:
        pairs = {k: unmixed(v, depth + 1) for k, v in dict.items(value)}
        if kind is FrozenDict and all(pairs[k] is v for k, v in dict.items(value)):
            return value
        return FrozenDict(pairs, value._path)
    return value


def _static_leaf_or_partitioned(x: Any) -> bool:
    return type(x) is StaticLeaf or has_partition(x)


def _unwrap(x: Any) -> Any:
    return x.value if type(x) is StaticLeaf else x


# Types found to be pytree leaves (arrays, tracers, functions, numbers): a type's
# registration does not change once its instances exist, so asking JAX again for
# every leaf of every unwrap is skipped.
_leaf_types: set[type] = set()


def _sequence_rebuilder(x: Any) -> Callable[[list[Any]], Any] | None:
    """How to rebuild a list or tuple from new items, without JAX's flatten."""
    kind = type(x)
    if kind is FrozenList:
        return lambda items: FrozenList(items, x._path)
    if kind is list or kind is tuple:
        return kind
    return None


def map_preserving(
    node: Any, fn: Any, is_leaf: Any = None, path: str | None = ""
) -> Any:
    """`tree_map` that rebuilds only the nodes above a changed leaf; `fn(leaf, path)`
    gets the leaf's key path as text, or None when `path` is None (faster).

    Every untouched sub-node stays the very same object, so the attribute value and the
    pytree child share them and `eqx.tree_at`, which finds nodes by identity, can
    address a sub-node of a mixed attribute (`m.layers[-1]`). Iterative, so nesting
    is limited by JAX's flatten, not by Python's recursion limit.
    """

    def visit(x: Any, x_path: str | None) -> tuple[bool, Any]:
        """(True, new value) for a leaf; (False, (rebuild, keys, children)) for a
        node, `keys` being None without paths."""
        if (is_leaf is not None and is_leaf(x)) or type(x) in _leaf_types:
            return True, fn(x, x_path)
        rebuild = _sequence_rebuilder(x)
        if rebuild is not None and x:
            keys = None if x_path is None else [f"[{i}]" for i in range(len(x))]
            return False, (rebuild, keys, list(x))
        if x_path is None:
            children, treedef = jtu.tree_flatten(x, is_leaf=lambda y: y is not x)
            keys = None
        else:
            pairs, treedef = jtu.tree_flatten_with_path(x, is_leaf=lambda y: y is not x)
            keys = [jtu.keystr(k) for k, _ in pairs]
            children = [c for _, c in pairs]
        if jtu.treedef_is_leaf(treedef):
            # A leaf, or a node without children (None, (), a field-less Module such
            # as a StateIndex's sentinel), which stays a node: wrapping it would give
            # the same value two structures, before and after `make_with_state`.
            if treedef.num_leaves:
                _leaf_types.add(type(x))
                return True, fn(x, x_path)
            return True, x
        return False, (lambda items: jtu.tree_unflatten(treedef, items), keys, children)

    done, result = visit(node, path)
    if done:
        return result
    # One entry per node being rebuilt: (node, path, rebuild, keys, children, new).
    stack: list[tuple[Any, str | None, Any, list[str] | None, list[Any], list[Any]]]
    stack = [(node, path, *result, [])]
    while True:
        x, x_path, rebuild, keys, children, new = stack[-1]
        if len(new) < len(children):
            i = len(new)
            child_path = None if keys is None or x_path is None else x_path + keys[i]
            done, result = visit(children[i], child_path)
            if done:
                new.append(result)
            else:
                stack.append((children[i], child_path, *result, []))
            continue
        stack.pop()
        rebuilt = x if all(a is b for a, b in zip(new, children)) else rebuild(new)
        if not stack:
            return rebuilt
        stack[-1][5].append(rebuilt)


def unwrap_static_leaves(child: Any) -> Any:
    """The attribute value of a mixed child: every `StaticLeaf` replaced by its value,
    rebuilding only the nodes above one, so every other sub-node is the very same
    object as in the child (`eqx.tree_at` finds nodes by identity). A nested
    AutoModule or twin is kept as it is: the `StaticLeaf`s inside it are its own."""
    return map_preserving(
        child, lambda x, _: _unwrap(x), _static_leaf_or_partitioned, path=None
    )


class Partitioned:
    """The base that gives AutoModule instances the slot holding `(children, aux)`."""

    __slots__ = (_SLOT,)


_get_flat = Partitioned._autostatic_flat.__get__  # pyright: ignore[reportAttributeAccessIssue]  # a slot's member descriptor
_set_flat = Partitioned._autostatic_flat.__set__  # pyright: ignore[reportAttributeAccessIssue]  # a slot's member descriptor


def set_partition(obj: Any, flat: tuple[tuple[Any, ...], Aux]) -> None:
    """Stores `(children, aux)` of a node whose partition has been decided."""
    _set_flat(obj, flat)


def unflatten(cls: type, aux: Aux, children: tuple[Any, ...]) -> Any:
    # Lazy: the attributes are filled in from `(children, aux)` on first access
    # (`materialise`), because unflattening runs once per node of every tree_map, and
    # intermediate trees (gradients, optimiser updates, in_axes specs) are mostly
    # never looked into.
    obj = _object_new(cls)
    _set_flat(obj, (children, aux))
    return obj


def unflatten_eager(cls: type, aux: Aux, children: tuple[Any, ...]) -> Any:
    """For classes on which a field name resolves through a base (see `needs_eager`)."""
    obj = unflatten(cls, aux, children)
    materialise(obj)
    return obj


def _generated_fill(layout: Layout) -> Callable[[type, Aux, tuple[Any, ...]], Any]:
    """An unflatten for nodes of a plain `layout` that fills the attributes in at once,
    as Equinox's generated unflatten does; generated for the layout's field names, so
    that each attribute is one dict store (no loop, no `zip`)."""
    stores = [
        f"    attrs[{n!r}] = children[{i}]" for i, n in enumerate(layout.child_names)
    ]
    stores += [
        f"    attrs[{n!r}] = aux[{i + 1}]" for i, n in enumerate(layout.static_names)
    ]
    source = "\n".join(
        [
            "def unflatten(cls, aux, children):",
            "    obj = new(cls)",
            "    set_flat(obj, (children, aux))",
            "    attrs = get_attribute(obj, '__dict__')",
            *stores,
            "    return obj",
        ]
    )
    namespace = {
        "new": _object_new,
        "set_flat": _set_flat,
        "get_attribute": _object_getattribute,
    }
    exec(compile(source, f"<autostatic unflatten of {layout!r}>", "exec"), namespace)
    return namespace["unflatten"]


def unflatten_filled(cls: type, aux: Aux, children: tuple[Any, ...]) -> Any:
    """Unflatten that fills the attributes in at once: with code generated for the
    node's layout when it is plain, else through `materialise`."""
    layout = aux[0]
    fill = layout.fill
    if fill is None:
        fill = layout.fill = (
            _generated_fill(layout) if layout.plain else unflatten_eager
        )
    return fill(cls, aux, children)


Flatten = tuple[tuple[Any, ...], Aux]


def flatten_functions(
    cls: type, provisional: Callable[[Any], Flatten], *, filled: bool = False
) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    """Flatten, flatten-with-keys and unflatten for the new class `cls`.

    Flatten reads the slot; an instance flattened before its partition was stored
    (from inside its own `__init__` or `__check_init__`) gets `provisional(obj)`.
    Unflatten is lazy, unless `filled` (twins of Equinox layers, whose attributes are
    read at once) or a base shadows a field (`needs_eager`).
    """

    def flatten(obj: Any) -> Flatten:
        try:
            return _get_flat(obj)
        except AttributeError:
            return provisional(obj)

    def flatten_with_keys(obj: Any) -> tuple[tuple[tuple[Any, Any], ...], Aux]:
        children, aux = flatten(obj)
        return tuple(zip(aux.layout.child_keys, children)), aux

    if filled:
        return flatten, flatten_with_keys, unflatten_filled
    return (
        flatten,
        flatten_with_keys,
        unflatten_eager if needs_eager(cls) else unflatten,
    )


def moved_defaults(cls: type) -> set[str]:
    """The fields whose dataclass default sits on `cls` itself; `prepare_class` moves
    them off the class, so that they cannot shadow unfilled fields. A default that
    overrides a base's attribute of that name (`size: int = 3` over an abstract
    property) stays, as in Equinox: moving it would bring the base's back, and such
    a class fills attributes in at unflatten (`needs_eager`)."""
    inherited = {name for base in cls.__mro__[1:] for name in vars(base)}
    return {
        f.name
        for f in dataclasses.fields(cls)  # pyright: ignore[reportArgumentType]  # a dataclass by now
        if f.default is not dataclasses.MISSING
        and vars(cls).get(f.name) is f.default
        and f.name not in inherited
    }


def needs_eager(cls: type) -> bool:
    """Whether a field name of `cls` still resolves on the class once its own defaults
    have moved (a non-AutoModule base's default, a parent's method of that name): it
    would shadow a lazily unflattened instance's empty `__dict__`."""
    moved = moved_defaults(cls)
    fields = dataclasses.fields(cls)  # pyright: ignore[reportArgumentType]  # a dataclass by now
    return any(
        f.name in vars(klass)
        for klass in cls.__mro__
        for f in fields
        if not (klass is cls and f.name in moved)
    )


def _unflattened_attrs(children: tuple[Any, ...], aux: Aux) -> dict[str, Any]:
    layout = aux.layout
    attrs = dict(zip(layout.static_names, aux.static_values))
    for i in layout.compared_in_python:
        name = layout.static_names[i]
        attrs[name] = attrs[name].value
    if layout.mixed:
        values = list(children)
        for i in layout.mixed:
            values[i] = unwrap_static_leaves(values[i])
        attrs.update(zip(layout.child_names, values))
    else:
        attrs.update(zip(layout.child_names, children))
    return attrs


def materialise(obj: Any) -> dict[str, Any]:
    """Returns the `__dict__` of `obj` with every field filled in."""
    attrs = _object_getattribute(obj, "__dict__")
    names = fields_of(type(obj)).names
    # Filled in already, unless the first field is missing: other entries (e.g. from
    # `functools.cached_property`) may have arrived first.
    if names and names[0] not in attrs:
        try:
            children, aux = _get_flat(obj)
        except AttributeError:  # still in __init__, before anything was assigned
            return attrs
        # One `update` from a complete dict: another thread reading the instance
        # at the same time sees either no field or every field, never a
        # half-filled instance or a `StaticLeaf`.
        attrs.update(_unflattened_attrs(children, aux))
    return attrs


def reduce(obj: Any) -> tuple[Any, ...]:
    """`__reduce__` for copy and pickle: the class, the fields and the partition."""
    return (restore, (type(obj), dict(materialise(obj)), _get_flat(obj)))


def restore(cls: type, attrs: dict[str, Any], flat: tuple[tuple[Any, ...], Aux]) -> Any:
    obj = _object_new(cls)
    _object_getattribute(obj, "__dict__").update(attrs)
    _set_flat(obj, flat)
    return obj
