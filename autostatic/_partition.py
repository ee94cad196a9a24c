"""Deciding the static/dynamic partition of an AutoModule instance.

The partition is decided once, when construction ends (`freeze_partition`), and is
carried in the aux data from then on (`_layout`), so every later flatten only reads it
back and every unflatten only puts values where it says. Nothing here ever inspects
leaves after construction: unflattening with `None`s, in_axes ints, shardings or
sentinels keeps the structure (deciding again at flatten time is what inox abandoned).

Each declared field is one of three kinds, in declaration order:

- dynamic: every leaf of its value is an array (or it has no leaves). The value itself
  is a pytree child, so key paths are natural: `.layers[0].weight`. So is a list or
  dict holding both arrays and other leaves (a stack of layers and activations): it
  becomes a `MixedFrozenList` / `MixedFrozenDict`, which carries its non-array items
  in its own aux data, as do the lists and dicts inside it.
- static: it has leaves and none is an array. The value rides in the aux data.
- mixed: both, in another container (a tuple, a user's pytree). The child is the
  value with each non-array leaf wrapped in an empty pytree node (`StaticLeaf`) that
  carries the leaf in its own aux data; the attribute keeps the plain value. The
  wrappers travel with their parent nodes through `tree_at`, `make_with_state` and
  other rewrites of sub-nodes.

Before that, lists, dicts and sets are frozen and `eqx.nn` layers become their fast
twins (`_twins`). This module also gives the exposed form used by model surgery and
diagnostics (`expose`, `refreeze`).
"""

import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, Final

import equinox as eqx
import jax
import jax.tree_util as jtu
import numpy as np

from ._compat import install_flatten_generator
from ._containers import ContainerPath, freeze, FrozenDict, FrozenList, SCALAR_TYPES
from ._layout import (
    Aux,
    CHILD_KINDS,
    compares_in_python,
    DYNAMIC,
    fields_of,
    Flatten,
    flatten_functions as layout_flatten_functions,
    has_partition,
    layout_for,
    make_aux,
    map_preserving,
    materialise,
    MIXED,
    MIXED_DEPTH,
    MixedFrozenDict,
    MixedFrozenList,
    PlainSplit,
    set_partition,
    STATIC,
    STATIC_COMPARED_IN_PYTHON,
    StaticLeaf,
    unflatten,
    unmixed,
)
from ._static_checks import find_hidden_array, is_uncomparable, warn_once
from ._twins import is_twin_class, is_twinned_class, twin_class

MISSING: Final = object()

_object_getattribute = object.__getattribute__
_object_new = object.__new__


def is_dynamic_leaf(x: Any) -> bool:
    """Arrays (jax, numpy, tracers) and `jax.ShapeDtypeStruct` templates are dynamic.

    Treating `ShapeDtypeStruct` as an array, as `eqx.filter_eval_shape` does, gives a
    hand-built abstract template the same structure as a real instance.
    """
    return eqx.is_array(x) or isinstance(x, jax.ShapeDtypeStruct)


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


# Exact types found to be array leaves that need no per-value check (jax arrays,
# tracers, numpy scalars; not numpy arrays, whose dtype may be `object`): whether a
# type is an array does not depend on the value, so the weights of every layer skip
# `eqx.is_array`'s isinstance chain and the container walk.
_plain_array_types: set[type] = set()


def _plain_kind(value: Any, forced_static: bool) -> int | None:
    """STATIC or DYNAMIC for a value that needs neither freezing nor checks, else
    None."""
    kind = type(value)
    if kind in SCALAR_TYPES:
        return STATIC  # the sizes and flags of every layer
    if kind in _plain_array_types and not forced_static:
        return DYNAMIC
    return None


def _split_field(
    qualname: str, name: str, value: Any, forced_static: bool, warn: bool
) -> tuple[int, Any]:
    """Returns the kind of one field and its child or static value (in a `StaticLeaf`
    if it is STATIC_COMPARED_IN_PYTHON). `_decide` has taken the plain values."""
    if (
        (type(value) is FrozenList or type(value) is tuple)
        and value
        and all(type(x) in SCALAR_TYPES for x in value)
    ):
        return STATIC, value  # sizes, names: no array, nothing to check
    where = f"{qualname}.{name}"
    if is_dynamic_leaf(value):
        if type(value) is not np.ndarray:
            _plain_array_types.add(type(value))
        leaves = [value]
        flags = [True]
        treedef = None
    else:
        leaves, treedef = jtu.tree_flatten(value)
        arrays = _plain_array_types
        flags = [type(x) in arrays or is_dynamic_leaf(x) for x in leaves]
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
        if flag or not warn or type(leaf) in SCALAR_TYPES:
            continue
        problem = _static_problem(leaf)
        if problem is not None:
            if paths is None:
                paths = _leaf_paths(value) if treedef is not None else [""]
            warn_once((where + paths[i], problem), f"{where + paths[i]} {problem}")
    if kind == STATIC:
        if compares_in_python(value) or any(map(compares_in_python, leaves)):
            return STATIC_COMPARED_IN_PYTHON, StaticLeaf(value, where)
        return STATIC, value

    if type(value) is FrozenList or type(value) is FrozenDict:
        mixed = _mixed_container(value, set(map(id, leaves)))
        if mixed is not None:
            return DYNAMIC, mixed  # the attribute is the child, as it is

    def wrap(leaf: Any, path: str) -> Any:
        # A module with a partition flattens to arrays only: nothing to wrap inside.
        if is_dynamic_leaf(leaf) or has_partition(leaf):
            return leaf
        return StaticLeaf(leaf, where + path)

    return MIXED, map_preserving(value, wrap, has_partition)


def _mixed_container(value: Any, leaf_ids: set[int], depth: int = 0) -> Any:
    """`value`, a frozen list or dict, with the non-array leaf items of it and of
    the lists and dicts in it carried in their own aux data (`MixedFrozenList`,
    `MixedFrozenDict`); None if an item is another kind of node holding a
    non-array leaf (a tuple, a user's pytree), or the nest is deeper than
    `MIXED_DEPTH`: that value keeps `StaticLeaf` wrappers."""
    if depth > MIXED_DEPTH:
        return None
    if type(value) is FrozenList:
        keys, items = None, list(value)
    else:
        keys = value._sorted_keys  # pyright: ignore[reportAttributeAccessIssue]
        items = [dict.__getitem__(value, k) for k in keys]
    static = []
    changed = False
    for i, item in enumerate(items):
        kind = type(item)
        if kind in _plain_array_types or item is None or has_partition(item):
            continue
        if kind is FrozenList or kind is FrozenDict:
            new = _mixed_container(item, leaf_ids, depth + 1)
            if new is None:
                return None
            if new is not item:
                items[i], changed = new, True
        elif id(item) not in leaf_ids:
            return None
        elif not is_dynamic_leaf(item):
            static.append(i)
    if not static and not changed:
        return value
    path = value._path  # pyright: ignore[reportAttributeAccessIssue]
    positions = tuple(static)
    if keys is None:
        if static:
            return MixedFrozenList(items, path, positions)
        return FrozenList(items, path)
    new = dict(zip(keys, items))
    pairs = [(k, new[k]) for k in value]  # in the user's order
    if static:
        return MixedFrozenDict(pairs, path, positions)
    return FrozenDict(pairs, path)


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
    plain = _plain_split(obj)
    if plain is not None:
        return {}, plain  # nothing frozen, nothing to check: the fields stay
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


# The path is the aux data of the frozen containers, compared on every jit cache
# lookup: one tuple object per field, so that two models' paths are the same object.
_field_paths: dict[tuple[str, str], ContainerPath] = {}


def _field_path(qualname: str, name: str) -> ContainerPath:
    try:
        return _field_paths[qualname, name]
    except KeyError:
        path = (sys.intern(f"{qualname}.{name}"),)
        return _field_paths.setdefault((qualname, name), path)


def _plain_split(obj: Any) -> Flatten | None:
    """The partition of an instance whose fields all hold plain values (numbers,
    strings, jax arrays: most `eqx.nn` layers), from the split cached per types
    tuple; None if a field holds anything else or is unset."""
    cls = type(obj)
    spec = fields_of(cls)
    attrs = _object_getattribute(obj, "__dict__")
    try:
        values = [attrs[name] for name in spec.names]
    except KeyError:
        return None
    types = tuple(map(type, values))
    split = spec.plain_splits.get(types)
    if split is None:
        kinds = tuple(map(_plain_kind, values, spec.declared_static))
        if None in kinds:
            return None
        layout = layout_for(cls, kinds)  # pyright: ignore[reportArgumentType]  # no None
        children = tuple(i for i, k in enumerate(kinds) if k == DYNAMIC)
        static = tuple(i for i, k in enumerate(kinds) if k != DYNAMIC)
        typed = layout.with_types(tuple(types[i] for i in static))
        split = spec.plain_splits.setdefault(types, PlainSplit(typed, children, static))
    return (
        tuple([values[i] for i in split.children]),
        Aux((split.layout, *[values[i] for i in split.static])),
    )


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
        plain = _plain_kind(value, forced_static)
        if plain is not None:
            values[name] = value
            (children if plain == DYNAMIC else static_values).append(value)
            kinds.append(plain)
            continue
        if final:
            value = freeze_and_twin(value, _field_path(qualname, name))
        try:
            kind, part = _split_field(qualname, name, value, forced_static, final)
        except _ContainsItself:
            raise TypeError(
                f"{qualname}.{name} holds the {qualname} instance itself: a module "
                "is a tree of its fields and cannot contain itself. Store the data it "
                "needs instead, or pass the module as an argument where it is used."
            ) from None
        # A dynamic part is the value itself (or the same list as a
        # `MixedFrozenList`); a mixed or static one wraps it.
        values[name] = part if kind == DYNAMIC else value
        (children if kind in CHILD_KINDS else static_values).append(part)
        kinds.append(kind)
    layout = layout_for(cls, tuple(kinds))
    return values, (tuple(children), make_aux(layout, tuple(static_values)))


def freeze_partition(obj: Any) -> None:
    """Decides and stores the partition of a fully constructed AutoModule."""
    values, flat = compute_partition(obj, final=True)
    _object_getattribute(obj, "__dict__").update(values)
    set_partition(obj, flat)


def _provisional(obj: Any) -> Flatten:
    return compute_partition(obj, final=False)[1]


def flatten_functions(
    cls: type,
) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    """The flatten functions of a new AutoModule class; an instance flattened from
    inside its own `__init__` or `__check_init__` gets a provisional partition."""
    return layout_flatten_functions(cls, _provisional)


# Twins of the eqx.nn layers (`_twins`): instances are made, and their partition
# decided, here; the classes there.

# Per type met while freezing: whether its instances become twins (most are arrays,
# numbers and functions: one dict lookup each).
_twinned_types: dict[type, bool] = {}


def _to_twin(item: Any, path: ContainerPath) -> Any:
    cls = type(item)
    twinned = _twinned_types.get(cls)
    if twinned is None:
        twinned = _twinned_types[cls] = is_twinned_class(cls)
    if not twinned:
        return item
    return restore_twin(cls, _object_getattribute(item, "__dict__"))


def _decided(cls: type, attrs: Any) -> Any:
    """A new `cls` instance with the fields `attrs` and its partition decided (the
    layers inside it twinned, its containers frozen), without calling `__init__`."""
    obj = _object_new(cls)
    _object_getattribute(obj, "__dict__").update(attrs)
    freeze_partition(obj)
    return obj


def restore_twin(layer_cls: type, attrs: dict[str, Any]) -> Any:
    """A twin of class `layer_cls` with the fields `attrs`. Also how a twin unpickles."""
    return _decided(twin_class(layer_cls), attrs)


def freeze_and_twin(value: Any, path: ContainerPath) -> Any:
    """`freeze` that also replaces every `eqx.nn` layer reachable through built-in
    containers by its twin (and, deciding the twin's partition, the layers in it)."""
    return freeze(value, path, _to_twin)


install_flatten_generator(
    is_twin_class, lambda cls: layout_flatten_functions(cls, _provisional, filled=True)
)


# The exposed form, for model surgery and diagnostics: every field a child.


def _map_modules(fn: Callable[[Any], Any], tree: Any) -> Any:
    """`fn` on every AutoModule and twin in `tree` (not inside them)."""
    return jtu.tree_map(
        lambda x: fn(x) if has_partition(x) else x, tree, is_leaf=has_partition
    )


def _is_mixed(x: Any) -> bool:
    return type(x) is MixedFrozenList or type(x) is MixedFrozenDict


def _partitioned_or_mixed(x: Any) -> bool:
    return has_partition(x) or _is_mixed(x)


def expose(tree: Any, *, keep_declared_static: bool = False) -> Any:
    """A copy of `tree` in which every AutoModule (and twin) has all its fields as children
    (except, with `keep_declared_static`, those declared `eqx.field(static=True)`, as
    an `eqx.Module` would flatten them), and so has every mixed list or dict, also one
    taken out of its module (the `pytree` of an `eqx.nn.Shared`, `model.layers`)."""

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
                value = unmixed(attrs[name])
                children.append(_map_modules(expose_module, value))
        aux = make_aux(layout_for(cls, tuple(kinds)), tuple(static_values))
        return unflatten(cls, aux, tuple(children))

    def expose_node(node: Any) -> Any:
        if has_partition(node):
            return expose_module(node)
        if _is_mixed(node):
            return _map_modules(expose_module, unmixed(node))
        return node

    return jtu.tree_map(expose_node, tree, is_leaf=_partitioned_or_mixed)


def refreeze(tree: Any) -> Any:
    """Decides the partition of every AutoModule and twin in `tree` from its current
    values."""

    def refreeze_module(module: Any) -> Any:
        cls = type(module)
        attrs = materialise(module)
        names = fields_of(cls).names
        return _decided(
            cls, ((n, _map_modules(refreeze_module, attrs[n])) for n in names)
        )

    return _map_modules(refreeze_module, tree)
