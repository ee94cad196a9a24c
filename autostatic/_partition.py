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

Each instance keeps `(children, aux)` in a slot, so flattening is one slot read, and
unflattening only creates the instance and fills that slot; the attributes are filled in
from it on first access (`materialise`).
"""

import dataclasses
import types
import weakref
from typing import Any, Final

import equinox as eqx
import jax
import jax.tree_util as jtu

from ._containers import ContainerPath, freeze
from ._static_checks import find_hidden_array, is_uncomparable, warn_once

MISSING: Final = object()

FLAT: Final = "__autostatic_flat__"  # the name of the slot on AutoModule
DYNAMIC: Final = 0
STATIC: Final = 1
MIXED: Final = 2
GUARDED: Final = 3  # static, with a type whose `==` runs in Python (see `Aux`)

_object_getattribute = object.__getattribute__
_object_setattr = object.__setattr__
_object_new = object.__new__


def is_dynamic_leaf(x: Any) -> bool:
    """Arrays (jax, numpy, tracers) and `jax.ShapeDtypeStruct` templates are dynamic.

    Treating `ShapeDtypeStruct` as an array, as `eqx.filter_eval_shape` does, gives a
    hand-built abstract template the same structure as a real instance.
    """
    return eqx.is_array(x) or isinstance(x, jax.ShapeDtypeStruct)


class Layout:
    """Which field is which kind, shared by every instance of a class with that split."""

    __slots__ = (
        "cls",
        "kinds",
        "dynamic_names",
        "dynamic_keys",
        "mixed",
        "static_names",
        "guarded",
    )

    def __init__(self, cls: type, names: tuple[str, ...], kinds: tuple[int, ...]):
        dynamic = [k for k in kinds if k in (DYNAMIC, MIXED)]
        static = [k for k in kinds if k in (STATIC, GUARDED)]
        self.cls = cls
        self.kinds = kinds
        self.dynamic_names = tuple(
            n for n, k in zip(names, kinds) if k in (DYNAMIC, MIXED)
        )
        self.dynamic_keys = tuple(jtu.GetAttrKey(n) for n in self.dynamic_names)
        self.mixed = tuple(i for i, k in enumerate(dynamic) if k == MIXED)
        self.static_names = tuple(
            n for n, k in zip(names, kinds) if k in (STATIC, GUARDED)
        )
        self.guarded = tuple(i for i, k in enumerate(static) if k == GUARDED)

    def __reduce__(self):
        return (layout_for, (self.cls, self.kinds))

    def __repr__(self) -> str:
        return (
            f"Layout({self.cls.__qualname__}, dynamic={self.dynamic_names}, "
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
        names = tuple(name for name, _ in cls.__autostatic_fields__)
        # setdefault: threads constructing the first instances at once share one.
        return per_class.setdefault(kinds, Layout(cls, names, kinds))


def _uncomparable(where: str, a: Any, b: Any, err: Exception) -> TypeError:
    return TypeError(
        f"{where}: static values {a!r} and {b!r} cannot be compared with == "
        f"({type(err).__name__}: {err}). JAX compares static values to decide whether "
        "a compiled function can be reused. Give the value's type a boolean __eq__, or "
        "store the data as a jax/numpy array so that it becomes dynamic."
    )


# The aux data of an AutoModule node is a plain tuple `(layout, types, *static_values)`,
# so that JAX's treedef comparison (what every jit cache lookup does, as a treedef hash
# ignores aux data) runs in C: the layout by identity, the static values' types (so
# that `1`, `1.0` and `True`, equal under `==`, do not share a compiled program), then
# each static value with `==`.
# A static value whose type compares in Python (and so may raise) is kept in a
# `StaticLeaf`, whose `__eq__` names the attribute if the comparison fails.
Aux = tuple


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
    address a sub-node of a mixed attribute (`m.layers[-1]`).
    """
    if is_leaf is not None and is_leaf(node):
        return fn(node, path)
    pairs, treedef = jtu.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    if jtu.treedef_is_leaf(treedef):
        return fn(node, path)
    new = [_map_preserving(c, fn, is_leaf, path + jtu.keystr(k)) for k, c in pairs]
    if all(a is b for a, (_, b) in zip(new, pairs)):
        return node
    return jtu.tree_unflatten(treedef, new)


def unwrap_static_leaves(child: Any) -> Any:
    return _map_preserving(child, lambda x, _: _unwrap(x), _is_static_leaf)


def _static_problem(value: Any) -> str | None:
    """What is wrong with `value` as a static leaf, as the end of a sentence."""
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
    """Returns the kind of one field and its child (or its static value, in a
    `StaticLeaf` if it is GUARDED)."""
    where = f"{qualname}.{name}"
    if is_dynamic_leaf(value):
        leaves = [value]
        flags = [True]
        treedef = None
    else:
        leaves, treedef = jtu.tree_flatten(value)
        flags = [is_dynamic_leaf(leaf) for leaf in leaves]
    n_dynamic = sum(flags)
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
            warn_once((where + paths[i], problem), f"{where + paths[i]} {problem}", 4)
    if kind == STATIC:
        if _compares_in_python(value) or any(map(_compares_in_python, leaves)):
            return GUARDED, StaticLeaf(value, where)
        return STATIC, value

    def wrap(leaf: Any, path: str) -> Any:
        return leaf if is_dynamic_leaf(leaf) else StaticLeaf(leaf, where + path)

    return MIXED, _map_preserving(value, wrap)


def compute_partition(
    obj: Any, *, freeze_values: bool, warn: bool
) -> tuple[dict[str, Any], tuple[tuple[Any, ...], Aux]]:
    """Decides the partition of `obj` from its current field values.

    Returns the (possibly frozen) field values and the `(children, aux)` pair.
    """
    cls = type(obj)
    attrs = _object_getattribute(obj, "__dict__")
    qualname = cls.__qualname__
    values: dict[str, Any] = {}
    kinds = []
    children = []
    static_values = []
    for name, forced_static in cls.__autostatic_fields__:
        try:
            value = attrs[name]
        except KeyError:
            # A default that a custom __init__ left alone, or, while __init__ is
            # still running (a provisional flatten), a field not yet set.
            value = cls.__autostatic_defaults__.get(name, MISSING)
        if freeze_values:
            path: ContainerPath = (f"{qualname}.{name}",)
            value = freeze(value, path)
        values[name] = value
        kind, part = _split_field(qualname, name, value, forced_static, warn)
        (static_values if kind in (STATIC, GUARDED) else children).append(part)
        kinds.append(kind)
    layout = layout_for(cls, tuple(kinds))
    types = tuple(map(type, static_values))
    return values, (tuple(children), (layout, types, *static_values))


_get_flat: Any = None  # the slot's descriptor methods, bound by `bind_slot`
_set_flat: Any = None


def bind_slot(slot: Any) -> None:
    global _get_flat, _set_flat
    _get_flat, _set_flat = slot.__get__, slot.__set__


def freeze_partition(obj: Any) -> None:
    """Decides and stores the partition of a fully constructed AutoModule."""
    values, flat = compute_partition(obj, freeze_values=True, warn=True)
    _object_getattribute(obj, "__dict__").update(values)
    _set_flat(obj, flat)


def flatten(obj: Any) -> tuple[tuple[Any, ...], Aux]:
    try:
        return _get_flat(obj)
    except AttributeError:
        # Flattened from inside its own __init__ or __check_init__: decide provisionally.
        return compute_partition(obj, freeze_values=False, warn=False)[1]


def flatten_with_keys(obj: Any):
    children, aux = flatten(obj)
    return tuple(zip(aux[0].dynamic_keys, children)), aux


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


def moved_defaults(cls: type) -> set[str]:
    """The fields whose dataclass default sits on `cls` itself; the metaclass moves
    them to `__autostatic_defaults__`, so that they cannot shadow unfilled fields."""
    return {
        f.name
        for f in dataclasses.fields(cls)
        if f.default is not dataclasses.MISSING and vars(cls).get(f.name) is f.default
    }


def needs_eager(cls: type) -> bool:
    """Whether a field name of `cls` still resolves on the class once its own defaults
    have moved (a non-AutoModule base's default, a parent's method of that name): it
    would shadow a lazily unflattened instance's empty `__dict__`."""
    moved = moved_defaults(cls)
    return any(
        f.name in vars(klass)
        for klass in cls.__mro__
        for f in dataclasses.fields(cls)
        if not (klass is cls and f.name in moved)
    )


def materialise(obj: Any) -> dict[str, Any]:
    """Returns the `__dict__` of `obj` with every field filled in."""
    attrs = _object_getattribute(obj, "__dict__")
    fields = type(obj).__autostatic_fields__
    # Filled in already, unless the first field is missing: other entries (e.g. from
    # `functools.cached_property`) may have arrived first.
    if fields and fields[0][0] not in attrs:
        try:
            children, aux = _get_flat(obj)
        except AttributeError:  # still in __init__, before anything was assigned
            return attrs
        layout = aux[0]
        attrs.update(zip(layout.static_names, aux[2:]))
        for i in layout.guarded:
            name = layout.static_names[i]
            attrs[name] = attrs[name].value
        if layout.mixed:
            values = list(children)
            for i in layout.mixed:
                values[i] = unwrap_static_leaves(values[i])
            attrs.update(zip(layout.dynamic_names, values))
        else:
            attrs.update(zip(layout.dynamic_names, children))
    return attrs


def reduce(obj: Any) -> tuple[Any, ...]:
    """`__reduce__` for copy and pickle: the class, the fields and the partition."""
    return (restore, (type(obj), dict(materialise(obj)), _get_flat(obj)))


def restore(cls: type, attrs: dict[str, Any], flat: tuple[tuple[Any, ...], Aux]) -> Any:
    obj = _object_new(cls)
    _object_getattribute(obj, "__dict__").update(attrs)
    _set_flat(obj, flat)
    return obj
