"""The generated code: a class's flatten for the field types it meets, and its
unflatten for the plan its instances have.

The general flatten (`_plan.make_flatten`) finds a node's plan by the tuple of its
field values' types, which costs a tuple and a dict lookup per node. For the types a
class's instances hold (arrays in some fields, numbers and functions in others), a
flatten written for that class compares each field's type with the one expected and
picks the children and entries by name: 0.32x Equinox's flatten against the general
one's 0.58x, on a model of 256 layers of the user's own (design.md, "The flatten").
Any instance whose types differ, a template, or one still in `__init__` takes the
general flatten. The source is kept on the function (`__source__`), as Equinox keeps
its own generated functions', and in `linecache`, so tracebacks and debuggers show it.

Likewise the unflatten (`fast_unflatten`), for a plan whose static entries are their
own values: the attribute dict filled by one store per field, in field order (as
`__init__` fills it, so instances share their dicts' keys), and the children's types
checked against those of a real model's arrays (`_plan`'s templates).

JAX registers one flatten and one unflatten per class, when Equinox creates it,
before any field type is known: each starts as a call of the general function
(`dispatcher`, `unflatten_dispatcher`) and takes the generated code once, in place
(`specialise`).
"""

import linecache
from collections.abc import Callable
from typing import Any, Final

_DISPATCHER: Final = """\
def flatten(self):
    "The flatten of {qualname}, until the field types its instances hold are met."
    return general(self)
"""

_TEMPLATE: Final = '''\
def flatten(self):
    """{qualname}'s flatten when its fields hold {types}: the children {children},
    the static entries {entries}; any other instance takes the general flatten."""
    if templates:
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

# How the flatten of a layer class held in an AutoModule ends: it makes the layer's
# carrier (`_carriers`) at once.
_CARRIER_FINISH: Final = """\
carrier = new(carrier_class)
        carrier._autostatic_flat = {children}, {aux}
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


# How the generated flatten takes each field (`fast_flatten`'s `modes`).
CHILD: Final = "child"  # the value is a child
KEPT: Final = "kept"  # the value is a static entry, as it is
SEQUENCE: Final = "sequence"  # a list or tuple of ints, bools, strings: a `StaticSeq`


def fast_flatten(
    owner: type,
    names: tuple[str, ...],
    types: tuple[type, ...],
    modes: tuple[str, ...],
    namespace: dict[str, Any],
    carrier: bool = False,
) -> Callable[[Any], Any]:
    """The flatten of `owner` (fields `names`) for instances whose field values have
    exactly `types`, each field taken as its mode says (`CHILD`, `KEPT`, or a
    `SEQUENCE`, whose items' types are checked too), the static entries after the
    plan `namespace["plan"]`. `namespace` holds the names the code reads:
    `templates`, `general`, `read`, `plan`, `aux` (the aux of a node without
    entries), `get_dict` (the `__dict__` of an instance whose class has a Python
    `__getattribute__`), `raw` (the item types of a sequence) and `sequence`
    (`_split.StaticSeq`). With `carrier`, it returns the layer's carrier instead of
    its node (`namespace` then also holds `new` and `carrier_class`)."""
    values = [f"v{i}" for i in range(len(names))]
    entries = [
        v if mode == KEPT else f"sequence((t{i}, s{i}, *{v}))"
        for i, (v, mode) in enumerate(zip(values, modes))
        if mode != CHILD
    ]
    checks = [f"type({v}) is t{i}" for i, v in enumerate(values)]
    checks += [
        f"raw.issuperset(s{i} := tuple(map(type, {v}))) and s{i}"
        for i, (v, mode) in enumerate(zip(values, modes))
        if mode == SEQUENCE
    ]
    direct = getattr(owner, "__getattribute__", None) is object.__getattribute__
    taken = [mode == CHILD for mode in modes]
    children = "".join(f"{v}, " for v, t in zip(values, taken) if t)
    children = "values" if all(taken) else f"({children})"  # the tuple read, or part
    aux = f"(plan, {', '.join(entries)})" if entries else "aux"
    finish = _CARRIER_FINISH if carrier else "return {children}, {aux}"
    source = _TEMPLATE.format(
        qualname=owner.__qualname__,
        types=", ".join(t.__qualname__ for t in types),
        children=[n for n, t in zip(names, taken) if t],
        entries=[n for n, t in zip(names, taken) if not t],
        unpack="".join(f"{v}, " for v in values),
        dict_of_self="self.__dict__" if direct else "get_dict(self, '__dict__')",
        checks=" and ".join(checks),
        finish=finish.format(children=children, aux=aux),
    )
    scope = {**namespace, **{f"t{i}": t for i, t in enumerate(types)}}
    return _compiled(owner, source, scope)


_UNFLATTEN_TEMPLATE: Final = '''\
def unflatten(cls, aux, children):
    """{qualname}'s unflatten for the plan {plan}: the children {children}, the
    static entries {entries}; any other aux takes the general unflatten."""
    if aux[0] is not plan:
        return general(cls, aux, children)
    {unpack} = children
    self = new(cls)
    attrs = {dict_of_self}
{stores}
    if not ({checks}) and not real_items(children):
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
    """The unflatten of `owner` for nodes of `plan` (whose static entries are their
    own values, no field mixed): a new instance, each field stored in its attribute
    dict in field order, the types of the children checked against those a real
    model holds. `namespace` holds `general`, `new`, `settle`, `real`, `real_items`
    and `noted`."""
    n_children = sum(kind == 0 for kind in plan.kinds)
    children = [f"c{i}" for i in range(n_children)]
    stores, c, e = [], 0, 1
    for name, kind in zip(plan.names, plan.kinds):
        value = children[c] if kind == 0 else f"aux[{e}]"
        c, e = c + (kind == 0), e + (kind != 0)
        stores.append(f"    attrs[{name!r}] = {value}")
    direct = getattr(owner, "__getattribute__", None) is object.__getattribute__
    source = _UNFLATTEN_TEMPLATE.format(
        qualname=owner.__qualname__,
        plan=repr(plan),
        children=[n for n, k in zip(plan.names, plan.kinds) if k == 0],
        entries=list(plan.entry_names),
        unpack="".join(f"{v}, " for v in children) or "()",
        dict_of_self="self.__dict__" if direct else "get_dict(self, '__dict__')",
        stores="\n".join(stores),
        checks=" and ".join(f"type({v}) in real" for v in children) or "True",
        note=(
            "    if plan.last_aux_id != id(aux):\n        noted(cls, aux, children)\n"
            if plan.counted
            else ""
        ),
    )
    scope = {**namespace, "plan": plan, "get_dict": object.__getattribute__}
    return _compiled(owner, source, scope, "unflatten")
