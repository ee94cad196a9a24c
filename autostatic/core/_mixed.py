"""Mixed containers: a field value holding arrays and other leaves (`[Linear, relu,
Linear]`, `{"w": w, "act": "gelu"}`).

Its pytree child is the value with `None` in place of each non-array leaf (as in the
dynamic half of `eqx.partition`), and its aux entry a `Holes` record that puts them
back (`punch` makes both). Flattened with `None` as a leaf, or item by item for a
list or tuple whose non-array leaves are its own items.
"""

import copy
from collections.abc import Callable
from typing import Any, Final

import jax.tree_util as jtu

from ._carriers import (
    carrier_positions,
    items_with_layers_at,
    surgeries,
    with_layers,
)
from ._fields import get_layer, has_partition
from ._static_values import HOLDER_TYPES, interned, natural_leaf, snapshot_leaf

_object_getattribute = object.__getattribute__
_object_new = object.__new__


def _is_none(x: Any) -> bool:
    return x is None


class _Unseen:
    """What a `Holes` record needs but need not compare, all fixed by the rest of
    the record and the node's children: the value's treedef outside carriers and
    AutoModules (`list` or `tuple` for a flat one), where its holes are among its
    leaves, and their key paths. One object per value (`_unseen`), so a comparison
    is an identity check.

    It also holds what makes the items of a flat value at once (`items`, see
    `items_value_code`), so it is one object per carried positions too."""

    __slots__ = ("treedef", "at", "paths", "items")

    def __init__(self, treedef: Any, at: tuple[int, ...], paths: tuple[Any, ...]):
        self.treedef, self.at, self.paths = treedef, at, paths
        self.items: ItemsMaker = _first_items

    def _key(self) -> tuple[Any, ...]:
        return (self.treedef, self.at)

    def __eq__(self, other: object) -> bool:
        return self is other or (type(other) is _Unseen and self._key() == other._key())

    def __hash__(self) -> int:
        return hash(self._key())

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Unseen, (self.treedef, self.at, self.paths))


# The items of a flat list or tuple as a tuple, made from its child and its `Holes`
# by code generated for where its holes and carriers are; None where the child is
# not such a value (a tree_map changed it) or is inside a tree surgery.
ItemsMaker = Callable[[Any, "Holes"], "tuple[Any, ...] | None"]


def _no_items(child: Any, holes: "Holes") -> None:
    return None


def _first_items(child: Any, holes: "Holes") -> "tuple[Any, ...] | None":
    """`_Unseen.items` until first called: the maker for the record's shape, kept."""
    unseen = holes[3]
    unseen.items = _items_maker(unseen.treedef, unseen.at, holes[2])
    return unseen.items(child, holes)


# Longer lists take the loop of `items_value_code`: one expression per item.
_MAX_MADE_ITEMS: Final = 256


def _items_maker(
    kind: Any, at: tuple[int, ...], carried: "tuple[int, ...] | bool"
) -> ItemsMaker:
    """The `ItemsMaker` of a `kind` (a flat list or tuple, else none is made) whose
    items are holes at `at` and carriers where `carried` says (`Holes`), and nothing
    else. Made once per `_Unseen`, which is one per such shape."""
    if (kind is not list and kind is not tuple) or carried is True:
        return _no_items
    carried = carried or ()
    n = len(at) + len(carried)
    if sorted((*at, *carried)) != list(range(n)) or n > _MAX_MADE_ITEMS:
        return _no_items  # an item is neither (an array, an AutoModule)
    hole = {i: 4 + j for j, i in enumerate(at)}
    items = "".join(
        f"h[{hole[i]}], " if i in hole else f"get_layer(c[{i}]), " for i in range(n)
    )
    source = (
        "def items(c, h):\n"
        f"    if type(c) is not kind or len(c) != {n} or surgeries[0]:\n"
        "        return None\n"
        "    try:\n"
        f"        return ({items})\n"
        "    except TypeError:  # a tree_map put another object there\n"
        "        return None\n"
    )
    namespace = {"kind": kind, "get_layer": get_layer, "surgeries": surgeries}
    name = f"<autostatic items of a {kind.__name__}, holes {at}, carriers {carried}>"
    exec(compile(source, name, "exec"), namespace)
    return namespace["items"]


class Holes(tuple):
    """The non-array leaves of a HOLED field: `(positions, leaf types, carried,
    unseen, *leaves)`. The child holds `None` in their places: `positions` are the
    holes among its items, for a list or tuple whose non-array leaves are items
    (`list` or `tuple` in `unseen`), else among its leaves when it is flattened with
    `None` as a leaf. `carried` says where the child holds carriers: the positions
    of those items (a flat list or tuple, none deeper), True for anywhere, or False.
    `unseen` holds the whole value's treedef, where the holes are among its leaves
    and their key paths: uncompared, as the child's treedef and `positions` fix
    them."""

    __slots__ = ()

    def value(self, child: Any) -> Any:
        """The attribute value of `child`: its holes filled again. A child whose
        structure a tree_map with `is_leaf` changed is kept as it is."""
        types, carried, unseen = self[1], self[2], self[3]
        treedef = unseen.treedef
        if HOLDER_TYPES.isdisjoint(types):  # the leaves are their own values
            leaves = self[4:]
        else:
            leaves = map(natural_leaf, self[4:])
        if treedef is type(child):  # a flat list or tuple: its items are the parts
            parts = items_with_layers_at(child, carried)
            for i, leaf in zip(unseen.at, leaves):
                parts[i] = leaf
            return parts if treedef is list else tuple(parts)
        if type(treedef) is type:  # a tree_map with `is_leaf` changed the child
            return self._slow_value(child)
        try:
            parts = treedef.flatten_up_to(child)
        except (ValueError, TypeError):
            return self._slow_value(child)
        for i, leaf in zip(unseen.at, leaves):
            parts[i] = leaf
        value = treedef.unflatten(parts)
        return with_layers(value) if carried else value

    def _slow_value(self, child: Any) -> Any:
        """For a child whose structure changed inside (`make_with_state` rewrote a
        `StateIndex` in a module of it): each hole filled by its key path; a hole
        whose path is gone stays `None`."""
        _, _, carried, unseen, *leaves = self
        value = child
        for path, leaf in zip(unseen.paths, leaves):
            value = _set_at(value, path, natural_leaf(leaf))
        return with_layers(value) if carried else value


def items_value_code(
    v: str, holes: str, child: str, made: list[str], rebuilt: list[str]
) -> list[str]:
    """Source lines that make `v` the attribute value of `child` under `holes`, a
    `Holes` (expressions), for generated fill code.

    A flat list or tuple of carriers and static leaves (a block's `[Linear, relu,
    Linear]`), whose leaf types are all plain items (`plain_items`: needing no
    natural value), is made by its shape's `ItemsMaker` as the tuple `items`, then `v` from
    it, then the lines `made` run. Otherwise `Holes.value` runs written inline for a
    flat list or tuple (its items copied, its carriers' layers and static leaves put
    in), or called for any other value or a child a tree_map changed, then the lines
    `rebuilt` (both indented as the function body). Names used: `plain_items`,
    `get_layer`, `surgeries`, `holder_free` (`HOLDER_TYPES.isdisjoint`)."""
    rebuild = [
        f"{v} = {child}",
        f"t = type({v})",
        "if (t is list or t is tuple) and h[3].treedef is t and h[2] is not True"
        " and not surgeries[0] and holder_free(h[1]):",
        f"    {v} = list({v})",
        "    try:",
        "        for k in h[2] or ():",
        f"            {v}[k] = get_layer({v}[k])",
        "    except TypeError:  # a tree_map put another object there",
        f"        {v} = h.value({child})",
        "    else:",
        "        k = 4",
        "        for i in h[0]:",
        f"            {v}[i] = h[k]",
        "            k += 1",
        "        if t is tuple:",
        f"            {v} = tuple({v})",
        "else:",
        f"    {v} = h.value({child})",
    ]
    return [
        f"    h = {holes}",
        f"    items = h[3].items({child}, h) if plain_items.issuperset(h[1]) else None",
        "    if items is None:",
        *("        " + line for line in rebuild),
        *("    " + line for line in rebuilt),
        "    else:",
        f"        {v} = list(items) if h[3].treedef is list else items",
        *("    " + line for line in made),
    ]


def _set_at(tree: Any, path: tuple[Any, ...], value: Any) -> Any:
    """`tree` with `value` at key path `path` (a copy of each node on the way); the
    tree as it is if the path leads nowhere."""
    if not path:
        return value
    key, rest = path[0], path[1:]
    try:
        if isinstance(key, jtu.SequenceKey):
            items = list(tree)
            items[key.idx] = _set_at(items[key.idx], rest, value)
            return items if type(tree) is list else type(tree)(items)
        if isinstance(key, jtu.DictKey):
            new = copy.copy(tree)
            new[key.key] = _set_at(tree[key.key], rest, value)
            return new
        if isinstance(key, jtu.GetAttrKey):
            item = _set_at(getattr(tree, key.name), rest, value)
            if isinstance(tree, tuple):  # a namedtuple
                return tree._replace(**{key.name: item})  # pyright: ignore[reportAttributeAccessIssue]  # a namedtuple
            new = _object_new(type(tree))
            attrs = _object_getattribute(new, "__dict__")
            attrs.update(_object_getattribute(tree, "__dict__"))
            attrs[key.name] = item
            return new
        children, node = jtu.tree_flatten(tree, is_leaf=lambda x: x is not tree)
        children[key.key] = _set_at(children[key.key], rest, value)
        return node.unflatten(children)
    except (AttributeError, IndexError, KeyError, TypeError, ValueError):
        return tree


# One `_Unseen` per whole-value treedef, hole positions and carried positions, so
# that the records of blocks built alike hold the same object, compared by identity
# in C.
_unseens: "dict[tuple[Any, tuple[int, ...], Any], _Unseen]" = {}


def _unseen(
    treedef: Any, at: tuple[int, ...], paths: tuple[Any, ...], carried: Any
) -> _Unseen:
    key = (treedef, at, carried)
    try:
        return _unseens[key]
    except KeyError:
        if len(_unseens) >= 4096:  # bounded: the structures of a few models
            _unseens.clear()
        return _unseens.setdefault(key, _Unseen(treedef, at, paths))


_MARK: Final = object()  # stands in a hole while its position is found


def punch(
    value: Any, treedef: Any, leaves: list[Any], flags: list[bool], has_carriers: bool
) -> tuple[Any, Holes]:
    """The child of `value`, whose leaves are `leaves` (`flags`: which are arrays):
    the value with `None` in place of each other leaf, and the `Holes` that put them
    back."""
    kind = type(value)
    if kind is list or kind is tuple:
        punched = _punch_items(value, leaves, flags, has_carriers)
        if punched is not None:
            return punched
    marked = treedef.unflatten([x if f else _MARK for x, f in zip(leaves, flags)])
    parts = jtu.tree_flatten(marked, is_leaf=_is_none)[0]
    positions = tuple(i for i, x in enumerate(parts) if x is _MARK)
    # Filled back in through the containers only: carriers and AutoModules, which
    # hold no hole, stay the very objects of the child.
    keyed, outer = jtu.tree_flatten_with_path(marked, is_leaf=has_partition)
    at = tuple(i for i, (_, x) in enumerate(keyed) if x is _MARK)
    paths = tuple(path for path, x in keyed if x is _MARK)
    child = treedef.unflatten([x if f else None for x, f in zip(leaves, flags)])
    static = [snapshot_leaf(x) for x, f in zip(leaves, flags) if not f]
    return child, _holes(
        interned(positions), static, has_carriers, _unseen(outer, at, paths, False)
    )


def _punch_items(
    value: list[Any] | tuple[Any, ...],
    leaves: list[Any],
    flags: list[bool],
    has_carriers: bool,
) -> tuple[Any, Holes] | None:
    """`punch` for a list or tuple whose non-array leaves are items of its own (a
    block's `[Linear, relu, Linear]`), its holes given as item positions; None if a
    non-array leaf is deeper. The items that hold arrays stay the very objects."""
    child = list(value)
    at, static = [], []
    i = 0
    for leaf, flag in zip(leaves, flags):
        if flag:
            continue
        # Leaves come in item order: this one is the next item that is it, unless
        # it sits deeper, inside an item (then no later item is it, or the item
        # that is it will find none left for its own leaf).
        while i < len(child) and child[i] is not leaf:
            i += 1
        if i == len(child):
            return None
        at.append(i)
        static.append(leaf)
        i += 1
    carried = carried_at(carrier_positions(child)) if has_carriers else False
    return punch_items(type(value), child, at, static, carried)


def punch_items(
    kind: type,
    items: list[Any],
    at: list[int],
    static: list[Any],
    carried: tuple[int, ...] | bool,
) -> tuple[Any, Holes]:
    """The child and `Holes` of a list or tuple (`kind`) of these `items`, whose
    non-array leaves are the items `static` at positions `at`, and whose carriers
    are where `carried` says (`Holes`): the child holds `None` at `at` (`items` is
    changed in place)."""
    for i in at:
        items[i] = None
    positions = interned(tuple(at))
    unseen = _unseens.get((kind, positions, carried))
    if unseen is None:
        paths = tuple((jtu.SequenceKey(i),) for i in positions)
        unseen = _unseen(kind, positions, paths, carried)
    holes = _holes(positions, [snapshot_leaf(x) for x in static], carried, unseen)
    return (items if kind is list else tuple(items)), holes


def carried_at(positions: "list[int] | bool") -> tuple[int, ...] | bool:
    """The `carried` of `Holes` for carriers at these item positions (none deeper),
    or True (anywhere): False for none, so that every way of splitting a value
    records it alike."""
    if positions is True:
        return True
    return interned(tuple(positions)) if positions else False


def _holes(
    positions: tuple[int, ...],
    static: list[Any],
    carried: tuple[int, ...] | bool,
    unseen: _Unseen,
) -> Holes:
    types = interned(tuple(map(type, static)))
    return interned(Holes((positions, types, carried, unseen, *static)))
