"""The generated code: a class's flatten for the field types it meets, and its
unflatten for the plan its instances have.

The general flatten (`_node._general_flatten`) finds a node's plan by the tuple of
its field values' types and takes each field its way (`_ways`), a tuple, a dict
lookup and a call per field. For the types a class's instances hold, a flatten written
for that class compares each field's type with the one expected and takes each field
its way, or one narrower, inline. Any instance whose types differ, a template,
one still in `__init__`, or a flatten inside a surgery of layers takes the general
flatten. What each earns is measured in design.md ("Generated code"). The source is
kept on the function (`__source__`), as Equinox keeps its own generated functions',
and in `linecache`, so tracebacks and debuggers show it.

Likewise the unflatten (`fast_unflatten`), for a plan without partial fields: the
attribute dict filled by one store per field, in field order (as `__init__` fills
it, so instances share their dicts' keys), and the children's types checked against
those of a real model's arrays (`_templates`).

JAX registers one flatten and one unflatten per class, when Equinox creates it,
before any field type is known: each starts as a call of the general function
(`dispatcher`, `unflatten_dispatcher`) and takes the generated code once, in place
(`specialise`).
"""

import linecache
from collections.abc import Callable
from typing import Any, Final

from ._static import RAW_ENTRY_TYPES
from ._ways import (
    BOTH,
    CARRY,
    CHILD,
    ENTRY,
    HOLD,
    HOLD_FLOAT,
    ITEMS,
    KEEP,
    LAYERS,
    ROWS,
    SEQUENCE,
    TAKE,
    TREE,
)

_DISPATCHER: Final = """\
def flatten(self):
    "The flatten of {qualname}, until the field types its instances hold are met."
    return general(self)
"""

_TEMPLATE: Final = '''\
def flatten(self):
    """{qualname}'s flatten when its fields hold {types}: the children {children},
    the static entries {entries}; any other instance takes the general flatten."""
    if templates and id(self) in templates:
        return general(self)
    try:
        values = read({dict_of_self})
    except KeyError:
        return general(self)
    {unpack} = values
    if {checks}:
        {finish}
    return general(self)
'''

# How the flatten of a class whose children hold layers ends: in a surgery
# (`_carriers.layers_as_nodes`, this thread), the layers themselves are the children.
_SURGERY_FINISH: Final = """\
if surgeries[0] and in_surgery():
            return {surgery_children}, {aux}
        return {children}, {aux}"""

# How the flatten of a layer class held in an AutoModule ends: it makes the layer's
# carrier (`_carriers`) at once.
_CARRIER_FINISH: Final = """\
carrier = new(carrier_class)
        carrier._autostatic_children = {children}
        carrier._autostatic_aux = {aux}
        carrier._autostatic_layer = self
        return carrier"""


def _compiled(
    owner: type, source: str, scope: dict[str, Any], name: str = "flatten"
) -> Callable[..., Any]:
    filename = f"<autostatic {name} of {owner.__qualname__} #{id(source)}>"
    exec(compile(source, filename, "exec"), scope)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    function = scope[name]
    function.__source__ = source
    return function


def dispatcher(owner: type, general: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """The flatten to register for `owner`: the general one, until `specialise`."""
    source = _DISPATCHER.format(qualname=owner.__qualname__)
    return _compiled(owner, source, {"general": general})


def specialise(function: Callable[..., Any], fast: Callable[..., Any]) -> None:
    """Gives `function` (from a dispatcher) the code of `fast` (generated for it),
    in place: JAX holds the registered function itself."""
    function.__globals__.update(fast.__globals__)
    function.__code__ = fast.__code__
    function.__doc__ = fast.__doc__
    function.__source__ = fast.__source__  # pyright: ignore[reportFunctionMemberAccess]  # set by `_compiled`


# The child expression of each way with a child, the entry expression of each way
# with an entry, and the check beyond the value's type, by way (`v` the value, `t`
# its type, `s` the types of its items, `r` a record split's child and entry, `a`
# whether the field is annotated to hold arrays).
_CHILDREN: Final = {
    TAKE: "{v}",
    TREE: "{v}",
    CARRY: "carried[{t}]({v})",
    LAYERS: "stack_of({v}, {s})",
    ROWS: "{r}[0]",
}
# The ways of the fields of a layer class whose carriers `stack` makes: children
# taken as they are and static values, no layer inside.
STACKED: Final = frozenset({TAKE, KEEP, HOLD_FLOAT, HOLD, SEQUENCE})
# The same in a surgery (`_carriers.layers_as_nodes`): the layers as they are.
_AS_NODES: Final = {**_CHILDREN, CARRY: "{v}", LAYERS: "{v}"}
_ENTRIES: Final = {
    KEEP: "{v}",
    HOLD_FLOAT: "({v} if {v} == {v} and {v} != 0 else hold({v}))",
    HOLD: "hold({v})",
    SEQUENCE: "sequence(({t}, {s}, *{v}))",
    ROWS: "{r}[1]",
}
_CHECKS: Final = {
    TREE: "as_is.issuperset(leaf_types({v}))",
    SEQUENCE: "raw.issuperset({s} := tuple(map(type, {v}))) and {s}",
    LAYERS: "{v} and carried.keys() >= ({s} := set(map(type, {v})))",
    ROWS: "({r} := records({v}, {a})) is not None",
}


def fast_flatten(
    owner: type,
    names: tuple[str, ...],
    types: tuple[type, ...],
    ways: tuple[str, ...],
    namespace: dict[str, Any],
    carrier: bool = False,
    items: dict[int, tuple[tuple[str, type], ...]] | None = None,
) -> Callable[[Any], Any]:
    """The flatten of `owner` (fields `names`) for instances whose field values have
    exactly `types`, each field taken as its way says (`TAKE` ... `LAYERS`; the
    items of a sequence or of layers checked too), the static entries after the plan
    `namespace["plan"]`. `namespace` holds the names the code reads: `templates`,
    `general`, `read`, `plan`, `aux` (the aux of a node without entries),
    `raw` (the item types of a sequence), `as_is` and `child_types` (both
    `_leaves.as_is_types`, named apart so that each check can be measured without
    the other), `sequence` (`_split.StaticSeq`), `hold` (`_static.hold`), `carried`
    (what makes the carrier of a layer, by its class), `surgeries` and `in_surgery`
    (`_carriers`: in a surgery, layers are children as they are), `records`
    (`_split`) and `a0`, `a1`, ... (whether each field is annotated to hold arrays).
    `items` gives, per field of way `ITEMS`, the way and type of each item
    (`namespace` then also holds `flat_holes`). With `carrier`, it returns the
    layer's carrier instead of its node (`namespace` then also holds `new` and
    `carrier_class`)."""
    children, entries, checks = _fields_code(types, ways, items or {})
    aux = f"(plan, {', '.join(entries)})" if entries else "aux"
    as_nodes = _fields_code(types, ways, items or {}, layers_as_nodes=True)[0]
    if carrier:
        if as_nodes != children:  # a layer of layers: made by the general code there
            checks.insert(0, "not surgeries[0]")
        finish = _CARRIER_FINISH
    elif as_nodes != children:
        finish = _SURGERY_FINISH
    else:
        finish = "return {children}, {aux}"
    source = _TEMPLATE.format(
        qualname=owner.__qualname__,
        types=", ".join(t.__qualname__ for t in types),
        children=[n for n, m in zip(names, ways) if m in _CHILDREN or m == ITEMS],
        entries=[n for n, m in zip(names, ways) if m in _ENTRIES or m == ITEMS],
        unpack="".join(f"v{i}, " for i in range(len(names))),
        dict_of_self=_dict_of_self(owner),
        checks=" and ".join(checks),
        finish=finish.format(
            children=_children_tuple(children, ways),
            surgery_children=_children_tuple(as_nodes, ways),
            aux=aux,
        ),
    )
    scope = {
        **namespace,
        "dict_of": dict_getter(owner),
        **{f"t{i}": t for i, t in enumerate(types)},
    }
    for i, taken in (items or {}).items():
        scope[f"m{i}"] = tuple(t for _, t in taken)
        statics = [k for k, (way, _) in enumerate(taken) if way == KEEP]
        scope[f"p{i}"] = tuple(statics)
        scope[f"h{i}"] = tuple(taken[k][1] for k in statics)
    return _compiled(owner, source, scope)


def _dict_of_self(owner: type) -> str:
    """The expression that reads an instance's `__dict__`: in C on an AutoModule,
    whose `__getattribute__` is object's; past Equinox's Python one by `dict_of`."""
    direct = getattr(owner, "__getattribute__", None) is object.__getattribute__
    return "self.__dict__" if direct else "dict_of(self)"


def _child_check(i: int) -> str:
    """The check of field `i`, taken `TAKE`: its type, or any other a child is as it
    is (a bias or `None`, an array or a tracer, a module), with the same plan."""
    return f"(type(v{i}) is t{i} or type(v{i}) in child_types)"


def dict_getter(owner: type) -> Callable[[Any], dict[str, Any]]:
    """What reads an instance's `__dict__` in one C call: the getter of the slot
    Python keeps it in, past a `__getattribute__` written in Python (Equinox's)."""
    for klass in owner.__mro__:
        descriptor = vars(klass).get("__dict__")
        if descriptor is not None and hasattr(descriptor, "__get__"):
            return descriptor.__get__
    return lambda obj: object.__getattribute__(obj, "__dict__")


_STACK_TEMPLATE: Final = '''\
def stack(items):
    """The carriers of a list or tuple of {qualname} layers whose fields hold {types},
    made in one loop; a layer whose static values {entries} are the very objects of
    the layer before it shares its aux. Any other layer is made by `one`."""
    out = []
    append = out.append
{start}    for self in items:
        if templates and id(self) in templates:
            append(one(self))
            continue
        try:
            values = read({dict_of_self})
        except KeyError:
            append(one(self))
            continue
        {unpack} = values
        if not ({child_checks}):
            append(one(self))
            continue
{entries_code}        carrier = new(carrier_class)
        carrier._autostatic_children = {children}
        carrier._autostatic_aux = aux
        carrier._autostatic_layer = self
        append(carrier)
    return out
'''

# How the loop of `stack` finds a layer's aux: that of the layer before where its
# static values are the same objects, else made and checked.
_STACK_ENTRIES: Final = """\
        if not ({same}):
            if not ({checks}):
                append(one(self))
                continue
            {last} = {values}
            aux = {aux}
"""


def fast_stack(
    owner: type,
    names: tuple[str, ...],
    types: tuple[type, ...],
    ways: tuple[str, ...],
    namespace: dict[str, Any],
) -> Callable[[Any], list[Any]]:
    """The carriers of a list or tuple of `owner` layers (fields `names`, of ways
    in `STACKED`), as `fast_flatten` with `carrier` makes each, in one loop.
    `namespace` is `fast_flatten`'s, and `one`: the maker of one layer's carrier."""
    children, entries, _ = _fields_code(types, ways, {})
    child_checks, entry_checks, same, last, values = [], [], [], [], []
    for i, way in enumerate(ways):
        n = {"v": f"v{i}", "t": f"t{i}", "s": f"s{i}"}
        if way == TAKE:
            child_checks.append(_child_check(i))
            continue
        entry_checks.append(f"type(v{i}) is t{i}")
        if way in _CHECKS:
            entry_checks.append(_CHECKS[way].format(**n))
        same.append(f"v{i} is p{i}")
        last.append(f"p{i}")
        values.append(f"v{i}")
    aux = f"(plan, {', '.join(entries)})" if entries else "(plan,)"
    if entries:
        start = f"    {', '.join(last)}, = {'missing, ' * len(last)}\n    aux = None\n"
        entries_code = _STACK_ENTRIES.format(
            same=" and ".join(same),
            checks=" and ".join(entry_checks),
            last=", ".join(last) + ",",
            values=", ".join(values) + ",",
            aux=aux,
        )
    else:
        start, entries_code = f"    aux = {aux}\n", ""
    source = _STACK_TEMPLATE.format(
        qualname=owner.__qualname__,
        types=", ".join(t.__qualname__ for t in types),
        entries=[n for n, m in zip(names, ways) if m != TAKE],
        start=start,
        dict_of_self=_dict_of_self(owner),
        unpack="".join(f"v{i}, " for i in range(len(names))),
        child_checks=" and ".join(child_checks) or "True",
        entries_code=entries_code,
        children="(" + "".join(f"{c}, " for c in children) + ")",
    )
    scope = {
        **namespace,
        "missing": object(),
        "dict_of": dict_getter(owner),
        **{f"t{i}": t for i, t in enumerate(types)},
    }
    return _compiled(owner, source, scope, "stack")


def _children_tuple(children: list[str], ways: tuple[str, ...]) -> str:
    if all(way == TAKE for way in ways):
        return "values"  # the tuple read
    return "(" + "".join(f"{c}, " for c in children) + ")"


def _fields_code(
    types: tuple[type, ...],
    ways: tuple[str, ...],
    items: dict[int, Any],
    layers_as_nodes: bool = False,
) -> tuple[list[str], list[str], list[str]]:
    """The child expressions, entry expressions and checks of the fields, in order;
    with `layers_as_nodes`, children holding the layers where carriers would be."""
    child_code = _AS_NODES if layers_as_nodes else _CHILDREN
    children, entries = [], []
    checks = [
        _child_check(i) if way == TAKE else f"type(v{i}) is t{i}"
        for i, way in enumerate(ways)
    ]
    for i, way in enumerate(ways):
        n = {"v": f"v{i}", "t": f"t{i}", "s": f"s{i}", "r": f"r{i}", "a": f"a{i}"}
        if way == ITEMS:
            child, entry = _items_code(i, items[i], types[i], layers_as_nodes)
            children.append(child)
            entries.append(entry)
            checks.append(f"tuple(map(type, v{i})) == m{i}")
            continue
        if way in child_code:
            children.append(child_code[way].format(**n))
        if way in _ENTRIES:
            entries.append(_ENTRIES[way].format(**n))
        if way in _CHECKS:
            checks.append(_CHECKS[way].format(**n))
    return children, entries, checks


def _items_code(
    i: int, taken: Any, cls: type, layers_as_nodes: bool
) -> tuple[str, str]:
    """The child and entry expressions of field `i` of way `ITEMS`: its items by
    place, a `None` where a static one is."""
    parts = []
    for k, (item, _) in enumerate(taken):
        if item == CARRY and not layers_as_nodes:  # type checked: maker exists
            parts.append(f"carried[m{i}[{k}]](v{i}[{k}])")
        elif item in (TAKE, CARRY):
            parts.append(f"v{i}[{k}]")
        else:
            parts.append("None")
    display = ", ".join(parts) + ("," if len(parts) == 1 else "")
    child = f"[{display}]" if cls is list else f"({display})"
    statics = [f"v{i}[{k}]" for k, (item, _) in enumerate(taken) if item == KEEP]
    entry = f"flat_holes((t{i}, p{i}, h{i}, {', '.join(statics)}))"
    return child, entry


_UNFLATTEN_TEMPLATE: Final = '''\
def unflatten(cls, aux, children):
    """{qualname}'s unflatten for the plan {plan}: the children {children}, the
    static entries {entries}; any other aux takes the general unflatten."""
    if aux[0] is not plan:
        return general(cls, aux, children)
    {unpack} = children
    self = new(cls)
    attrs = {dict_of_self}
{count}{stores}
    if {misfit_checks}(not ({checks}) and not real_items(children)):
        settle(self, attrs, aux, children)
{note}    return self
'''

_UNFLATTEN_DISPATCHER: Final = """\
def unflatten(cls, aux, children):
    "The unflatten of {qualname}, until the plan its instances have is met."
    return general(cls, aux, children)
"""


def unflatten_dispatcher(
    owner: type, general: Callable[..., Any]
) -> Callable[..., Any]:
    """The unflatten to register for `owner`: the general one, until `specialise`."""
    source = _UNFLATTEN_DISPATCHER.format(qualname=owner.__qualname__)
    return _compiled(owner, source, {"general": general}, "unflatten")


def fast_unflatten(
    owner: type, plan: Any, namespace: dict[str, Any]
) -> Callable[..., Any]:
    """The unflatten of `owner` for nodes of `plan`: a new instance, each field stored
    in its attribute dict in field order (a child as it is, a static entry of a type
    that is its own value as it is, any other through `static_value`, a mixed field
    by its entry's `fill`), the types of the children checked against those a real
    model holds, and any fill that met a child not shaped as its holes (`None`,
    a `MaskedNode()`) counted: then `settle` looks again. `namespace` holds `general`, `new`, `settle`, `real`, `real_items`,
    `noted`, `static_value` and `misfits` (`_split`: fills that met a child not
    shaped as their holes)."""
    child_parts = [p for p in plan.parts if p != ENTRY]
    children = [f"c{i}" for i, _ in enumerate(child_parts)]
    types = iter(plan.types)
    stores, c, e = [], 0, 1
    for name, part in zip(plan.names, plan.parts):
        if part == CHILD:
            value, c = children[c], c + 1
        elif part == ENTRY:
            raw = next(types) in RAW_ENTRY_TYPES
            value, e = (f"aux[{e}]" if raw else f"static_value(aux[{e}])"), e + 1
        else:  # both
            value, c, e = f"aux[{e}].fill({children[c]})", c + 1, e + 1
        stores.append(f"    attrs[{name!r}] = {value}")
    source = _UNFLATTEN_TEMPLATE.format(
        qualname=owner.__qualname__,
        plan=repr(plan),
        children=[n for n, p in zip(plan.names, plan.parts) if p != ENTRY],
        entries=list(plan.entry_names),
        unpack="".join(f"{v}, " for v in children) or "()",
        dict_of_self=_dict_of_self(owner),
        stores="\n".join(stores),
        checks=" and ".join(f"type({v}) in real" for v in children) or "True",
        count="    filled = misfits[0]\n" if BOTH in child_parts else "",
        misfit_checks="misfits[0] != filled or " if BOTH in child_parts else "",
        note=(
            "    if plan.last_aux_id != id(aux):\n        noted(cls, aux, children)\n"
            if plan.counted
            else ""
        ),
    )
    scope = {**namespace, "plan": plan, "dict_of": dict_getter(owner)}
    return _compiled(owner, source, scope, "unflatten")
