"""The built-in containers of a field's value: walking them, and watching them.

An AutoModule's attributes are the very objects `__init__` assigned: built-in lists,
dicts, tuples and sets, of their own types. The pytree node keeps its decided
`(children, aux)` beside them, so a later in-place change of a container
(`m.layers.append(x)`, `list.append(m.layers, x)`, `heapq.heappush(m.q, x)`) must
be noticed: `watched_containers` records every mutable container the fields reach
through built-in containers, item by item, and the node's flatten decides the partition
afresh when one has changed. Eager code and `jax.jit` then see the same values.
"""

import dataclasses
import operator
from collections import defaultdict, OrderedDict
from collections.abc import Callable, Collection, Hashable, Sequence
from typing import Any, Final

import equinox as eqx
import jax.tree_util as jtu

# Where a container sits: ("Net.layers", 3, "w") formats as Net.layers[3]['w'].
ContainerPath = tuple[Hashable, ...]


def format_path(path: ContainerPath) -> str:
    if not path:
        return "this container"
    head, *keys = path
    return str(head) + "".join(
        f".{key.name}" if isinstance(key, jtu.GetAttrKey) else f"[{key!r}]"  # pyright: ignore[reportAttributeAccessIssue]  # narrowed by isinstance
        for key in keys
    )


# Python scalars: leaves that are static, compare in C, hide no array and are never a
# container.
SCALAR_TYPES: Final = frozenset({int, float, bool, str, complex, bytes})
_NOT_CONTAINERS: Final = SCALAR_TYPES | {type(None)}


class ContainerCycleError(TypeError):
    """A list, dict or tuple that contains itself: a pytree cannot hold a cycle."""


def _cycle_error(path: ContainerPath) -> ContainerCycleError:
    return ContainerCycleError(
        f"{format_path(path)} is a container that contains itself (a cycle). A "
        "pytree cannot hold a cycle: store the data without the self-reference."
    )


# A watched container's items as a flat tuple of objects (a dict's keys, then values).
Snapshot = Callable[[Any], tuple[Any, ...]]


@dataclasses.dataclass(frozen=True)
class ContainerType:
    """How AutoModule handles one built-in container type that JAX flattens as a
    node: how its items are reached, how it is made again from new items, and, if
    it can change in place, how `watched_containers` records it (compared as a tuple,
    in C)."""

    items: Callable[[Any], list[tuple[Hashable, Any]]]
    rebuild: Callable[[Any, list[Any]], Any]
    snapshot: "Snapshot | None" = None


def _sequence_items(value: Any) -> list[tuple[Hashable, Any]]:
    return list(enumerate(value))


def _dict_items(value: Any) -> list[tuple[Hashable, Any]]:
    return list(value.items())


def _dict_snapshot(c: Any) -> tuple[Any, ...]:
    return (*c, *c.values())


def _defaultdict_snapshot(c: Any) -> tuple[Any, ...]:
    return (*c, *c.values(), c.default_factory)


def _dict_rebuilder(kind: Callable[[dict], Any]) -> Callable[[Any, list[Any]], Any]:
    return lambda value, items: kind(dict(zip(value.keys(), items)))


# The container types, by exact type (a subclass is a leaf to JAX; namedtuples,
# each its own type, share `_NAMEDTUPLE`). A new container type is one row here.
CONTAINER_TYPES: Final[dict[type, ContainerType]] = {
    list: ContainerType(_sequence_items, lambda _, items: items, tuple),
    tuple: ContainerType(_sequence_items, lambda _, items: tuple(items)),
    dict: ContainerType(_dict_items, _dict_rebuilder(dict), _dict_snapshot),
    OrderedDict: ContainerType(
        _dict_items, _dict_rebuilder(OrderedDict), _dict_snapshot
    ),
    defaultdict: ContainerType(
        _dict_items,
        lambda value, items: defaultdict(
            value.default_factory, dict(zip(value.keys(), items))
        ),
        _defaultdict_snapshot,
    ),
}
_NAMEDTUPLE: Final = ContainerType(
    _sequence_items, lambda value, items: type(value)(*items)
)
# Leaves to JAX that a change in place would still alter: watched, never walked.
_WATCHED_LEAF_SNAPSHOTS: Final[dict[type, Snapshot]] = {set: tuple}


def container_type(kind: type) -> ContainerType | None:
    """The row of `CONTAINER_TYPES` for `kind`, None if JAX takes it for a leaf."""
    row = CONTAINER_TYPES.get(kind)
    if row is None and issubclass(kind, tuple) and hasattr(kind, "_fields"):
        return _NAMEDTUPLE
    return row


def container_items(value: Any) -> list[tuple[Hashable, Any]] | None:
    """(key, item) pairs of a container JAX flattens as a node, else None."""
    row = container_type(type(value))
    return None if row is None else row.items(value)


def _with_items(value: Any, items: list[Any]) -> Any:
    """`value`, a container, with these items: itself if none changed."""
    kind = type(value)
    old = value.values() if kind in _DICT_LIKE else value
    if all(map(operator.is_, items, old)):
        return value
    row = container_type(kind)
    assert row is not None  # only containers are rebuilt
    return row.rebuild(value, items)


# How a watched type is recorded: containers that can change in place, and the
# watched leaves.
_SNAPSHOTS: Final[dict[type, Snapshot]] = {
    **{kind: row.snapshot for kind, row in CONTAINER_TYPES.items() if row.snapshot},
    **_WATCHED_LEAF_SNAPSHOTS,
}


# How a list is recorded: what generated code that records one inline uses.
LIST_SNAPSHOT: Final = _SNAPSHOTS[list]


def is_watched(kind: type) -> bool:
    """Whether a change in place to a `kind` would alter the tree: watched."""
    return kind in _SNAPSHOTS


_DICT_LIKE: Final = frozenset(
    kind for kind, row in CONTAINER_TYPES.items() if row.items is _dict_items
)


# Exact types met as items that are not containers (arrays, layers, functions,
# numbers; never `set`, which is watched): a list of only these is walked in C.
_leaf_types: set[type] = set(_NOT_CONTAINERS)


def known_leaf_types() -> set[type]:
    """The exact types known not to be containers (grown as they are met): a value of
    one reaches no container. Read it; add to it with `add_leaf_type`."""
    return _leaf_types


def add_leaf_type(kind: type) -> None:
    """Records that instances of `kind` are no containers, to be walked past."""
    _leaf_types.add(kind)


def _leaf(
    item: Any, convert: Callable[[Any], Any] | None, watched: list[Any] | None
) -> Any:
    kind = type(item)
    if kind in _WATCHED_LEAF_SNAPSHOTS:
        if watched is not None:
            watched.append(item)
    else:
        _leaf_types.add(kind)
    return item if convert is None else convert(item)


def walk(
    value: Any,
    path: ContainerPath,
    convert: Callable[[Any], Any] | None,
    watched: list[Any] | None,
) -> Any:
    """`value` with `convert(item)` in place of every item that is not a built-in
    container, reached through built-in containers; a container none of whose items
    changed is kept as it is. Every list, dict and set met is appended to `watched`.

    Iterative, so a nest is limited by JAX's own flatten (Equinox builds and jits 900
    nested lists), not by Python's recursion limit; a container met again on its own
    path is a cycle and raises `ContainerCycleError` naming where.
    """

    kind = type(value)
    if kind in _leaf_types:
        return value if convert is None else convert(value)
    if (kind is list or kind is tuple) and _leaf_types.issuperset(map(type, value)):
        # A flat list of layers, arrays or numbers: no nesting to follow.
        if watched is not None and kind is list:
            watched.append(value)
        if convert is None:
            return value
        return _with_items(value, list(map(convert, value)))
    items = container_items(value)
    if items is None:
        return _leaf(value, convert, watched)
    if watched is not None and is_watched(type(value)):
        watched.append(value)
    # One entry per container being walked: (container, path, its items, new ones).
    stack = [(value, path, items, [])]
    on_path = {id(value)}
    while True:
        node, node_path, node_items, done = stack[-1]
        if len(done) < len(node_items):
            key, item = node_items[len(done)]
            if type(item) in _NOT_CONTAINERS:
                done.append(item)
                continue
            sub_items = container_items(item)
            if sub_items is None:
                done.append(_leaf(item, convert, watched))
                continue
            item_path = (*node_path, key)
            if id(item) in on_path:
                raise _cycle_error(item_path)
            on_path.add(id(item))
            if watched is not None and is_watched(type(item)):
                watched.append(item)
            stack.append((item, item_path, sub_items, []))
            continue
        stack.pop()
        on_path.discard(id(node))
        result = _with_items(node, done)
        if not stack:
            return result
        stack[-1][3].append(result)


def check_acyclic(value: Any, path: ContainerPath) -> None:
    """Raises `ContainerCycleError` naming where, if a list, dict or tuple reachable
    through built-in containers from `value` contains itself. Builds nothing."""
    if type(value) not in _NOT_CONTAINERS:
        walk(value, path, None, None)


# `(container, snapshot, items, by_identity)`: the node's flatten takes the container
# for unchanged while `snapshot(container) == items`, and, `by_identity`, each item is
# the very same object.
ContainerRecord = tuple[Any, Snapshot, tuple[Any, ...], bool]
ContainerRecords = tuple[ContainerRecord, ...]


# Exact types whose `==` between an item and its replacement is true only where the
# tree and the results would be the same, or nearly: a container holding only these
# is recorded as a tuple of its items and compared with `!=` in C (identical items are
# equal without a call of `==`: a pointer comparison per item). Types with no `__eq__`
# of their own (functions, activations) compare by identity; strings by value; Equinox
# modules by `tree_equal`, which holds only for arrays of the same shapes, dtypes and
# values and equal static fields (AutoModules: the very same arrays). Floats (`0.0 ==
# -0.0`), complex numbers, arrays (a one-element array `==` a number), containers
# (`[1] == [1.0]`) and types with an `__eq__` of their own are not: a container
# holding one is also compared item by item by identity (~30 ns an item, ~110 ns a
# short list). Ints and bools are taken as exact, though `1 == 1.0 == True`: a list
# of sizes is in most layers, and the identity pass on it cost the 256-layer MLP's
# flatten 0.47x -> 0.62x of the fair twin (design.md).
_exact_eq_types: set[type] = {str, type(None), int, bool}
_inexact_eq_types: set[type] = set()


def exact_eq_types() -> set[type]:
    """The exact types known to be exact under `==` (grown as they are met): a list
    of only these is recorded as `(list, LIST_SNAPSHOT, LIST_SNAPSHOT(list), False)`,
    which generated code writes inline. Read it; `record_container` adds to it."""
    return _exact_eq_types


def eq_is_exact(types: "Collection[type]") -> bool:
    """Whether `==` between items of these exact types and their replacements is
    exact enough to tell a change (see `_exact_eq_types`)."""
    if _exact_eq_types.issuperset(types):
        return True
    for kind in types:
        if kind in _exact_eq_types:
            continue
        if kind in _inexact_eq_types or kind in _NOT_CONTAINERS:
            return False
        if (
            getattr(kind, "__eq__", None) is object.__eq__
            and kind not in CONTAINER_TYPES
        ) or issubclass(kind, eqx.Module):
            _exact_eq_types.add(kind)
        else:
            _inexact_eq_types.add(kind)
            return False
    return True


def record_container(
    c: Any,
    items: "tuple[Any, ...] | None" = None,
    types: "Collection[type] | None" = None,
) -> ContainerRecord:
    """The record of a watched container `c` (of `items`, its snapshot, and of the
    set of their `types`, where known)."""
    snapshot = _SNAPSHOTS[type(c)]
    if items is None:
        items = snapshot(c)
    if types is None:
        types = set(map(type, items))
    return c, snapshot, items, not eq_is_exact(types)


def watched_containers(met: "Sequence[Any]") -> ContainerRecords | None:
    """The record of each list, dict and set in `met` (those a node's field values
    reach through built-in containers), which the node's flatten checks; None if
    there are none. A container is unchanged while it holds the very same objects,
    in the same order: an item replaced in place by one that `==` calls equal is a
    change, as it would be to a fresh flatten."""
    return tuple(map(record_container, met)) or None
