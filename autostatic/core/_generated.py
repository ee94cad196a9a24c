"""The one piece of generated code: a class's flatten for the field types it meets.

The general flatten (`_plan.make_flatten`) finds a node's plan by the tuple of its
field values' types, which costs a tuple and a dict lookup per node. For the types a
class's instances hold (arrays in some fields, numbers and functions in others), a
flatten written for that class compares each field's type with the one expected and
picks the children and entries by name: 0.32x Equinox's flatten against the general
one's 0.58x, on a model of 256 layers of the user's own (design.md, "The flatten").
Any instance whose types differ, a template, or one still in `__init__` takes the
general flatten. The source is kept on the function (`__source__`), as Equinox keeps
its own generated functions', and in `linecache`, so tracebacks and debuggers show it.

JAX registers one flatten per class, when Equinox creates it, before any field type
is known: that function starts as a call of the general flatten (`dispatcher`) and
takes the generated code once, in place (`specialise`).
"""

import linecache
from collections.abc import Callable
from typing import Any, Final

_DISPATCHER: Final = """\
def flatten(self):
    \"\"\"{qualname}'s flatten, until the field types its instances hold are met.\"\"\"
    return general(self)
"""

_TEMPLATE: Final = '''\
def flatten(self):
    """{qualname}'s flatten when its fields hold {types}: the children {children},
    the static entries {entries}; any other instance takes the general flatten."""
    if templates:
        return general(self)
    try:
        {unpack} = read({dict_of_self})
    except KeyError:
        return general(self)
    if {checks}:
        {finish}
    return general(self)
'''

# How the flatten of a layer class held in an AutoModule ends: it makes the layer's
# carrier (`_carriers`) at once.
_CARRIER_FINISH: Final = """\
carrier = new(carrier_class)
        carrier._autostatic_flat = ({child_values}), {aux}
        carrier._autostatic_layer = self
        return carrier"""


def _compiled(owner: type, source: str, scope: dict[str, Any]) -> Callable[..., Any]:
    filename = f"<autostatic flatten of {owner.__qualname__} #{id(source)}>"
    exec(compile(source, filename, "exec"), scope)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    function = scope["flatten"]
    function.__source__ = source
    return function


def dispatcher(owner: type, general: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """The flatten to register for `owner`: the general one, until `specialise`."""
    source = _DISPATCHER.format(qualname=owner.__qualname__)
    return _compiled(owner, source, {"general": general})


def specialise(function: Callable[[Any], Any], fast: Callable[[Any], Any]) -> None:
    """Gives `function` (from `dispatcher`) the code of `fast` (from `fast_flatten`),
    in place: JAX holds the registered function itself."""
    function.__globals__.update(fast.__globals__)
    function.__code__ = fast.__code__
    function.__doc__ = fast.__doc__
    function.__source__ = fast.__source__  # pyright: ignore[reportFunctionMemberAccess]  # set by `_compiled`


def fast_flatten(
    owner: type,
    names: tuple[str, ...],
    types: tuple[type, ...],
    taken: tuple[bool, ...],
    namespace: dict[str, Any],
    carrier: bool = False,
) -> Callable[[Any], Any]:
    """The flatten of `owner` (fields `names`) for instances whose field values have
    exactly `types`: the fields `taken` are the children, the others static entries
    of the aux `namespace["plan"]` starts. `namespace` holds the names the code reads:
    `templates`, `general`, `read`, `plan`, `aux` (the aux of a node without
    entries) and `get_dict` (the `__dict__` of an instance whose class has a Python
    `__getattribute__`). With `carrier`, it returns the layer's carrier instead of
    its node (`namespace` then also holds `new` and `carrier_class`)."""
    values = [f"v{i}" for i in range(len(names))]
    entries = [v for v, t in zip(values, taken) if not t]
    direct = getattr(owner, "__getattribute__", None) is object.__getattribute__
    child_values = "".join(f"{v}, " for v, t in zip(values, taken) if t)
    aux = f"(plan, {', '.join(entries)})" if entries else "aux"
    finish = _CARRIER_FINISH if carrier else "return ({child_values}), {aux}"
    source = _TEMPLATE.format(
        qualname=owner.__qualname__,
        types=", ".join(t.__qualname__ for t in types),
        children=[n for n, t in zip(names, taken) if t],
        entries=[n for n, t in zip(names, taken) if not t],
        unpack="".join(f"{v}, " for v in values),
        dict_of_self="self.__dict__" if direct else "get_dict(self, '__dict__')",
        checks=" and ".join(f"type({v}) is t{i}" for i, v in enumerate(values)),
        finish=finish.format(child_values=child_values, aux=aux),
    )
    scope = {**namespace, **{f"t{i}": t for i, t in enumerate(types)}}
    return _compiled(owner, source, scope)
