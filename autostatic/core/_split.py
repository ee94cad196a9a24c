"""Splitting one field's value into its pytree child and its static entry, and back.

A value gives its node one part (`_ways`):

- CHILD: every leaf is dynamic (arrays, nodes, `None`): the child is the value, with
  each `eqx.nn` layer as its carrier;
- ENTRY: no leaf is: the aux holds the value (`StaticSeq`, `StaticTree`, or the
  leaf held as `_static.hold` holds it);
- BOTH: both: the child is the value with `None` in place of each static leaf (the
  dynamic half, as `eqx.partition` makes it) and the aux holds the static leaves and
  where they go (`FlatHoles` for a list or tuple of items, `Holes` for any other
  value).

Nodes (AutoModules, `eqx.nn` layers) are items, never looked into: each decides its
own leaves, so an in-place change inside one is its own flatten's to see. Every
record is a flat tuple, compared in C; none holds a field's name or path, so equal
values give equal treedefs wherever they sit.
"""

import functools
import itertools
from collections.abc import Callable, Iterable
from typing import Any, Final

import jax.tree_util as jtu
import numpy as np
from jax import ShapeDtypeStruct

from .._compat import flatten_none_leaves
from ._carriers import carriers_of, layer_of
from ._leaves import (
    AS_IS,
    as_is_types,
    BUILTIN_CONTAINERS,
    CARRIER,
    category,
    CONTAINER,
    is_dynamic,
    is_fieldless_namedtuple,
    item_categories,
    LAYER,
    leaf_types,
    NDARRAY,
    node_child_types,
    node_types,
    NODES,
    plain_types,
    types_generation,
)
from ._static import (
    held_as_themselves,
    hold,
    HOLDER_TYPES,
    named_types,
    natural,
    types_named,
)
from ._ways import BOTH, CARRY, CHILD, ENTRY, item_way, TAKE

# What the child holds for a node item: its carrier for a layer, the module itself.
NodeChild = Callable[[Any], Any]
Split = tuple[int, Any, Any]  # (part, child or None, entry or None)


class _Record(tuple):
    """A static part of a field's value in the aux: held leaves and their types, at
    `TYPES_AT`, with what places them."""

    __slots__ = ()
    TYPES_AT: int

    def __reduce__(self) -> tuple[Any, ...]:
        # A copied or pickled template's aux: the types of the `types` module (a
        # function's) by name, which pickle cannot write by reference.
        at = self.TYPES_AT
        items = (*self[:at], named_types(self[at]), *self[at + 1 :])
        return (_record_again, (type(self), items))

    def held(self) -> Iterable[tuple[int, Any]]:
        """Each held leaf's position (its index among the value's leaves or items)
        and value."""
        at = self.TYPES_AT
        leaves = _naturals(self[at], self[at + 1 :])
        return zip(self[1] if at == 2 else itertools.count(), leaves)

    def places(self) -> Callable[[int], str]:
        """The key path's text, below the field, of the held leaf at a position."""
        if type(self[0]) is type:  # a list or tuple: by index
            return "[{}]".format
        treedef = self[0]
        try:
            tree = treedef.unflatten(range(treedef.num_leaves))
        except Exception:  # a node's own unflatten refused numbers
            return "<leaf {}>".format
        found = jtu.tree_flatten_with_path(tree)[0]
        return [jtu.keystr(path) for path, _ in found].__getitem__

    def __repr__(self) -> str:
        # Printed in JAX's errors with the aux: where a structure must not change (a
        # `lax.scan` carry), a static number is what changed.
        place, held = self.places(), list(self.held())
        text = ", ".join(f"{place(i)}={leaf!r}" for i, leaf in held)
        numbers = any(type(leaf) in COUNTED_NUMBERS for _, leaf in held)
        return f"{type(self).__name__}({text}{_NUMBERS_HELD if numbers else ''})"


# The static values whose every new value compiles anew where a structure may change
# (`_retrace` counts them) and must not (a `lax.scan` carry: the records' repr).
COUNTED_NUMBERS: Final = frozenset({int, float, complex})
_NUMBERS_HELD: Final = (
    "; a Python number, static, so each value is another pytree: to make it a leaf, "
    "store an array there or annotate the field `PyTree`"
)


def _record_again(cls: type[_Record], items: tuple[Any, ...]) -> _Record:
    at = cls.TYPES_AT
    return cls((*items[:at], types_named(items[at]), *items[at + 1 :]))


class StaticSeq(_Record):
    """A static list or tuple of leaves (sizes, names, activations): `(list or tuple,
    held leaf types, *held leaves)`; the types tell `[1]` from `[1.0]` and `[True]`,
    which `==` calls equal."""

    __slots__ = ()
    TYPES_AT = 1

    def value(self) -> Any:
        return self[0](_naturals(self[1], self[2:]))


class StaticTree(_Record):
    """A static value with structure (a dict of names, a user's `eqx.Module` without
    arrays): `(treedef, leaf types, *held leaves)`. Made anew at each read, so that
    changing one attribute cannot change another's."""

    __slots__ = ()
    TYPES_AT = 1

    def value(self) -> Any:
        return self[0].unflatten(_naturals(self[1], self[2:]))


# How many fills met a child not shaped as their holes (a tree mapped to `None`s from
# one holding a label where a container item was): an unflatten whose fills changed
# it looks again (`_templates.settle`), without checking each child twice. Only
# ever increased (atomically, under the GIL): another thread's fill can only make it
# look once more.
misfits: list[int] = [0]


class FlatHoles(_Record):
    """The static items of a list or tuple split in both parts (a block's `[Linear, relu, Linear]`):
    `(list or tuple, positions, item types, *held items)`; the child holds `None` at
    `positions`."""

    __slots__ = ()
    TYPES_AT = 2

    def fits(self, child: Any) -> bool:
        """Whether `child` has the places of the held items."""
        return type(child) is self[0] and len(child) > self[1][-1]

    def fill(self, child: Any) -> Any:
        cls, positions = self[0], self[1]
        if not self.fits(child):
            misfits[0] += 1
            return child  # an `is_leaf` tree_map changed it: no place for the items
        items = list(child)
        for i, leaf in zip(positions, _naturals(self[2], self[3:])):
            items[i] = leaf
        return items if cls is list else tuple(items)


class Holes(_Record):
    """The static leaves of any other value split in both parts: `(treedef, positions, leaf types,
    *held leaves)`, the treedef that of the value with nodes as leaves, the child
    the value with `None` at `positions` among its leaves."""

    __slots__ = ()
    TYPES_AT = 2

    def fits(self, child: Any) -> bool:
        """Whether `child` is shaped as the value, down to its leaves' places."""
        try:
            self[0].flatten_up_to(child)
        except (ValueError, TypeError):
            return False
        return True

    def fill(self, child: Any) -> Any:
        treedef, positions = self[0], self[1]
        try:
            parts = treedef.flatten_up_to(child)
        except (ValueError, TypeError):
            # An `is_leaf` tree_map gave a node other static data (as
            # `eqx.nn.make_with_state` names each `StateIndex` anew) or put a leaf
            # for one: the static leaves go where the child still has their places.
            misfits[0] += 1
            held = {i: natural(x) for i, x in zip(positions, self[3:])}
            return _fill_places(treedef, child, held, 0)
        for i, leaf in zip(positions, _naturals(self[2], self[3:])):
            parts[i] = leaf
        return treedef.unflatten(parts)


def _fill_places(treedef: Any, value: Any, held: dict[int, Any], start: int) -> Any:
    """`value` with the static leaves `held` (by leaf index, from `start`, in
    `treedef`) put back where `value` is shaped as `treedef` down to them; each part
    holding none of them, and each place whose shape changed, as it is."""
    end = start + treedef.num_leaves
    if not any(start <= i < end for i in held):
        return value
    node = treedef.node_data()
    if node is None:  # a leaf's place
        return held[start]
    parts, shape = jtu.tree_flatten(value, is_leaf=lambda x: x is not value)
    here, subtrees = shape.node_data(), treedef.children()
    if (
        here is None
        or here[0] is not node[0]
        or (node[0] in BUILTIN_CONTAINERS and here[1] != node[1])
        or len(parts) != len(subtrees)
    ):
        return value
    filled = []
    for part, subtree in zip(parts, subtrees):
        filled.append(_fill_places(subtree, part, held, start))
        start += subtree.num_leaves
    return shape.unflatten(filled)


RECORDS: Final = frozenset({StaticSeq, StaticTree, FlatHoles, Holes})


def _naturals(types: tuple[type, ...], held: tuple[Any, ...]) -> Iterable[Any]:
    """The values the `held` static leaves of a record, of `types`, stand for: the
    leaves themselves unless one is held in another form (`natural`)."""
    return held if HOLDER_TYPES.isdisjoint(types) else map(natural, held)


def value_of(part: int, child: Any, entry: Any) -> Any:
    """The attribute value of a field of `part` split into `child` and `entry`."""
    if part == CHILD:
        return child
    if part == BOTH:
        return entry.fill(child)
    return static_value(entry)


def static_value(entry: Any) -> Any:
    """The attribute value of an ENTRY field's entry: a record's value, a held
    leaf's (`natural`), or the entry itself."""
    value = _VALUE_OF_ENTRY.get(type(entry))
    return entry if value is None else value(entry)


# How to read the value of each type of entry that is not its own value: one dict
# lookup and one call, where unflatten needs one per static field.
_VALUE_OF_ENTRY: Final[dict[type, Callable[[Any], Any]]] = {
    StaticSeq: StaticSeq.value,
    StaticTree: StaticTree.value,
    **dict.fromkeys(HOLDER_TYPES, natural),
}


def split(value: Any, array_field: bool, node_child: NodeChild) -> Split:
    """The part of a field's numpy array or container `value` (the field values
    whose part follows from their value, `_ways.SPLIT`) and its child and entry (see
    the module docstring)."""
    return _unless_types_forgotten(_split_value, value, array_field, node_child)


def _unless_types_forgotten(take: Callable[..., Any], *args: Any) -> Any:
    """`take(*args)`, taken again while another thread cleared the sets of types met
    meanwhile (`_leaves.types_generation`): a type found in `plain_types` and then
    missed in `as_is_types` would have made an array static."""
    while True:
        before = types_generation[0]
        found = take(*args)
        if before == types_generation[0] and not before % 2:
            return found


def _split_value(value: Any, array_field: bool, node_child: NodeChild) -> Split:
    if category(value) == NDARRAY:  # of a dtype JAX holds: others are refused
        return CHILD, value, None
    cls = type(value)
    if cls is list or cls is tuple:
        return _split_items(value, array_field, node_child)
    return _split_tree(value, array_field, node_child)


# Item types that are their own static values, whatever the value (`_static.hold`).
RAW: Final = frozenset({int, bool, str, bytes})


def _split_items(value: Any, array_field: bool, node_child: NodeChild) -> Split:
    """`split` for a list or tuple; one whose items hold containers takes the
    general path."""
    snapshot = tuple(value)  # one C call: another thread's change is wholly seen or not
    types = tuple(map(type, snapshot))
    if types and not array_field and RAW.issuperset(types):  # sizes, names
        return ENTRY, None, StaticSeq((type(value), types, *snapshot))
    kinds = set(types)
    cats = item_categories(snapshot, kinds)
    if AS_IS.issuperset(cats):
        return CHILD, value, None
    if cats == {LAYER}:  # a stack of `eqx.nn` layers
        if node_child is layer_of:  # in a surgery: the layers themselves
            return CHILD, type(value)(map(node_child, snapshot)), None
        layers = list(snapshot) if type(value) is list else snapshot
        return CHILD, carriers_of(layers, kinds, node_child), None
    if kinds == _ROWS:  # tuples only: records
        found = _split_rows(value, snapshot, array_field)
        if found is not None:
            return found
    if CONTAINER in cats and not all(map(_flat_item, snapshot)):
        return _split_tree(value, array_field, node_child)
    items = list(snapshot)
    positions, carried = [], False
    for i, item in enumerate(items):
        way = item_way(item, array_field)
        if way == CARRY:
            items[i], carried = node_child(item), True
        elif way != TAKE:
            positions.append(i)
    cls = type(value)
    if not positions:  # the value itself, a node of the tree, unless carriers
        child = value if not carried else items if cls is list else tuple(items)
        return CHILD, child, None
    if len(positions) == len(items):  # no child: static whole
        held = [hold(x) for x in snapshot]
        return ENTRY, None, StaticSeq((cls, tuple(map(type, held)), *held))
    held = [hold(snapshot[i]) for i in positions]
    for i in positions:
        items[i] = None
    child = items if cls is list else tuple(items)
    types = tuple(map(type, held))
    return BOTH, child, FlatHoles((cls, tuple(positions), types, *held))


def _flat_item(x: Any) -> bool:
    """An item a list's split takes as it is or static, not looked into: any but a
    container, or a node without leaves (optax's `MaskedNode()`, which
    `optax.masked` puts where an item was: the list still splits by items)."""
    return category(x) != CONTAINER or is_fieldless_namedtuple(x)


_ROWS: Final = frozenset({tuple})


def records(value: Any, array_field: bool) -> tuple[Any, Any] | None:
    """The child and entry of a list or tuple `value` of records that `split` gives
    both parts by column (`_split_rows`); None for any other value."""
    rows = tuple(value)
    if not rows or set(map(type, rows)) != _ROWS:
        return None
    found = _unless_types_forgotten(_split_rows, value, rows, array_field)
    if found is None or found[0] != BOTH:
        return None
    return found[1], found[2]


def _split_rows(
    value: Any, rows: tuple[tuple[Any, ...], ...], array_field: bool
) -> Split | None:
    """`_split_plain` for a list or tuple `value` whose items, `rows`, are tuples of
    one length whose items are leaves, each column of one kind (dynamic or static: a
    list of `(array, jax.nn.relu, size)` records), taken column by column in C calls:
    the same part, child and entry. None for any other value."""
    try:
        columns = list(zip(*rows, strict=True))
    except ValueError:  # rows of different lengths
        return None
    dynamic = dynamic_types(array_field)
    static_at, static_types = [], set()
    for j, column in enumerate(columns):
        types = set(map(type, column))
        if (
            not plain_types.issuperset(types)
            or np.ndarray in types
            or not node_child_types.isdisjoint(types)
        ):
            return None  # containers or layers inside, types not met yet, or dtypes
        if types.isdisjoint(dynamic):
            static_at.append(j)
            static_types |= types
        elif not dynamic.issuperset(types):
            return None  # a column of both kinds: leaf by leaf
    if not static_at:
        return CHILD, value, None
    width = len(columns)
    treedef, positions = _rows_layout(type(value), len(rows), width, tuple(static_at))
    held = _interleaved([columns[j] for j in static_at])
    if not held_as_themselves(static_types):
        held = list(map(hold, held))
    held_types = tuple(map(type, held))
    if len(static_at) == width:
        return ENTRY, None, StaticTree((treedef, held_types, *held))
    nones = itertools.repeat(None)
    kept = [nones if j in static_at else column for j, column in enumerate(columns)]
    child = list(zip(*kept))
    if type(value) is not list:
        child = tuple(child)
    return BOTH, child, Holes((treedef, positions, held_types, *held))


_chain: Final = itertools.chain.from_iterable


def _interleaved(columns: list[tuple[Any, ...]]) -> list[Any]:
    """The items of `columns` (of one length) row by row, put in place by slices."""
    width = len(columns)
    items: list[Any] = [None] * (width * len(columns[0]))
    for j, column in enumerate(columns):
        items[j::width] = column
    return items


@functools.lru_cache(maxsize=64)
def _rows_layout(
    cls: type, length: int, width: int, static_at: tuple[int, ...]
) -> tuple[Any, tuple[int, ...]]:
    """The treedef (`None`s as leaves) of a list or tuple of `length` tuples of
    `width` leaves, and the leaf positions of the columns `static_at`."""
    _, treedef = flatten_none_leaves(cls([(0,) * width] * length), False)
    starts = [range(j, length * width, width) for j in static_at]
    return treedef, tuple(_chain(zip(*starts)))


def whole(value: Any) -> Any:
    """The entry of a value declared `eqx.field(static=True)`: static whole, as
    Equinox keeps it (a copy of its containers)."""
    if category(value) != CONTAINER:
        return hold(value)
    cls = type(value)
    if (cls is list or cls is tuple) and CONTAINER not in item_categories(value):
        held = [hold(x) for x in value]
        return StaticSeq((cls, tuple(map(type, held)), *held))
    leaves, treedef = jtu.tree_flatten(value)
    held = [hold(x) for x in leaves]
    return StaticTree((treedef, tuple(map(type, held)), *held))


def _split_tree(value: Any, array_field: bool, node_child: NodeChild) -> Split:
    """`split` for any value JAX flattens as a node, through every level: by the
    types its lists, tuples and dicts hold (`leaf_types`), a value of arrays,
    modules and `None`s is its own child at once, and one of plain leaves is split
    from a flatten made in C (`_split_plain`); any other (a user's `eqx.Module`, a
    namedtuple, an `OrderedDict` inside) is walked in Python (`_split_walked`)."""
    types = leaf_types(value)
    if (as_is_types | NUMBER_TYPES if array_field else as_is_types).issuperset(types):
        return CHILD, value, None
    if plain_types.issuperset(types):
        return _split_plain(value, types, array_field, node_child)
    return _split_walked(value, array_field, node_child)


# The types of Python numbers and `ShapeDtypeStruct`s: children in an array field.
NUMBER_TYPES: Final = frozenset({bool, int, float, complex, ShapeDtypeStruct})


def _split_plain(
    value: Any, types: set[type], array_field: bool, node_child: NodeChild
) -> Split:
    """`_split_tree` for a value whose lists, tuples and dicts hold only leaves of
    `types` (no other node): its leaves (`None`s included, modules and layers not
    looked into) and treedef taken in one C call, so a change made by another thread
    meanwhile is wholly seen or not at all, and each leaf told dynamic or static by
    its type, in C calls."""
    leaves, treedef = flatten_none_leaves(value, not node_types.isdisjoint(types))
    leaf_types_ = list(map(type, leaves))
    # The types of this flatten's own leaves: another thread may have changed the
    # value since `types` were found.
    types = set(leaf_types_)
    if not plain_types.issuperset(types):
        return _split_walked(value, array_field, node_child)
    if np.ndarray in types:  # dynamic or not by its dtype: looked at one by one
        dynamic = [is_dynamic(x, array_field) or _kept_whole(x) for x in leaves]
        return _from_leaves(value, leaves, treedef, dynamic, node_child)
    static_types = types - dynamic_types(array_field)
    if not static_types:
        return _all_children(value, leaves, treedef, types, node_child)
    static = list(map(static_types.__contains__, leaf_types_))
    held = list(itertools.compress(leaves, static))
    if not held_as_themselves(static_types):
        held = list(map(hold, held))
        held_types = tuple(map(type, held))
    else:
        held_types = tuple(itertools.compress(leaf_types_, static))
    positions = tuple(itertools.compress(itertools.count(), static))
    return _with_holes(leaves, treedef, positions, held_types, held, types, node_child)


def dynamic_types(array_field: bool) -> set[type]:
    """The types of the leaves of a container that are children, modules and layers
    included (numpy arrays are, by their dtype)."""
    types = node_child_types | as_is_types
    return types | NUMBER_TYPES if array_field else types


def _split_walked(value: Any, array_field: bool, node_child: NodeChild) -> Split:
    """`_split_tree` through nodes of any kind, with a flatten that asks Python
    where to stop."""
    leaves, treedef = jtu.tree_flatten(value, is_leaf=_kept_whole)
    dynamic = [is_dynamic(x, array_field) or _kept_whole(x) for x in leaves]
    return _from_leaves(value, leaves, treedef, dynamic, node_child)


def _from_leaves(
    value: Any,
    leaves: list[Any],
    treedef: Any,
    dynamic: list[bool],
    node_child: NodeChild,
) -> Split:
    """The split of `value`, whose leaves (each dynamic as `dynamic` says) and
    treedef are given."""
    types = set(map(type, leaves))
    if all(dynamic):
        return _all_children(value, leaves, treedef, types, node_child)
    positions = tuple(i for i, d in enumerate(dynamic) if not d)
    held = [hold(leaves[i]) for i in positions]
    held_types = tuple(map(type, held))
    return _with_holes(leaves, treedef, positions, held_types, held, types, node_child)


def _all_children(
    value: Any, leaves: list[Any], treedef: Any, types: set[type], node_child: NodeChild
) -> Split:
    """The split of `value`, every one of whose leaves (of `types`) is dynamic: the
    value itself, or where it holds layers, the value with their carriers."""
    if node_child_types.isdisjoint(types):
        return CHILD, value, None
    return CHILD, treedef.unflatten(_node_children(leaves, node_child)), None


def _with_holes(
    leaves: list[Any],
    treedef: Any,
    positions: tuple[int, ...],
    held_types: tuple[type, ...],
    held: list[Any],
    types: set[type],
    node_child: NodeChild,
) -> Split:
    """The split of a value with static leaves at `positions`, held as `held`."""
    if len(positions) == len(leaves):
        return ENTRY, None, StaticTree((treedef, held_types, *held))
    if node_child_types.isdisjoint(types):
        parts = list(leaves)
    else:
        parts = _node_children(leaves, node_child)
    for i in positions:
        parts[i] = None
    child = treedef.unflatten(parts)
    return BOTH, child, Holes((treedef, positions, held_types, *held))


def _kept_whole(x: Any) -> bool:
    """`is_leaf` for a mixed value, and what of it is a child as it is: our nodes,
    and each `None` or namedtuple without fields (optax's `MaskedNode()`) is a child
    of its own, as in an `eqx.Module`, so that the value with its arrays mapped to
    `None`s (`eqx.partition`'s static half) or to `MaskedNode()`s (`optax.masked`)
    splits as the value did. (A node without leaves that holds static data, as
    Equinox's `Static`, stays static.)"""
    if x is None:
        return True
    cat = category(x)
    if cat != CONTAINER:
        return cat in NODES
    return is_fieldless_namedtuple(x)


def _node_children(leaves: list[Any], node_child: NodeChild) -> list[Any]:
    """`leaves` with each layer as `node_child` gives it."""
    return [node_child(x) if category(x) in _CARRIED else x for x in leaves]


_CARRIED: Final = frozenset({LAYER, CARRIER})
