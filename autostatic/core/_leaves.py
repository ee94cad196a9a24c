"""The leaf rule: what a value met in a field is, by its type.

Every value an AutoModule's field reaches falls in one category, decided by its exact
type once (`category`), which is what keeps the flatten cheap:

- ARRAY: a jax array or tracer, a numpy scalar of a dtype JAX holds: a dynamic leaf;
- NDARRAY: a numpy array: dynamic if JAX holds its dtype (its dtype is per value);
- NONE: `None`, an empty child, as in an `eqx.Module` (`bias=None`);
- NODE: an AutoModule, a node of its own (its flatten decides its own leaves);
- LAYER: an `equinox.nn` layer, a node made a carrier in the pytree (`_carriers`);
- CARRIER: a carrier handed out to an `is_leaf` callback, standing for its layer;
- NUMBER: a Python bool, int, float or complex: static, but dynamic in a field
  annotated to hold arrays (`_annotations`);
- SHAPE: a `jax.ShapeDtypeStruct`: likewise;
- CONTAINER: a list, tuple, dict, `OrderedDict`, `defaultdict` or namedtuple, or any
  other type JAX flattens as a node (a user's `eqx.Module`): looked into;
- OTHER: anything else (a string, a function, a dtype, a config object): static.
"""

import collections
import functools
import itertools
from typing import Any, Final

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax.core import Tracer

from .._compat import flatten_none_leaves

ARRAY: Final = 0
NDARRAY: Final = 1
NONE: Final = 2
NODE: Final = 3
LAYER: Final = 4
CARRIER: Final = 5
NUMBER: Final = 6
SHAPE: Final = 7
CONTAINER: Final = 8
OTHER: Final = 9

# What is a node to us: decided by its own flatten, never looked into by a field's.
NODES: Final = frozenset({NODE, LAYER, CARRIER})
# What a field of a real model may hold as a child: its values are all arrays.
REAL: Final = frozenset({ARRAY, NDARRAY, NONE, NODE, LAYER})
# What a list or tuple holds as a child as it is, whatever its length (`_split`).
AS_IS: Final = frozenset({ARRAY, NONE, NODE})

BUILTIN_CONTAINERS: Final = frozenset(
    {list, tuple, dict, collections.OrderedDict, collections.defaultdict}
)

# The owners of the NODE, LAYER and CARRIER types, set once by the modules that make
# those classes (`_module`, `_carriers`): this module imports none of them.
_is_node_class: list[Any] = [lambda cls: False]
_is_layer_class: list[Any] = [lambda cls: False]
_is_carrier_class: list[Any] = [lambda cls: False]


def set_class_tests(node: Any, layer: Any, carrier: Any) -> None:
    _is_node_class[0], _is_layer_class[0], _is_carrier_class[0] = node, layer, carrier
    _forget_types()


def _forget_types() -> None:
    # Odd while the sets are cleared: another thread's split taken meanwhile, which
    # may have found a type in one set and missed it in the next, is taken again.
    types_generation[0] += 1
    _categories.clear()
    real_types.clear()
    as_is_types.clear()
    plain_types.clear()
    node_child_types.clear()
    node_types.clear()
    types_generation[0] += 1


# How many times the sets of types met below have been cleared, twice over.
types_generation: list[int] = [0]


@functools.cache
def jax_holds(dtype: np.dtype) -> bool:
    """Whether JAX can trace and store arrays of `dtype` (not text, bytes, dates,
    objects or records)."""
    if dtype.kind in "mM":  # numpy files timedelta64 under its integers
        return False
    return bool(jnp.issubdtype(dtype, jnp.number) or jnp.issubdtype(dtype, jnp.bool_))


def _category_of(cls: type, example: Any) -> int:
    if _is_carrier_class[0](cls):
        return CARRIER
    if _is_node_class[0](cls):
        return NODE
    if _is_layer_class[0](cls):
        return LAYER
    if cls is type(None):
        return NONE
    if cls in (bool, int, float, complex):
        return NUMBER
    if cls is jax.ShapeDtypeStruct:
        return SHAPE
    if cls is np.ndarray:
        return NDARRAY
    if issubclass(cls, (jax.Array, Tracer)):
        return ARRAY
    if issubclass(cls, np.generic):
        return ARRAY if jax_holds(np.dtype(cls)) else OTHER
    if cls in BUILTIN_CONTAINERS or not _is_jax_leaf(example):
        return CONTAINER
    return OTHER


def _is_jax_leaf(x: Any) -> bool:
    """Whether JAX takes `x` for a leaf (its type is no registered node). A
    namedtuple without fields is no leaf, though `treedef_is_leaf` says it is."""
    if is_fieldless_namedtuple(x):
        return False
    return jtu.treedef_is_leaf(jtu.tree_structure(x, is_leaf=lambda y: y is not x))


def is_fieldless_namedtuple(x: Any) -> bool:
    """A namedtuple without fields (optax's `MaskedNode()`, where `optax.masked`
    leaves a parameter out): a node of the tree without leaves, as in an
    `eqx.Module`."""
    return isinstance(x, tuple) and not x and type(x) is not tuple


# Per exact type met, its category: a C lookup on every flatten. Bounded: cleared
# when it grows past what a program's types could fill (classes made in a loop).
_categories: dict[type, int] = {}
_MOST_TYPES: Final = 4096


# The types met so far whose values may be children of a real model (`REAL`), those
# a container holds as children as they are (`AS_IS`), and those of every category
# but CONTAINER (what a container's split takes without looking into).
real_types: set[type] = set()
as_is_types: set[type] = set()
plain_types: set[type] = set()
node_child_types: set[type] = set()  # LAYER and CARRIER: a child holds their carriers
node_types: set[type] = set()  # NODES: not looked into


def category(x: Any) -> int:
    """The category of `x` (see the module docstring), from its exact type."""
    cls = type(x)
    try:
        return _categories[cls]
    except KeyError:
        found = _category_of(cls, x)
        if len(_categories) >= _MOST_TYPES:
            _forget_types()
        _categories[cls] = found
        if found in REAL:
            real_types.add(cls)
        if found in AS_IS:
            as_is_types.add(cls)
        if found in (LAYER, CARRIER):
            node_child_types.add(cls)
        if found in NODES:
            node_types.add(cls)
        if found != CONTAINER:  # last: a type in it is in every set it belongs to
            plain_types.add(cls)
        return found


class TooDeep:
    """What `leaf_types` gives for containers nested deeper than it looks (a list
    that holds itself): a type of no category."""


# Nesting deeper than JAX flattens (its limit is about 900 levels).
_MOST_LEVELS: Final = 1000
_SEQUENCES: Final = frozenset({list, tuple})
_is_list = functools.partial(type.__instancecheck__, list)
_is_tuple = functools.partial(type.__instancecheck__, tuple)
_is_dict = functools.partial(type.__instancecheck__, dict)
_chain = itertools.chain.from_iterable


def leaf_types(value: Any) -> set[type]:
    """The types of what `value` holds below its lists, tuples and dicts (of exactly
    those types: anything else, an array, a module or a namedtuple, is not looked
    into), found level by level in C calls: no Python code runs per item, which is
    what makes a container's split cost about JAX's own flatten of it."""
    for _ in range(_TRIES):
        try:
            return _leaf_types(value)
        except RuntimeError:  # a dict changed size while it was looked at
            # Another thread ran meanwhile: a collection of garbage that this
            # thread's allocations started ran finalizers, which let it in.
            continue
    return _leaf_types(value)


_TRIES: Final = 8


def _leaf_types(value: Any) -> set[type]:
    found: set[type] = set()
    kind = type(value)
    if kind is dict:
        level: Any = value.values()
    elif kind is list or kind is tuple:
        level = value
    else:
        return {kind}
    for _ in range(_MOST_LEVELS):
        types = set(map(type, level))
        inner = types & BUILTIN_NODES
        if not inner:
            found |= types
            return found
        found |= types - inner
        if types <= _SEQUENCES:
            items: Any = _chain(level)
        elif types == _DICT:
            items = _chain(map(dict.values, level))
        else:  # mixed: each kind picked out in C
            items = list(_chain(filter(_is_list, level)))
            items += _chain(filter(_is_tuple, level))
            items += _chain(map(dict.values, filter(_is_dict, level)))
        level = items if type(items) is list else list(items)
    found.add(TooDeep)
    return found


def snapshot(value: Any) -> Any:
    """A copy of `value`'s containers as they stand, taken in one C call (no other
    thread can change them halfway), its leaves, modules and layers the same
    objects: what a walk in Python looks at where another thread may change the
    value meanwhile."""
    if type(value) not in BUILTIN_NODES:
        return value
    leaves, treedef = flatten_none_leaves(value)
    return treedef.unflatten(leaves)


BUILTIN_NODES: Final = frozenset({list, tuple, dict})
_DICT: Final = frozenset({dict})


def item_categories(value: Any, types: set[type] | None = None) -> set[int]:
    """The categories of the items of a list or tuple, from their types (one item per
    type looked at; `types`, the set of them, where known)."""
    if types is None:
        types = set(map(type, value))
    if len(types) == 1:
        return {category(value[0])}
    examples = dict(zip(map(type, value), value))
    return {category(example) for example in examples.values()}


def is_array(x: Any) -> bool:
    """`eqx.is_array`, less numpy values of a dtype JAX cannot hold: a text, bytes or
    date scalar (`np.str_("relu")` read from a config) is static, as a `str` is."""
    kind = category(x)
    return kind == ARRAY or (kind == NDARRAY and jax_holds(x.dtype))


def is_dynamic(x: Any, array_field: bool) -> bool:
    """Whether the leaf `x` of a field is a pytree child: an array, or in a field
    annotated to hold arrays a number or `ShapeDtypeStruct` standing for one."""
    kind = category(x)
    if kind == ARRAY or (kind == NDARRAY and jax_holds(x.dtype)):
        return True
    return array_field and (kind in (NUMBER, SHAPE))


def is_dynamic_leaf(x: Any) -> bool:
    """A leaf of a template or of a tree given for loading: an array (jax, numpy,
    tracer) or a `jax.ShapeDtypeStruct`, as `eqx.filter_eval_shape` makes them."""
    return eqx.is_array(x) or isinstance(x, jax.ShapeDtypeStruct)


def stops(x: Any) -> bool:
    """`is_leaf` for a field's flatten: our nodes are items, not looked into."""
    return category(x) in NODES


def all_real(tree: Any) -> bool:
    """Whether every leaf of `tree` is what a model's children hold (arrays, `None`,
    AutoModules, `eqx.nn` layers): put in place as it is, it needs nothing decided."""
    return all(category(x) in REAL for x in jtu.tree_leaves(tree, is_leaf=stops))


def is_model(leaves: list[Any]) -> bool:
    """Whether a tree of these leaves has leaves and every one is an array: a model,
    not a tree mapped from one (a filter spec, whose leaves are bools, or an
    `in_axes` tree mapped to `None`, which has none)."""
    return bool(leaves) and all(map(is_dynamic_leaf, leaves))
