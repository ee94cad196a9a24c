"""The static/dynamic partition of one AutoModule instance, and its flatten/unflatten.

The partition is decided once, when construction ends (`freeze_partition`), and is
carried in the aux data from then on, so every later flatten only reads it back and
every unflatten only puts values where it says. Nothing here ever inspects leaves
after construction: unflattening with `None`s, in_axes ints, shardings or sentinels
keeps the structure (deciding again at flatten time is what inox abandoned).

Each declared field is one of three kinds, in declaration order:

- dynamic: every leaf of its value is an array (or it has no leaves). The value itself
  is a pytree child, so key paths are natural: `.layers[0].weight`.
- static: it has leaves and none is an array. The value rides in the aux data.
- mixed: both. The child is the value with each non-array leaf wrapped in an empty
  pytree node (`StaticLeaf`) that carries the leaf in its own aux data; the attribute
  keeps the plain value. The wrappers travel with their parent nodes through
  `tree_at`, `make_with_state` and other rewrites of sub-nodes.

Each instance keeps `(children, aux)` in a slot of `Partitioned` (a base of
AutoModule), so flattening is one slot read, and unflattening only creates the instance
and fills that slot; the attributes are filled in from it on first access
(`materialise`).

This module owns the partition and everything that reads it: the per-class field
specification (`prepare_class`, `fields_of`), the aux data (`Aux`), and the exposed
form used by model surgery and diagnostics (`expose`, `refreeze`).
"""

import dataclasses
import threading
import types
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Final, NamedTuple

import equinox as eqx
import jax
import jax.tree_util as jtu
import numpy as np

from ._containers import ContainerPath, freeze
from ._static_checks import find_hidden_array, is_uncomparable, warn_once

MISSING: Final = object()

# The kind of a field, decided per instance at the end of construction.
DYNAMIC: Final = 0  # every leaf is an array (or it has no leaves): a child
STATIC: Final = 1  # no leaf is an array: a static value in the aux data
MIXED: Final = 2  # both: a child whose non-array leaves are `StaticLeaf`s
# Static, but its `==` runs in Python (and may raise), so the value sits in a
# `StaticLeaf` that names the attribute if the comparison fails (see `Aux`).
STATIC_COMPARED_IN_PYTHON: Final = 3
_CHILD_KINDS: Final = (DYNAMIC, MIXED)

_object_getattribute = object.__getattribute__
_object_setattr = object.__setattr__
_object_new = object.__new__


def is_dynamic_leaf(x: Any) -> bool:
    """Arrays (jax, numpy, tracers) and `jax.ShapeDtypeStruct` templates are dynamic.

    Treating `ShapeDtypeStruct` as an array, as `eqx.filter_eval_shape` does, gives a
    hand-built abstract template the same structure as a real instance.
    """
    return eqx.is_array(x) or isinstance(x, jax.ShapeDtypeStruct)


class FieldSpec(NamedTuple):
    """What the class declares about its fields, fixed when the class is created."""

    names: tuple[str, ...]
    declared_static: tuple[bool, ...]  # `eqx.field(static=True)`
    defaults: dict[str, Any]  # dataclass defaults, moved off the class


_SPEC: Final = "_autostatic_fields"  # the class attribute holding a `FieldSpec`


def fields_of(cls: type) -> FieldSpec:
    return getattr(cls, _SPEC)


def is_automodule(x: Any) -> bool:
    return hasattr(type(x), _SPEC)


def prepare_class(cls: type) -> None:
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
    )

    def __init__(self, cls: type, kinds: tuple[int, ...]):
        names = fields_of(cls).names
        child_kinds = [k for k in kinds if k in _CHILD_KINDS]
        static_kinds = [k for k in kinds if k not in _CHILD_KINDS]
        self.cls = cls
        self.kinds = kinds
        self.child_names = tuple(n for n, k in zip(names, kinds) if k in _CHILD_KINDS)
        self.child_keys = tuple(jtu.GetAttrKey(n) for n in self.child_names)
        # Positions among the children / among the static values.
        self.mixed = tuple(i for i, k in enumerate(child_kinds) if k == MIXED)
        self.static_names = tuple(
            n for n, k in zip(names, kinds) if k not in _CHILD_KINDS
        )
        self.compared_in_python = tuple(
            i for i, k in enumerate(static_kinds) if k == STATIC_COMPARED_IN_PYTHON
        )

    def __reduce__(self):
        return (layout_for, (self.cls, self.kinds))

    def __repr__(self) -> str:
        return (
            f"Layout({self.cls.__qualname__}, children={self.child_names}, "
            f"static={self.static_names})"
        )


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
    """The aux data of an AutoModule node: `(layout, static_types, *static_values)`.

    A flat tuple, so that JAX's treedef comparison (what every jit cache lookup does,
    as a treedef hash ignores aux data) runs in C: the layout by identity, the static
    values' types (so that `1`, `1.0` and `True`, equal under `==`, do not share a
    compiled program), then each static value with `==`. A subclass adds the names
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
        return self[1]

    @property
    def static_values(self) -> tuple[Any, ...]:
        return self[2:]

    def __reduce__(self):
        # `type(f)` of a function is not picklable, and the types follow from the
        # values anyway.
        return (make_aux, (self.layout, self.static_values))


def make_aux(layout: Layout, static_values: tuple[Any, ...]) -> Aux:
    return Aux((layout, tuple(map(type, static_values)), *static_values))


def _uncomparable(where: str, a: Any, b: Any, err: Exception) -> TypeError:
    return TypeError(
        f"{where}: static values {a!r} and {b!r} cannot be compared with == "
        f"({type(err).__name__}: {err}). JAX compares static values to decide whether "
        "a compiled function can be reused. Give the value's type a boolean __eq__, or "
        "store the data as a jax/numpy array so that it becomes dynamic."
    )


def _compares_in_python(value: Any) -> bool:
    return isinstance(getattr(type(value), "__eq__", None), types.FunctionType)


def static_equal(a: Any, b: Any) -> bool:
    """Static values as the jit cache compares them: same type, then `==`."""
    return a is b or (type(a) is type(b) and bool(a == b))


class StaticLeaf:
    """A non-array leaf of a mixed field: an empty pytree node carrying the value.

    Its own aux data is the node itself, so unflattening returns the same object and
    the value stays identical (`is`) through any tree_map.
    """

    __slots__ = ("value", "where")

    def __init__(self, value: Any, where: str):
        self.value = value
        self.where = where

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

    def __repr__(self) -> str:
        return f"StaticLeaf({self.value!r})"


jtu.register_pytree_node(StaticLeaf, lambda s: ((), s), lambda s, _: s)


def _is_static_leaf(x: Any) -> bool:
    return type(x) is StaticLeaf


def _unwrap(x: Any) -> Any:
    return x.value if type(x) is StaticLeaf else x


def _map_preserving(node: Any, fn: Any, is_leaf: Any = None, path: str = "") -> Any:
    """`tree_map` with key paths that rebuilds only the nodes above a changed leaf.

    Every untouched sub-node stays the very same object, so the attribute value and the
    pytree child share them and `eqx.tree_at`, which finds nodes by identity, can
    address a sub-node of a mixed attribute (`m.layers[-1]`). Iterative, so nesting
    is limited by JAX's flatten, not by Python's recursion limit.
    """

    def visit(x: Any, x_path: str) -> tuple[bool, Any]:
        """(True, new value) for a leaf; (False, (treedef, key/child pairs)) for a node."""
        if is_leaf is not None and is_leaf(x):
            return True, fn(x, x_path)
        pairs, treedef = jtu.tree_flatten_with_path(x, is_leaf=lambda y: y is not x)
        if jtu.treedef_is_leaf(treedef):
            # A leaf, or a node without children (None, (), a field-less Module such
            # as a StateIndex's sentinel), which stays a node: wrapping it would give
            # the same value two structures, before and after `make_with_state`.
            return True, fn(x, x_path) if treedef.num_leaves else x
        return False, (treedef, pairs)

    done, result = visit(node, path)
    if done:
        return result
    # One entry per node being rebuilt: (node, path, treedef, pairs, new children).
    stack: list[tuple[Any, str, Any, list[tuple[Any, Any]], list[Any]]]
    stack = [(node, path, *result, [])]
    while True:
        x, x_path, treedef, pairs, new = stack[-1]
        if len(new) < len(pairs):
            key, child = pairs[len(new)]
            child_path = x_path + jtu.keystr(key)
            done, result = visit(child, child_path)
            if done:
                new.append(result)
            else:
                stack.append((child, child_path, *result, []))
            continue
        stack.pop()
        if all(a is b for a, (_, b) in zip(new, pairs)):
            rebuilt = x
        else:
            rebuilt = jtu.tree_unflatten(treedef, new)
        if not stack:
            return rebuilt
        stack[-1][4].append(rebuilt)


def unwrap_static_leaves(child: Any) -> Any:
    return _map_preserving(child, lambda x, _: _unwrap(x), _is_static_leaf)


def _static_problem(value: Any) -> str | None:
    """What is wrong with `value` as a static leaf, as the end of a sentence."""
    if isinstance(value, Iterator):
        return (
            f"is an iterator ({type(value).__qualname__}), kept as a static value: "
            "the first loop over it consumes it, and every later one sees it empty. "
            "Store a list or tuple of its items instead (e.g. `list(...)`)."
        )
    hidden = find_hidden_array(value)
    if hidden is not None:
        return (
            f"holds {hidden}, where AutoModule cannot see it, so it is part of a "
            "static value: it will be baked into compiled code as a constant, get no "
            "gradient, and a new one retraces. Store the array as an attribute (or in "
            "a list/dict/tuple/Module attribute), or use eqx.Partial / "
            "jax.tree_util.Partial instead of functools.partial or a closure."
        )
    if is_uncomparable(value):
        return (
            f"is a static value of type {type(value).__qualname__} that can be neither "
            "hashed nor compared with a boolean ==. jax.jit compares static values to "
            "reuse compiled code, and will fail on it. Give the type a boolean __eq__, "
            "or store its data as arrays."
        )
    return None


def _leaf_paths(value: Any) -> list[str]:
    return [jtu.keystr(path) for path, _ in jtu.tree_flatten_with_path(value)[0]]


def _split_field(
    qualname: str, name: str, value: Any, forced_static: bool, warn: bool
) -> tuple[int, Any]:
    """Returns the kind of one field and its child or static value (in a `StaticLeaf`
    if it is STATIC_COMPARED_IN_PYTHON)."""
    where = f"{qualname}.{name}"
    if is_dynamic_leaf(value):
        leaves = [value]
        flags = [True]
        treedef = None
    else:
        leaves, treedef = jtu.tree_flatten(value)
        flags = [is_dynamic_leaf(leaf) for leaf in leaves]
    n_dynamic = sum(flags)
    for i, leaf in enumerate(leaves):
        if type(leaf) is np.ndarray and leaf.dtype.hasobject:
            path = _leaf_paths(value)[i] if treedef is not None else ""
            raise TypeError(
                f"{where}{path} is a numpy array of dtype {leaf.dtype}, which JAX "
                "can neither trace nor store. Convert it to a numeric dtype, or keep "
                "the Python objects in a list or tuple (static)."
            )
    if forced_static:
        if n_dynamic:
            raise TypeError(
                f"{where} is marked eqx.field(static=True) but holds "
                f"{n_dynamic} array(s). AutoModule never makes an array static: remove "
                "static=True (AutoModule makes the non-array parts static by itself), "
                "or store hashable Python data there instead."
            )
        kind = STATIC
    elif leaves and n_dynamic == 0:
        kind = STATIC
    elif n_dynamic == len(leaves):
        return DYNAMIC, value
    else:
        kind = MIXED
    paths = None
    for i, (leaf, flag) in enumerate(zip(leaves, flags)):
        if flag or not warn:
            continue
        problem = _static_problem(leaf)
        if problem is not None:
            if paths is None:
                paths = _leaf_paths(value) if treedef is not None else [""]
            warn_once((where + paths[i], problem), f"{where + paths[i]} {problem}")
    if kind == STATIC:
        if _compares_in_python(value) or any(map(_compares_in_python, leaves)):
            return STATIC_COMPARED_IN_PYTHON, StaticLeaf(value, where)
        return STATIC, value

    def wrap(leaf: Any, path: str) -> Any:
        return leaf if is_dynamic_leaf(leaf) else StaticLeaf(leaf, where + path)

    return MIXED, _map_preserving(value, wrap)


class _ContainsItself(Exception):
    """Raised by a flatten of a module whose partition is being decided."""


_deciding = threading.local()  # .ids: the modules whose partition is being decided


def compute_partition(
    obj: Any, *, final: bool
) -> tuple[dict[str, Any], tuple[tuple[Any, ...], Aux]]:
    """Decides the partition of `obj` from its current field values.

    `final`: construction has ended, so containers are frozen and static values
    checked (with a warning for hidden arrays); otherwise the partition is only
    provisional, for a flatten from inside `__init__` or `__check_init__`.
    Returns the field values and the `(children, aux)` pair.
    """
    deciding: set[int] = getattr(_deciding, "ids", None) or set()
    _deciding.ids = deciding
    if id(obj) in deciding:
        # A field holds the module itself (`self.xs = [self]`): flattening it would
        # recurse forever. The caller deciding that field names it.
        raise _ContainsItself
    deciding.add(id(obj))
    try:
        return _decide(obj, final)
    finally:
        deciding.discard(id(obj))


def _decide(
    obj: Any, final: bool
) -> tuple[dict[str, Any], tuple[tuple[Any, ...], Aux]]:
    cls = type(obj)
    spec = fields_of(cls)
    attrs = _object_getattribute(obj, "__dict__")
    qualname = cls.__qualname__
    values: dict[str, Any] = {}
    kinds = []
    children = []
    static_values = []
    for name, forced_static in zip(spec.names, spec.declared_static):
        try:
            value = attrs[name]
        except KeyError:
            # A default that a custom __init__ left alone, or, while __init__ is
            # still running, a field not yet set.
            value = spec.defaults.get(name, MISSING)
        if final:
            path: ContainerPath = (f"{qualname}.{name}",)
            value = freeze(value, path)
        values[name] = value
        try:
            kind, part = _split_field(qualname, name, value, forced_static, final)
        except _ContainsItself:
            raise TypeError(
                f"{qualname}.{name} holds the {qualname} instance itself: a module "
                "is a tree of its fields and cannot contain itself. Store the data it "
                "needs instead, or pass the module as an argument where it is used."
            ) from None
        (children if kind in _CHILD_KINDS else static_values).append(part)
        kinds.append(kind)
    layout = layout_for(cls, tuple(kinds))
    return values, (tuple(children), make_aux(layout, tuple(static_values)))


class Partitioned:
    """The base that gives AutoModule instances the slot holding `(children, aux)`."""

    __slots__ = ("_autostatic_flat",)


_get_flat = Partitioned._autostatic_flat.__get__  # pyright: ignore[reportAttributeAccessIssue]  # a slot's member descriptor
_set_flat = Partitioned._autostatic_flat.__set__  # pyright: ignore[reportAttributeAccessIssue]  # a slot's member descriptor


def freeze_partition(obj: Any) -> None:
    """Decides and stores the partition of a fully constructed AutoModule."""
    values, flat = compute_partition(obj, final=True)
    _object_getattribute(obj, "__dict__").update(values)
    _set_flat(obj, flat)


def flatten(obj: Any) -> tuple[tuple[Any, ...], Aux]:
    try:
        return _get_flat(obj)
    except AttributeError:
        # Flattened from inside its own __init__ or __check_init__: decide provisionally.
        return compute_partition(obj, final=False)[1]


def flatten_with_keys(obj: Any) -> tuple[tuple[tuple[Any, Any], ...], Aux]:
    children, aux = flatten(obj)
    return tuple(zip(aux.layout.child_keys, children)), aux


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


def flatten_functions(
    cls: type,
) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    """Flatten, flatten-with-keys and unflatten for the new class `cls`: lazy unflatten
    unless a base shadows a field (`needs_eager`)."""
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


# The exposed form, for model surgery and diagnostics: every field a child.


def _map_modules(fn: Callable[[Any], Any], tree: Any) -> Any:
    return jtu.tree_map(
        lambda x: fn(x) if is_automodule(x) else x, tree, is_leaf=is_automodule
    )


def expose(tree: Any, *, keep_declared_static: bool = False) -> Any:
    """A copy of `tree` in which every AutoModule has all its fields as children
    (except, with `keep_declared_static`, those declared `eqx.field(static=True)`, as
    an `eqx.Module` would flatten them)."""

    def expose_module(module: Any) -> Any:
        cls = type(module)
        spec = fields_of(cls)
        attrs = materialise(module)
        kinds, children, static_values = [], [], []
        for name, declared_static in zip(spec.names, spec.declared_static):
            if keep_declared_static and declared_static:
                kinds.append(STATIC)
                static_values.append(attrs[name])
            else:
                kinds.append(DYNAMIC)
                children.append(_map_modules(expose_module, attrs[name]))
        aux = make_aux(layout_for(cls, tuple(kinds)), tuple(static_values))
        return unflatten(cls, aux, tuple(children))

    return _map_modules(expose_module, tree)


def refreeze(tree: Any) -> Any:
    """Decides the partition of every AutoModule in `tree` from its current values."""

    def refreeze_module(module: Any) -> Any:
        cls = type(module)
        attrs = materialise(module)
        fresh = _object_new(cls)
        _object_getattribute(fresh, "__dict__").update(
            (n, _map_modules(refreeze_module, attrs[n])) for n in fields_of(cls).names
        )
        freeze_partition(fresh)
        return fresh

    return _map_modules(refreeze_module, tree)
