"""The node format: how a decided partition is stored, flattened and read back.

An AutoModule instance (and a carrier of an Equinox layer, `_carriers`) keeps its
attribute values in `__dict__`, exactly as assigned, and its decided pytree form in
the slot of `Partitioned`: `(children, aux, values, containers)`. Flatten returns
`(children, aux)` after checking that the attributes are still `values`, by
identity, and that no list, dict or set they reach changed in place (`containers`,
from `_containers.watched_containers`); unflatten creates the instance and fills the
slot only (`values` None: nothing to check), and the attributes are made from it on
first access (`materialise`, which fills in the modules below it as well). A carrier
(`_carriers`) checks nothing: its `values` are None.

Each field is of one kind:

- CHILD: the attribute value is the pytree child itself (arrays, modules, lists of
  them);
- CARRIED: the child is the value with each `eqx.nn` layer replaced by its fast carrier;
  the attribute holds the layers themselves;
- HOLED: the value holds arrays and other leaves; the child is the value with `None`
  in place of each non-array leaf (as in the dynamic half of `eqx.partition`), and
  the aux holds a `Holes` record that puts them back (`_mixed`);
- STATIC: no leaf is an array; the aux holds the value (a `StaticTree` if it has
  structure).

No record holds a field's name or path: equal values give equal treedefs wherever
they sit.
"""

import dataclasses
import operator
import weakref
from collections.abc import Callable, Iterable
from typing import Any, Final, NamedTuple

import equinox as eqx
import jax.tree_util as jtu

from .._compat import FlattenFunctions
from ._carriers import carrier_classes, surgeries, with_layers
from ._containers import (
    ContainerRecords,
    exact_eq_types,
    known_leaf_types,
    LIST_SNAPSHOT,
    record_container,
    walk,
    watched_containers,
)
from ._fields import (
    carrier_stores,
    fields_of,
    get_flat,
    get_layer,
    needs_eager,
    set_flat,
)
from ._mixed import Holes, items_value_code
from ._static_values import (
    HOLDER_TYPES,
    interned,
    natural_leaf,
    natural_leaves,
    SetValue,
    snapshot_leaf,
)

CHILD: Final = 0
STATIC: Final = 1
CARRIED: Final = 2
HOLED: Final = 3
CHILD_KINDS: Final = (CHILD, CARRIED, HOLED)

_object_getattribute = object.__getattribute__
_object_new = object.__new__


class Layout:
    """Which field is which kind, shared by every instance of a class with that split
    (and, once typed, those types of static values)."""

    __slots__ = (
        "cls",
        "kinds",
        "child_names",
        "child_kinds",
        "child_keys",
        "entry_names",
        "entry_kinds",
        "entry_child",
        "static_types",
        "untyped",
        "typed",
        "fill",
        "materialise",
        "last_aux",
        "noted",
        "last_noted",
    )

    def __init__(
        self,
        cls: type,
        kinds: tuple[int, ...],
        static_types: tuple[type, ...] | None = None,
    ):
        names = fields_of(cls).names
        self.cls = cls
        self.kinds = kinds
        self.child_names = tuple(n for n, k in zip(names, kinds) if k in CHILD_KINDS)
        self.child_kinds = tuple(k for k in kinds if k in CHILD_KINDS)
        self.child_keys = tuple(jtu.GetAttrKey(n) for n in self.child_names)
        # The aux holds one entry per STATIC or HOLED field, in field order; a HOLED
        # entry's child is at `entry_child[j]` among the children.
        self.entry_names = tuple(
            n for n, k in zip(names, kinds) if k in (STATIC, HOLED)
        )
        self.entry_kinds = tuple(k for k in kinds if k in (STATIC, HOLED))
        self.entry_child = tuple(
            self.child_names.index(n) if k == HOLED else -1
            for n, k in zip(self.entry_names, self.entry_kinds)
        )
        # None for the layout of a split; the types of the aux entries for each
        # layout an instance's aux holds, one per distinct types tuple (`typed`).
        self.static_types = static_types
        self.untyped: Layout = self
        self.typed: dict[tuple[type, ...], Layout] = {}
        # Generated on first use: the unflatten of a carrier of this layout, and the
        # filling in of an AutoModule's attributes.
        self.fill: Callable[[type, Aux, tuple[Any, ...]], Any] | None = None
        self.materialise: Callable[..., None] | None = None
        # For an unflatten that notes new static values (`_noting_new_aux`): the
        # aux of the node of this layout last unflattened, what picks the noted
        # entries out of an aux (`_nothing_noted` if none is), and those it held.
        self.last_aux: Aux | None = None
        self.noted: Callable[[Aux], Any] | None = None
        self.last_noted: Any = None

    def with_types(self, static_types: tuple[type, ...]) -> "Layout":
        """This split with these entry types, one object per types tuple."""
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
        return (
            f"Layout({self.cls.__qualname__}, children={self.child_names}, "
            f"entries={self.entry_names})"
        )


class PlainSplit(NamedTuple):
    layout: "Layout"  # typed
    # Static float or complex fields, as (field, entry) positions: a zero or NaN
    # there is held as `ExactFloat`.
    inexact: tuple[tuple[int, int], ...]
    # Whether a child may hold a layer that becomes a carrier, which a provisional
    # partition (made while `__init__` runs) does not do.
    carriers: bool
    # The `Flat` of the field values, in one call.
    flat: "Callable[[tuple[Any, ...]], Flat]"


def plain_split(
    layout: "Layout",
    to_carrier: Callable[[Any], Any],
    *,
    entry_of: "dict[int, Callable[[Any], Any]] | None" = None,
    child_of: "dict[int, Callable[[Any], Any]] | None" = None,
    holed_of: "dict[int, Callable[[Any], tuple[Any, Any]]] | None" = None,
    watched: tuple[int, ...] = (),
) -> PlainSplit:
    """The split of the instances whose field types make `layout` (typed), with a
    generated function that picks the children (the carrier of each layer of a
    CARRIED field) and aux entries out of the field values: most `eqx.nn` layers,
    and modules holding them, are decided by it.

    Fields whose value needs more than picking are made by the function given for
    their position, which raises if a value is not what it takes it for: a STATIC
    entry by `entry_of` (a shape, sizes, a checked function), a CARRIED child by
    `child_of` (an `MLP`'s tuple of layers), a HOLED field's child and entry by
    `holed_of` (a block's `[Linear, relu, Linear]`). The lists at `watched` are
    recorded for the flatten's check of changes in place."""
    entry_of, child_of, holed_of = entry_of or {}, child_of or {}, holed_of or {}
    kinds = layout.kinds
    lines = [f"    c{i}, e{i} = holed{i}(values[{i}])" for i in holed_of]
    children, entries = [], []
    for i, kind in enumerate(kinds):
        if i in holed_of:
            children.append(f"c{i}, ")
            entries.append(f"e{i}, ")
        elif kind == STATIC:
            entries.append(
                f"entry{i}(values[{i}]), " if i in entry_of else f"values[{i}], "
            )
        elif i in child_of:
            children.append(f"child{i}(values[{i}]), ")
        else:
            children.append(
                f"carrier(values[{i}]), " if kind == CARRIED else f"values[{i}], "
            )
    entry_fields = [i for i, kind in enumerate(kinds) if kind in (STATIC, HOLED)]
    # A carrier's flatten checks nothing (see `_carriers`): no values to check.
    carrier = fields_of(layout.cls).carrier
    values = "None" if carrier else "values"
    containers = "None"
    if watched and not carrier:
        for i in watched:
            lines.append(f"    items{i} = list_snapshot(values[{i}])")
            lines.append(f"    types{i} = set(map(type, items{i}))")
        records = (
            _record_code(f"values[{i}]", f"items{i}", f"types{i}") for i in watched
        )
        containers = "(" + "".join(f"{r}, " for r in records) + ")"
    inexact = tuple(
        (i, j)
        for j, (i, kind) in enumerate(zip(entry_fields, layout.static_types or ()))
        if kind is float or kind is complex
    )
    # The layers of a model mostly share their sizes and flags: the aux of the last
    # instance is reused when its entries are equal, one object fewer per layer
    # (one cell, read once: a thread sees a matching pair or none). `==` is exact but
    # for a float or complex zero or NaN, which is never matched (and is then held
    # exactly, `PlainSplit.inexact`).
    exact = "".join(
        f" and values[{i}] == values[{i}] and values[{i}] != 0" for i, _ in inexact
    )
    lines += [
        f"    entries = ({''.join(entries)})",
        "    last = last_aux[0]",
        f"    if last[0] == entries{exact}:",
        "        aux = last[1]",
        "    else:",
        "        aux = new(Aux, (layout, *entries))",
        "        last_aux[0] = (entries, aux)",
        f"    return ({''.join(children)}), aux, {values}, {containers}",
    ]
    namespace = {
        "new": tuple.__new__,
        "Aux": Aux,
        "layout": layout,
        "carrier": to_carrier,
        "list_snapshot": LIST_SNAPSHOT,
        "record": record_container,
        "exact_types": exact_eq_types(),
        "last_aux": [((_NO_ENTRIES,), None)],
        **{f"entry{i}": f for i, f in entry_of.items()},
        **{f"child{i}": f for i, f in child_of.items()},
        **{f"holed{i}": f for i, f in holed_of.items()},
    }
    source = "\n".join(["def flat(values):", *lines])
    exec(compile(source, f"<autostatic split of {layout!r}>", "exec"), namespace)
    carriers = CARRIED in kinds or bool(holed_of)
    return PlainSplit(layout, inexact, carriers, namespace["flat"])


_NO_ENTRIES: Final = object()  # equal to no entry: the reused aux before the first


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
    """The aux data of a node: `(layout, *entries)`.

    A flat tuple, so that JAX's treedef comparison (what every jit cache lookup does,
    as a treedef hash ignores aux data) runs in C: the layout by identity, which
    also compares the entries' types (one layout object per class, split and types,
    so that `1`, `1.0` and `True`, equal under `==`, do not share a compiled
    program), then each entry with `==`.
    """

    __slots__ = ()

    @property
    def layout(self) -> Layout:
        return self[0]

    @property
    def entries(self) -> tuple[Any, ...]:
        return self[1:]

    def __reduce__(self):
        # `type(f)` of a function is not picklable, and the types follow from the
        # values anyway.
        return (make_aux, (self.layout, self.entries))


def make_aux(layout: Layout, entries: tuple[Any, ...]) -> Aux:
    """The aux data of a node of `layout` (a split, or a typed layout of that split)
    holding `entries`."""
    typed = layout.with_types(tuple(map(type, entries)))
    return interned(Aux((typed, *entries)))


class StaticTree(tuple):
    """A static value with structure (a list of sizes, a dict of names, a layer
    without arrays): `(treedef, leaf types, has_carriers, *leaves)`, compared in C.

    A value built of tuples and Equinox modules only (a `Dropout`, a shape) cannot
    change, so it is made once and shared by every read, as Equinox shares a static
    field's value; one holding a list, dict or set is made anew for each.
    """

    # No `__slots__`: the instance dict keeps the shared value once made.

    def value(self) -> Any:
        attrs = self.__dict__
        shared = attrs.get("shared", _UNKNOWN)
        if shared is not _UNKNOWN and shared is not _NOT_SHARED:
            return shared
        treedef, types, has_carriers = self[:3]
        value = treedef.unflatten(natural_leaves(self[3:], types))
        value = with_layers(value) if has_carriers else value
        if shared is _UNKNOWN:
            immutable = SetValue not in types and _immutable_nodes(treedef)
            attrs["shared"] = value if immutable else _NOT_SHARED
        return value

    def __reduce__(self):
        return (StaticTree, (tuple(self),))


_UNKNOWN: Final = object()
_NOT_SHARED: Final = object()


def _immutable_nodes(treedef: Any) -> bool:
    """Whether the value `treedef` makes holds no container made anew by each read:
    every node a tuple (or namedtuple), `None` or an Equinox module, and no module
    of ours with a list, dict or set among its static entries."""
    data = treedef.node_data()
    if data is None:  # a leaf
        return True
    kind, node_aux = data
    if not (
        issubclass(kind, (tuple, type(None), eqx.Module)) or kind in carrier_classes
    ):
        return False
    if type(node_aux) is Aux and not all(map(_immutable_entry, node_aux.entries)):
        return False
    return all(map(_immutable_nodes, jtu.treedef_children(treedef)))


def _immutable_entry(entry: Any) -> bool:
    kind = type(entry)
    if kind is StaticSequence:
        return entry[0] is tuple and SetValue not in entry[1]
    if kind is StaticTree:
        return SetValue not in entry[1] and _immutable_nodes(entry[0])
    return kind is not SetValue


class StaticSequence(tuple):
    """A static list or tuple of leaves (sizes, names, activations): `(list or
    tuple, leaf types, *leaves)`, cheaper to compare and rebuild than a treedef."""

    __slots__ = ()

    def value(self) -> Any:
        kind, types = self[0], self[1]
        if HOLDER_TYPES.isdisjoint(types):
            return kind(self[2:])
        return kind(map(natural_leaf, self[2:]))


def static_tree(
    value: Any, treedef: Any, leaves: list[Any], has_carriers: bool
) -> StaticTree | StaticSequence:
    """The aux entry of a static `value` with structure."""
    leaves = [snapshot_leaf(x) for x in leaves]
    types = tuple(map(type, leaves))
    kind = type(value)
    if (kind is list or kind is tuple) and len(leaves) == treedef.num_nodes - 1:
        return static_sequence(kind, types, leaves)  # every item a leaf (not None)
    return interned(StaticTree((treedef, interned(types), has_carriers, *leaves)))


def static_sequence(
    kind: type, types: tuple[type, ...], leaves: "Iterable[Any]"
) -> StaticSequence:
    """The aux entry of a static list or tuple (`kind`) of leaves already held as
    the aux holds them (`snapshot_leaf`), of these types."""
    return interned(StaticSequence((kind, interned(types), *leaves)))


def entry_value(entry: Any) -> Any:
    """The attribute value a STATIC entry stands for."""
    kind = type(entry)
    if kind is StaticTree or kind is StaticSequence:
        return entry.value()
    return natural_leaf(entry)


# `(children, aux, values, containers)`: the node's pytree form, and the field values
# it was decided from (None for a node not yet filled in) with the records of the
# containers they reach, which flatten checks.
Flat = tuple[tuple[Any, ...], Aux, tuple[Any, ...] | None, ContainerRecords | None]


def set_partition(obj: Any, flat: Flat) -> None:
    """Stores the `Flat` of a node whose partition has been decided."""
    set_flat(obj, flat)


def set_carrier_partition(carrier: Any, flat: Flat) -> None:
    """Stores the `(children, aux)` of a carrier's decided `Flat`, alone: its flatten
    checks nothing, and JAX reads that pair from the slot in C
    (`carrier_flatten_functions`)."""
    set_flat(carrier, flat[:2])


def has_stored_partition(obj: Any) -> bool:
    """Whether the partition of `obj` has been decided (its `__init__` has ended)."""
    try:
        get_flat(obj)
    except AttributeError:
        return False
    return True


def partition_of(obj: Any) -> tuple[tuple[Any, ...], Aux]:
    """The stored `(children, aux)` of a decided node, as it is."""
    flat = get_flat(obj)  # a `Flat`, or a carrier's `(children, aux)`
    return flat[0], flat[1]


def unflatten(cls: type, aux: Aux, children: tuple[Any, ...]) -> Any:
    # Lazy: the attributes are filled in from `(children, aux)` on first access
    # (`materialise`), because unflattening runs once per node of every tree_map, and
    # intermediate trees (gradients, optimiser updates, in_axes specs) are mostly
    # never looked into.
    obj = _object_new(cls)
    set_flat(obj, (children, aux, None, None))
    return obj


def unflatten_eager(cls: type, aux: Aux, children: tuple[Any, ...]) -> Any:
    """For classes on which a field name resolves through a base (see `needs_eager`)."""
    obj = unflatten(cls, aux, children)
    materialise(obj)
    return obj


def _attribute_code(
    layout: Layout, watched: bool
) -> tuple[list[str], tuple[str, ...], str, str]:
    """Source lines that compute the attribute values of a node of `layout` from
    `children` and `aux` into locals (`v0`, `v1`, ...), their field names, and the
    expressions of the `Flat`'s values and container records (`None` for a node
    whose flatten checks nothing: not `watched`)."""
    names = fields_of(layout.cls).names
    lines, recorded = [], []
    for i, (name, kind) in enumerate(zip(names, layout.kinds)):
        if kind == STATIC and _entry_type(layout, name) is StaticSequence:
            entry = f"aux[{layout.entry_names.index(name) + 1}]"
            lines += _sequence_code(f"v{i}", entry, watched)
            recorded.append(f"*flat_v{i}, " if watched else "")
            continue
        if kind == HOLED and _entry_type(layout, name) is Holes:
            j = layout.entry_names.index(name)
            child = f"children[{layout.entry_child[j]}]"
            v = f"v{i}"
            if not watched:
                lines += items_value_code(v, f"aux[{j + 1}]", child, [], [])
                continue
            # Made items are plain: the list's record is the tuple they came as.
            made = [
                f"    flat_{v} = ({_exact_record(v, 'items')},)"
                f" if type({v}) is list else ()"
            ]
            lines += items_value_code(
                v, f"aux[{j + 1}]", child, made, _recording_code(v, True)
            )
            recorded.append(f"*flat_{v}, ")
            continue
        value, reaches = _value_code(layout, name, kind)
        if kind == CARRIED and watched:
            lines += _carried_code(f"v{i}", value)
            recorded.append(f"*flat_v{i}, ")
            continue
        lines.append(f"    v{i} = {value}")
        if kind == CARRIED:
            lines += _layer_code(f"v{i}")
        if watched and reaches:
            lines += _recording_code(f"v{i}", kind in CHILD_KINDS)
            recorded.append(f"*flat_v{i}, ")
    values = "(" + "".join(f"v{i}, " for i in range(len(names))) + ")"
    if not watched:
        return lines, names, "None", "None"
    if not recorded:
        return lines, names, values, "None"
    records = "".join(recorded)
    lines.insert(0, "    met = []")
    containers = (
        f"(({records}*watched_containers(met)) if met else ({records}) or None)"
    )
    return lines, names, values, containers


def _value_code(layout: Layout, name: str, kind: int) -> tuple[str, bool]:
    """The expression of a field's attribute value, and whether the value may reach
    a container (a raw static entry does not)."""
    if kind in (CHILD, CARRIED):  # CARRIED: `_layer_code` follows
        return f"children[{layout.child_names.index(name)}]", True
    j = layout.entry_names.index(name)
    entry = f"aux[{j + 1}]"
    entry_type = _entry_type(layout, name)
    if kind == HOLED:
        return f"{entry}.value(children[{layout.entry_child[j]}])", True
    if entry_type is None:  # the layout of a split: any entry
        return f"natural({entry})", True
    if entry_type in _RAW_ENTRY_TYPES:
        return entry, False
    if entry_type is StaticTree:  # a `StaticSequence` takes `_sequence_code`
        return f"{entry}.value()", True
    if entry_type not in HOLDER_TYPES:  # a function: its own value
        return entry, True
    return f"natural({entry})", True


def _entry_type(layout: Layout, name: str) -> type | None:
    """The type of the aux entry of field `name` in a typed layout, else None."""
    if layout.static_types is None:
        return None
    return layout.static_types[layout.entry_names.index(name)]


def _sequence_code(v: str, entry: str, watched: bool) -> list[str]:
    """Source lines that make `v` the value of `entry`, a `StaticSequence`, and (if
    `watched`) its record as `flat_v`. Its leaves are no containers: a sequence of
    leaves that are their own values is made from them at once, and its record as a
    list is those leaves, as the aux holds them."""
    lines = [f"    e = {entry}"]
    if watched:  # sizes, names: one check of the item types
        lines += [
            "    if plain_items.issuperset(e[1]):",
            "        items = e[2:]",
            "        if e[0] is list:",
            f"            {v} = list(items)",
            f"            flat_{v} = ({_exact_record(v, 'items')},)",
            "        else:",
            f"            {v}, flat_{v} = items, ()",
            "    elif holder_free(e[1]):",
        ]
    else:
        lines.append("    if holder_free(e[1]):")
    lines += [
        f"        {v} = items = e[2:]",
        "        if e[0] is list:",
        f"            {v} = list(items)",
    ]
    if watched:
        lines += [
            f"        flat_{v} = ({_record_code(v, 'items', 'e[1]')},)"
            " if e[0] is list else ()",
            # Only where every type may be plain: a float never is.
            "        if exact_types.issuperset(e[1]):",
            "            note_items(e[1])",
        ]
    lines += ["    else:", f"        {v} = e.value()"]
    if watched:
        lines += ("    " + line for line in _recording_code(v, False))
    return lines


def _exact_record(v: str, items: str) -> str:
    """The expression of the record of the list `v` whose snapshot is `items`
    (expressions), every item of an exact type: as `record_container` makes it."""
    return f"({v}, list_snapshot, {items}, False)"


def _record_code(v: str, items: str, types: str) -> str:
    """The expression of the record of the list `v`, given its snapshot `items` and
    the collection of its item `types` (expressions): written inline
    (`_exact_record`) where every type is exact under `==`, else made by
    `record_container`."""
    return (
        f"({_exact_record(v, items)} if exact_types.issuperset({types})"
        f" else record({v}, {items}, {types}))"
    )


def _layer_code(v: str) -> list[str]:
    """Source lines that make `v`, a CARRIED child, its attribute value: a lone
    carrier's layer read inline (most held layers are alone in their field), else
    `with_layers`."""
    return [
        f"    if type({v}) in carrier_classes and not surgeries[0]:",
        f"        {v} = get_layer({v})",
        "    else:",
        f"        {v} = with_layers({v})",
    ]


def _carried_code(v: str, child: str) -> list[str]:
    """Source lines that make `v`, the watched CARRIED child `child`, its attribute
    value and its record as `flat_v`. A layer alone (an attention's projection) is
    read from its carrier and needs no record: it reaches no container and is no
    AutoModule. A flat list or tuple of carriers only (a stack of layers) maps to
    its layers in one C call and is recorded as the tuple they came as: layers need
    nothing more (exact under `==`). Anything else takes `with_layers` and
    `_recording_code`."""
    return [
        f"    {v} = {child}",
        f"    t = type({v})",
        "    items = None",
        "    if t in carrier_classes and not surgeries[0]:",
        f"        {v} = get_layer({v})",
        f"        flat_{v} = ()",
        "    else:",
        "        if (t is list or t is tuple) and not surgeries[0]:",
        "            try:",
        f"                items = tuple(map(get_layer, {v}))",
        "            except TypeError:  # not carriers only",
        "                pass",
        "        if items is None:",
        f"            {v} = with_layers({v})",
        *("        " + line for line in _recording_code(v, True)),
        "        elif t is list:",
        f"            {v} = list(items)",
        f"            flat_{v} = ({_exact_record(v, 'items')},)",
        "        else:",
        f"            {v}, flat_{v} = items, ()",
    ]


def _recording_code(v: str, child: bool) -> list[str]:
    """Source lines that record the lists the value `v` reaches: a flat list (of
    layers, arrays, numbers) here as `flat_v`, as `watched_containers` would; anything
    else that may reach a container is walked into `met`. For a child, the
    AutoModules it holds alone or as items, left to be filled in, are collected in
    `pending`."""
    if not child:
        return [
            f"    t = type({v})",
            f"    if t is list and leaf_types.issuperset(ts := set(map(type, {v}))):",
            f"        flat_{v} = ({_record_code(v, f'list_snapshot({v})', 'ts')},)",
            "    else:",
            f"        flat_{v} = ()",
            "        if t not in leaf_types:",
            f"            walk({v}, (), None, met)",
        ]
    return [
        f"    t = type({v})",
        "    if t is list or t is tuple:",
        f"        ts = set(map(type, {v}))",
        "        if plain_items.issuperset(ts):  # layers, functions, numbers",
        f"            flat_{v} = ({_exact_record(v, f'list_snapshot({v})')},)"
        " if t is list else ()",
        "        elif lazy_items.issuperset(ts):  # AutoModules to fill in",
        f"            pending += {v}",
        f"            flat_{v} = ({_exact_record(v, f'list_snapshot({v})')},)"
        " if t is list else ()",
        "        else:",
        "            holds_lazy = not lazy_classes.isdisjoint(ts)",
        "            if holds_lazy:",
        f"                pending += [x for x in {v} if type(x) in lazy_classes]",
        "            if leaf_types.issuperset(ts):",
        f"                flat_{v} = ({_record_code(v, f'list_snapshot({v})', 'ts')},)"
        " if t is list else ()",
        # Only where every type may be noted: a list of arrays never is.
        "                if exact_types.issuperset(ts):",
        "                    note_items(ts)",
        "            else:",
        f"                flat_{v} = ()",
        f"                walk({v}, (), None, met)",
        "    else:",
        f"        flat_{v} = ()",
        "        if t in lazy_classes:",
        f"            pending.append({v})",
        "        elif t not in leaf_types:",
        f"            walk({v}, (), None, met)",
    ]


def _generated(layout: Layout, kind: str, source: list[str]) -> Callable[..., Any]:
    """Compiles `source`, the function named `kind` generated for `layout`, with the
    names generated code uses; its name in tracebacks says which layout."""
    namespace = {
        "new": _object_new,
        "set_flat": set_flat,
        "get_attribute": _object_getattribute,
        "with_layers": with_layers,
        "carrier_classes": carrier_classes,
        "surgeries": surgeries,
        "get_layer": get_layer,
        "natural": entry_value,
        "holder_free": HOLDER_TYPES.isdisjoint,
        "leaf_types": known_leaf_types(),
        "walk": walk,
        "watched_containers": watched_containers,
        "list_snapshot": LIST_SNAPSHOT,
        "record": record_container,
        "exact_types": exact_eq_types(),
        "lazy_classes": _lazy_classes,
        "plain_items": _plain_items,
        "lazy_items": _lazy_items,
        "note_items": _note_items,
    }
    if kind == "unflatten":
        namespace["layer_class"] = carrier_classes[layout.cls]
    name = f"<autostatic {kind} of {layout!r}>"
    exec(compile("\n".join(source), name, "exec"), namespace)
    return namespace[kind]


def _generated_fill(layout: Layout) -> Callable[[type, Aux, tuple[Any, ...]], Any]:
    """The unflatten of carriers of `layout`: it makes the carrier and the layer it
    stands for, the layer's attribute dict filled at once (as Equinox's generated
    unflatten fills its module's); generated for the layout's fields, so that each is
    a few stores (no loop)."""
    source = ["def unflatten(cls, aux, children):", *_fill_body(layout)]
    return _generated(layout, "unflatten", source)


def _fill_body(layout: Layout) -> list[str]:
    """The source lines of `_generated_fill`'s function body."""
    lines, names, _, _ = _attribute_code(layout, watched=False)
    stores = [f"    attrs[{n!r}] = v{i}" for i, n in enumerate(names)]
    return [
        *lines,
        "    obj = new(cls)",
        "    layer = new(layer_class)",
        *(f"    {line}" for line in carrier_stores("obj", "(children, aux)", "layer")),
        "    attrs = get_attribute(layer, '__dict__')",
        *stores,
        "    return obj",
    ]


def carrier_unflatten(cls: type) -> Callable[[Aux, tuple[Any, ...]], Any]:
    """The unflatten to register for the carrier class `cls`: `unflatten_filled`,
    until the first layout of `cls` has its fill generated; then that fill, inline,
    for that layout (any other still goes through `unflatten_filled`).

    The class is registered when it is made, before any layout exists, so the
    function registered is made here, alone in its namespace with `cls`, and its code
    is replaced once (a function's `__code__` is writable): a held layer's unflatten
    is then one Python call, as Equinox's is, not two."""
    namespace: dict[str, Any] = {"unflatten_filled": unflatten_filled, "cls": cls}
    source = (
        "def unflatten(aux, children):\n    return unflatten_filled(cls, aux, children)"
    )
    exec(
        compile(source, f"<autostatic unflatten of {cls.__qualname__}>", "exec"),
        namespace,
    )
    function = namespace["unflatten"]
    _unspecialised[cls] = function
    return function


# The registered unflatten of each carrier class whose first layout has not been met.
_unspecialised: "weakref.WeakKeyDictionary[type, Any]" = weakref.WeakKeyDictionary()


def _specialise(layout: Layout) -> None:
    """Gives the registered unflatten of `layout.cls`, if it has none yet, the fill
    of `layout` inline (`carrier_unflatten`)."""
    function = _unspecialised.pop(layout.cls, None)
    if function is None:
        return
    source = [
        "def unflatten(aux, children):",
        "    if aux[0] is not layout:",
        "        return unflatten_filled(cls, aux, children)",
        *_fill_body(layout),
    ]
    specialised = _generated(layout, "unflatten", source)
    function.__globals__.update(specialised.__globals__)
    function.__globals__["layout"] = layout
    function.__code__ = specialised.__code__


def _generated_materialise(layout: Layout) -> Callable[..., Any]:
    """What `materialise` does for an AutoModule of `layout`: fills its attributes in
    from `(children, aux)` and records them for its flatten to check; returns the
    AutoModules its children hold that are still to be filled in."""
    lines, names, values, containers = _attribute_code(layout, watched=True)
    stored = ", ".join(f"{n!r}: v{i}" for i, n in enumerate(names))
    source = [
        "def materialise(obj, attrs, children, aux, pending):",
        *lines,
        # One `update` from a complete dict, then the values that mark the instance
        # filled in: another thread reading it at the same time sees either no
        # field (and fills them in too) or every field. A field written before
        # (`object.__setattr__`) keeps its value, which the flatten then sees.
        "    if attrs:",
        f"        attrs.update({{**{{{stored}}}, **attrs}})",
        "    else:",
        f"        attrs.update({{{stored}}})",
        f"    set_flat(obj, (children, aux, {values}, {containers}))",
    ]
    return _generated(layout, "materialise", source)


# Entry types that are their own attribute value (no `SetValue`, `Compared` or
# `StaticTree` to unwrap) and reach no container.
_RAW_ENTRY_TYPES: Final = frozenset({int, float, bool, str, complex, bytes, type(None)})


def unflatten_filled(cls: type, aux: Aux, children: tuple[Any, ...]) -> Any:
    """Unflatten of carriers, filling the attributes in at once, with code generated
    for the node's layout."""
    layout = aux[0]
    fill = layout.fill
    if fill is None:
        fill = layout.fill = _generated_fill(layout)
        _specialise(layout)
    return fill(cls, aux, children)


_FLATTEN_SOURCE: Final = """
def flatten(obj):
    try:
        children, aux, v, containers = get_flat(obj)
    except AttributeError:
        return refresh(obj)
    if v is None:{unfilled}
        return children, aux
    d = get_attribute(obj, "__dict__")
    try:
        if {checks}True:
            if containers is None:
                return children, aux
            for c, snapshot, items, by_identity in containers:
                new = snapshot(c)
                if new != items or by_identity and not all(map(is_, new, items)):
                    break
            else:
                return children, aux
    except Exception:  # a field missing, or an item whose == raises
        pass
    return refresh(obj)
"""


# For a lazily unflattened instance not yet filled in, whose dict is empty unless
# `object.__setattr__` wrote to it.
_UNFILLED_CHECK: Final = """
        if get_attribute(obj, "__dict__"):
            materialise(obj)
            return refresh(obj)"""


def _generated_flatten(
    cls: type, refresh: Callable[[Any], tuple[tuple[Any, ...], Aux]]
) -> Callable[[Any], tuple[tuple[Any, ...], Aux]]:
    """Flatten for `cls`: the stored partition, after checking by identity that each
    field still holds the value it was decided from (one generated comparison per
    field, so that even a bypass of `__setattr__` is seen) and that no watched
    container changed; otherwise `refresh(obj)`. An instance not yet filled in is
    checked for a field written by a bypass."""
    names = [f.name for f in dataclasses.fields(cls)]  # pyright: ignore[reportArgumentType]  # a dataclass by now
    checks = "".join(f"d[{n!r}] is v[{i}] and " for i, n in enumerate(names))
    namespace = {
        "get_flat": get_flat,
        "get_attribute": _object_getattribute,
        "refresh": refresh,
        "materialise": materialise,
        "is_": operator.is_,
    }
    source = _FLATTEN_SOURCE.format(checks=checks, unfilled=_UNFILLED_CHECK)
    name = f"<autostatic flatten of {cls.__qualname__}>"
    exec(compile(source, name, "exec"), namespace)
    return namespace["flatten"]


NewAux = Callable[[type, Aux, tuple[Any, ...]], None]


def _noting_new_aux(
    base: Callable[[type, Aux, tuple[Any, ...]], Any],
    on_new_aux: NewAux,
    noted_types: frozenset[type],
) -> Callable[[type, Aux, tuple[Any, ...]], Any]:
    """`base` (an unflatten) that calls `on_new_aux` when an aux entry of one of
    `noted_types` is not what the last aux of its layout held: one identity check
    for the aux a treedef repeats, one comparison in C for another (the blocks of a
    model, each its own aux, that differ in a name)."""
    eager = base is not unflatten

    def unflatten_noting(cls: type, aux: Aux, children: tuple[Any, ...]) -> Any:
        if eager:
            obj = base(cls, aux, children)
        else:  # the lazy unflatten, inline: it runs for every node of every tree_map
            obj = _object_new(cls)
            set_flat(obj, (children, aux, None, None))
        layout = aux[0]
        if layout.last_aux is not aux:
            layout.last_aux = aux
            pick = layout.noted
            if pick is None:
                pick = layout.noted = _picker(layout, noted_types)
            if pick is not _nothing_noted:
                noted = pick(aux)
                if _differ(layout.last_noted, noted):
                    layout.last_noted = noted
                    on_new_aux(cls, aux, children)
        return obj

    return unflatten_noting


def _nothing_noted(aux: Aux) -> None:
    return None


def _picker(layout: Layout, noted_types: frozenset[type]) -> Callable[[Aux], Any]:
    """What picks the entries of `noted_types` out of an aux of `layout` (typed)."""
    at = [
        j + 1
        for j, (kind, entry_type) in enumerate(
            zip(layout.entry_kinds, layout.static_types or ())
        )
        if kind == STATIC and entry_type in noted_types
    ]
    if not at:
        return _nothing_noted
    get = operator.itemgetter(*at)
    return (lambda aux: (get(aux),)) if len(at) == 1 else get


def _differ(a: Any, b: Any) -> bool:
    try:
        return bool(a != b)
    except Exception:  # noted entries are numbers and functions; be safe anyway
        return True


def _with_keys(
    flatten: Callable[[Any], tuple[tuple[Any, ...], Aux]],
) -> Callable[[Any], tuple[tuple[tuple[Any, Any], ...], Aux]]:
    """The flatten-with-keys of a node whose flatten is `flatten`."""

    def flatten_with_keys(obj: Any) -> tuple[tuple[tuple[Any, Any], ...], Aux]:
        children, aux = flatten(obj)
        return tuple(zip(aux.layout.child_keys, children)), aux

    return flatten_with_keys


def carrier_flatten_functions(cls: type) -> FlattenFunctions:
    """Flatten, flatten-with-keys and unflatten for the new carrier class `cls`: its
    flatten is the slot's own getter (the stored `(children, aux)`, checked against
    nothing), its unflatten makes the carrier and its layer at once."""
    return get_flat, _with_keys(get_flat), carrier_unflatten(cls)


def flatten_functions(
    cls: type,
    refresh: Callable[[Any], tuple[tuple[Any, ...], Aux]],
    *,
    on_new_aux: NewAux | None = None,
    noted_types: frozenset[type] = frozenset(),
) -> FlattenFunctions:
    """Flatten, flatten-with-keys and unflatten for the new AutoModule class `cls`.

    Flatten reads the slot; an instance whose attributes no longer hold what its
    partition was decided from, or that has none yet (flattened from inside its own
    `__init__` or `__check_init__`), gets `refresh(obj)`. Unflatten is lazy, unless a
    base shadows a field (`needs_eager`); with `on_new_aux`, it reports each aux that
    is not the last one of its layout.
    """
    flatten = _generated_flatten(cls, refresh)
    if needs_eager(cls):
        chosen = unflatten_eager
    else:
        chosen = unflatten
        _lazy_classes.add(cls)
    if on_new_aux is not None:
        chosen = _noting_new_aux(chosen, on_new_aux, noted_types)
    return flatten, _with_keys(flatten), chosen


def materialise(obj: Any) -> dict[str, Any]:
    """Returns the `__dict__` of `obj` with every field filled in.

    A lazily unflattened instance is filled in from its partition, and so are the
    AutoModules below it that are still to be (each as its fields are, iteratively):
    a module read once is usually read throughout, and each filled in here skips
    the `__getattr__` of its own first read."""
    pending = [obj]
    while pending:
        _fill(pending.pop(), pending)
    return _object_getattribute(obj, "__dict__")


def _fill(obj: Any, pending: list[Any]) -> None:
    """Fills `obj` in if it was lazily unflattened and is not yet (a carrier never
    is), adding the AutoModules its children hold to `pending`."""
    try:
        children, aux, values, _ = get_flat(obj)
    except AttributeError:  # still in __init__, before anything was assigned
        return
    except ValueError:  # a carrier's `(children, aux)`: filled in when made
        return
    if values is not None:  # filled in already, or decided from its values
        return
    layout = aux[0]
    fill = layout.materialise
    if fill is None:
        fill = layout.materialise = _generated_materialise(layout)
    fill(obj, _object_getattribute(obj, "__dict__"), children, aux, pending)


# The AutoModule classes whose unflatten leaves the attributes to be filled in.
_lazy_classes: set[type] = set()


# Exact types whose instances, as items of a list filled in, need nothing but the
# record that `exact_eq_types` allows inline: no container (`known_leaf_types`), no
# AutoModule to fill in (a class is lazy from its creation, before any instance), no
# holder standing for another value. Read by generated code; grows by `_note_items`,
# as each of those sets does.
_plain_items: set[type] = set()

# The lazy AutoModule classes that are exact and no container: a list of only their
# instances needs them filled in and the inline record, nothing else.
_lazy_items: set[type] = set()


def _note_items(types: Iterable[type]) -> None:
    """Adds the types in `types` that are plain items (`_plain_items`) or lazy items
    (`_lazy_items`)."""
    leaf, exact = known_leaf_types(), exact_eq_types()
    for kind in types:
        if kind not in leaf or kind not in exact or kind in HOLDER_TYPES:
            continue
        (_lazy_items if kind in _lazy_classes else _plain_items).add(kind)
