"""Fast twins of the `eqx.nn` layers an AutoModule holds, for its pytree only.

JAX flattens every node with the function registered for its type, and Equinox
registers each `eqx.Module` class with a generated flatten that reads the instance's
`__dict__` through `Module.__getattribute__` (Python-level) on every flatten: a model
of `eqx.nn.Linear` layers is mostly Linear nodes, so it would flatten as slowly as an
`eqx.Module`.

So where an AutoModule's pytree child holds an `eqx.nn` layer, it holds the layer's
*twin* instead (`_partition`): an instance of a subclass created here once per layer
class (`isinstance(twin, eqx.nn.Linear)` holds, for `is_leaf` callbacks; name, repr
and methods are the layer's) whose node is an AutoModule's: the partition decided from
the values in a slot (fields marked `eqx.field(static=True)` stay static), an
unflatten that fills the attributes in. Its key paths and array leaves are those of
the layer. The attribute keeps the layer itself: a twin shares its `__dict__` with
the layer it stands for, the one it was made from or, when unflattened, one made with
it (`real_layer`, `untwin`): `type(model.linear) is eqx.nn.Linear`, and a change of
the layer's attributes is seen by the twin's flatten.

Only classes defined in `equinox.nn` are twinned, and not `StateIndex`, which Equinox
checks by exact type: a user's own `eqx.Module` class may have `__init_subclass__`
side effects or `type(x) is` checks that a subclass would break.
"""

import contextlib
import inspect
import threading
from collections.abc import Iterator
from typing import Any

import equinox as eqx

from ._bound_method import MethodDescriptor, wraps_as_method
from ._compat import set_module_attributes as _set_attributes
from ._containers import known_leaf_types, walk
from ._fields import (
    get_layer,
    is_automodule_class,
    prepare_class,
    set_layer,
    TWIN_OF as _TWIN_OF,
    TwinBase,
)

_twins: dict[type, type] = {}
_twins_lock = threading.Lock()
_object_getattribute = object.__getattribute__
_object_new = object.__new__
_leaf_types = known_leaf_types()


def is_twin_class(cls: type) -> bool:
    return _TWIN_OF in vars(cls)


def is_twin(x: Any) -> bool:
    return _TWIN_OF in vars(type(x))


def is_twinned_class(cls: type) -> bool:
    """A layer class whose instances inside an AutoModule become twins."""
    return (
        cls.__module__.startswith("equinox.nn.")
        and issubclass(cls, eqx.Module)
        and not issubclass(cls, eqx.nn.StateIndex)
        and not is_automodule_class(cls)
        and not is_twin_class(cls)  # a twin already
    )


def _as_is(x: Any) -> Any:
    return x


def _reduce_twin(twin: Any) -> tuple[Any, ...]:
    # As the layer it stands for: a twin class is made at run time, pickle cannot
    # name it, and a twin is no attribute value.
    return (_as_is, (real_layer(twin),))


def twin_class(cls: type) -> type:
    """The twin of layer class `cls`, created on first use."""
    try:
        return _twins[cls]
    except KeyError:
        pass
    with _twins_lock:
        if cls not in _twins:
            _twins[cls] = _make_twin_class(cls)
        return _twins[cls]


def _make_twin_class(cls: type) -> type:
    namespace: dict[str, Any] = {
        _TWIN_OF: cls,
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__doc__": cls.__doc__,
        # Methods are bound by descriptors below, so Equinox's Python-level
        # `__getattribute__` (which binds them on every access) is not needed.
        "__getattribute__": object.__getattribute__,
        "__reduce__": _reduce_twin,
    }
    fields = cls.__dataclass_fields__  # pyright: ignore[reportAttributeAccessIssue]  # an eqx.Module is a dataclass
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if (
                name not in fields
                and wraps_as_method(name, value)
                and inspect.getattr_static(cls, name) is value
            ):
                namespace[name] = MethodDescriptor(value, name)
    # Equinox's metaclass makes the dataclass and registers it; `_partition` answers
    # its call for the flatten functions (claimed by `is_twin_class`).
    twin = type(cls)(cls.__name__, (cls, TwinBase), namespace)
    prepare_class(twin, twin=True)
    register_twin_class(twin, cls)
    return twin


# How a twin becomes the layer it stands for.

# Each twin class, and the layer class it stands for.
twin_classes: dict[type, type] = {}


def register_twin_class(twin: type, layer_class: type) -> None:
    twin_classes[twin] = layer_class
    _leaf_types.add(twin)  # walked as an item, never into


def real_layer(twin: Any) -> Any:
    """The `eqx.nn` layer a twin stands for: the one it was made from or unflattened
    with, or (for a twin made by calling its class) a new one sharing its attributes."""
    try:
        return get_layer(twin)
    except AttributeError:
        pass
    layer = _object_new(twin_classes[type(twin)])
    _set_attributes(layer, _object_getattribute(twin, "__dict__"))
    set_layer(twin, layer)
    return layer


def share_attributes(twin: Any, layer: Any) -> None:
    """Makes `layer`'s own `__dict__` the twin's: one dict, so that a change of the
    layer's attributes, even by `object.__setattr__`, is the twin's too (its flatten
    then decides again), and no attribute is copied."""
    _set_attributes(twin, _object_getattribute(layer, "__dict__"))
    set_layer(twin, layer)


def _real_if_twin(x: Any) -> Any:
    return real_layer(x) if type(x) in twin_classes else x


_surgery = threading.local()  # .keeps_twins: inside `twins_as_attributes`
# How many threads are inside `twins_as_attributes`: while none is, reading the
# thread-local flag (slow next to the rest of an attribute fill-in) is skipped.
_surgeries = [0]


@contextlib.contextmanager
def twins_as_attributes() -> Iterator[None]:
    """While active (in this thread), instances filled in from their partition hold
    the twins themselves: what `eqx.tree_at`'s `where` finds is then a node of the
    pytree. Only for trees made for the surgery and discarded after it."""
    before = getattr(_surgery, "keeps_twins", False)
    _surgery.keeps_twins = True
    _surgeries[0] += 1
    try:
        yield
    finally:
        _surgeries[0] -= 1
        _surgery.keeps_twins = before


def _keeps_twins() -> bool:
    return _surgeries[0] > 0 and getattr(_surgery, "keeps_twins", False)


def untwin(value: Any) -> Any:
    """`value` with every twin reachable through built-in containers replaced by its
    layer: what the attribute holds."""
    if _surgeries[0] and _keeps_twins():
        return value
    kind = type(value)
    if kind in twin_classes:  # a layer held alone
        return real_layer(value)
    if kind is list or kind is tuple:
        # A flat list of layers (and other leaves), the most common: no walk.
        types = set(map(type, value))
        items = None
        try:
            if types <= twin_classes.keys():  # layers only: read in C
                items = list(map(get_layer, value))
            elif _leaf_types.issuperset(types):
                items = [get_layer(x) if type(x) in twin_classes else x for x in value]
        except AttributeError:  # a twin made by calling its class
            pass
        if items is not None:
            return items if kind is list else tuple(items)
    return walk(value, (), _real_if_twin, None)
