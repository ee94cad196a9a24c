"""Fast carriers of the `eqx.nn` layers an AutoModule holds, for its pytree only.

JAX flattens every node with the function registered for its type, and Equinox
registers each `eqx.Module` class with a generated flatten that reads the instance's
`__dict__` through `Module.__getattribute__` (Python-level) on every flatten: a model
of `eqx.nn.Linear` layers is mostly Linear nodes, so it would flatten as slowly as an
`eqx.Module`.

So where an AutoModule's pytree child holds an `eqx.nn` layer, it holds the layer's
*carrier* instead (`_partition`): an instance of a subclass created here once per layer
class (`isinstance(carrier, eqx.nn.Linear)` holds, for `is_leaf` callbacks; name, repr
and methods are the layer's) whose node is an AutoModule's: the partition decided from
the values in a slot (fields marked `eqx.field(static=True)` stay static), an
unflatten that fills the attributes in. Its key paths and array leaves are those of
the layer. The attribute keeps the layer itself: a carrier shares its `__dict__` with
the layer it stands for, the one it was made from or, when unflattened, one made with
it (`real_layer`, `with_layers`): `type(model.linear) is eqx.nn.Linear`.

A carrier's flatten returns its stored partition without looking at the attributes:
an `eqx.nn` layer is immutable, as Equinox declares it, and checking for a change
made around that (`object.__setattr__` on a held layer) would cost every flatten
about 0.14 us a layer, half again an AutoModule model's flatten.

Only classes defined in `equinox.nn` are carried, and not `StateIndex`, which Equinox
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
from ._containers import add_leaf_type, known_leaf_types, walk
from ._fields import (
    CARRIER_OF as _CARRIER_OF,
    CarrierBase,
    get_layer,
    is_automodule_class,
    prepare_class,
    set_layer,
)

_made: dict[type, type] = {}
_carriers_lock = threading.Lock()
_object_getattribute = object.__getattribute__
_object_new = object.__new__
_leaf_types = known_leaf_types()


def is_carrier_class(cls: type) -> bool:
    return _CARRIER_OF in vars(cls)


def is_carrier(x: Any) -> bool:
    return _CARRIER_OF in vars(type(x))


def is_carried_class(cls: type) -> bool:
    """A layer class whose instances inside an AutoModule become carriers."""
    return (
        cls.__module__.startswith("equinox.nn.")
        and issubclass(cls, eqx.Module)
        and not issubclass(cls, eqx.nn.StateIndex)
        and not is_automodule_class(cls)
        and not is_carrier_class(cls)  # a carrier already
    )


def _as_is(x: Any) -> Any:
    return x


def _reduce_carrier(carrier: Any) -> tuple[Any, ...]:
    # As the layer it stands for: a carrier class is made at run time, pickle cannot
    # name it, and a carrier is no attribute value.
    return (_as_is, (real_layer(carrier),))


def carrier_class(cls: type) -> type:
    """The carrier of layer class `cls`, created on first use."""
    try:
        return _made[cls]
    except KeyError:
        pass
    with _carriers_lock:
        if cls not in _made:
            _made[cls] = _make_carrier_class(cls)
        return _made[cls]


def _make_carrier_class(cls: type) -> type:
    namespace: dict[str, Any] = {
        _CARRIER_OF: cls,
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__doc__": cls.__doc__,
        # Methods are bound by descriptors below, so Equinox's Python-level
        # `__getattribute__` (which binds them on every access) is not needed.
        "__getattribute__": object.__getattribute__,
        "__reduce__": _reduce_carrier,
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
    # its call for the flatten functions (claimed by `is_carrier_class`).
    carrier = type(cls)(cls.__name__, (cls, CarrierBase), namespace)
    prepare_class(carrier, carrier=True)
    register_carrier_class(carrier, cls)
    return carrier


# How a carrier becomes the layer it stands for.

# Each carrier class, and the layer class it stands for.
carrier_classes: dict[type, type] = {}


def register_carrier_class(carrier: type, layer_class: type) -> None:
    carrier_classes[carrier] = layer_class
    add_leaf_type(carrier)  # walked as an item, never into


def real_layer(carrier: Any) -> Any:
    """The `eqx.nn` layer a carrier stands for: the one it was made from or
    unflattened with, or (for a carrier made by calling its class) a new one sharing
    its attributes."""
    try:
        return get_layer(carrier)
    except AttributeError:
        pass
    layer = _object_new(carrier_classes[type(carrier)])
    _set_attributes(layer, _object_getattribute(carrier, "__dict__"))
    set_layer(carrier, layer)
    return layer


def share_attributes(carrier: Any, layer: Any) -> None:
    """Makes `layer`'s own `__dict__` the carrier's and records the layer: one dict,
    so that no attribute is copied and the carrier an `is_leaf` callback meets reads
    what the layer holds."""
    _set_attributes(carrier, _object_getattribute(layer, "__dict__"))
    set_layer(carrier, layer)


def _real_if_carrier(x: Any) -> Any:
    return real_layer(x) if type(x) in carrier_classes else x


_surgery = threading.local()  # .keeps_carriers: inside `carriers_as_attributes`
# How many threads are inside `carriers_as_attributes` (`[0]`): while none is,
# reading the thread-local flag (slow next to the rest of an attribute fill-in) is
# skipped. Generated fills read it inline (`_layout`).
surgeries = [0]
_surgeries_lock = threading.Lock()


@contextlib.contextmanager
def carriers_as_attributes() -> Iterator[None]:
    """While active (in this thread), instances filled in from their partition hold
    the carriers themselves: what `eqx.tree_at`'s `where` finds is then a node of the
    pytree. Only for trees made for the surgery and discarded after it."""
    before = getattr(_surgery, "keeps_carriers", False)
    _surgery.keeps_carriers = True
    with _surgeries_lock:
        surgeries[0] += 1
    try:
        yield
    finally:
        with _surgeries_lock:
            surgeries[0] -= 1
        _surgery.keeps_carriers = before


def _keeps_carriers() -> bool:
    """Whether this thread is inside `carriers_as_attributes` (ask only while
    `surgeries[0]`: a thread-local read is slow next to a fill-in)."""
    return getattr(_surgery, "keeps_carriers", False)


def with_layers(value: Any) -> Any:
    """`value` with every carrier reachable through built-in containers replaced by its
    layer: what the attribute holds."""
    if surgeries[0] and _keeps_carriers():
        return value
    kind = type(value)
    if kind is list or kind is tuple:
        # A list of layers only, the most common: read in C. `get_layer` refuses
        # anything but a carrier (TypeError) and a carrier made by calling its class
        # (AttributeError: it has no layer yet).
        try:
            items = list(map(get_layer, value))
        except (TypeError, AttributeError):
            items = items_with_layers(value)
        return items if kind is list else tuple(items)
    if kind in carrier_classes:  # a layer held alone
        return real_layer(value)
    return walk(value, (), _real_if_carrier, None)


def carrier_positions(items: "list[Any] | tuple[Any, ...]") -> "list[int] | bool":
    """The positions of the carriers among `items`, or True if an item is a
    container that may hold one: what `items_with_layers_at` is given back."""
    if not _leaf_types.issuperset(map(type, items)):
        return True
    return [i for i, x in enumerate(items) if type(x) in carrier_classes]


def items_with_layers_at(
    items: "list[Any] | tuple[Any, ...]", carried: "tuple[int, ...] | bool"
) -> list[Any]:
    """The items of a list or tuple, as a new list, with their carriers replaced by
    their layers: `carried` says where the carriers are, as item positions (none
    deeper), or True for anywhere, False for nowhere. Positions known beforehand
    spare the look at every item's type."""
    if not carried:
        return list(items)
    if carried is True or surgeries[0]:
        return items_with_layers(items)
    parts = list(items)
    try:
        for i in carried:
            parts[i] = get_layer(items[i])
    except (TypeError, AttributeError):  # a tree_map put another object there
        return items_with_layers(items)
    return parts


def items_with_layers(items: "list[Any] | tuple[Any, ...]") -> list[Any]:
    """The items of a list or tuple, as a new list, with every carrier reachable
    through built-in containers replaced by its layer."""
    if surgeries[0] and _keeps_carriers():
        return list(items)
    if _leaf_types.issuperset(map(type, items)):  # no container among them
        try:
            return [get_layer(x) if type(x) in carrier_classes else x for x in items]
        except AttributeError:  # a carrier made by calling its class
            pass
    return list(walk(items, (), _real_if_carrier, None))
