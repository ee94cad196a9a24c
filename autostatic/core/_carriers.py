"""Fast carriers of the `eqx.nn` layers an AutoModule holds, for its pytree only.

JAX flattens every node with the function registered for its type, and Equinox
registers each `eqx.Module` class with a generated flatten that reads the instance's
`__dict__` through `Module.__getattribute__` (Python-level) on every flatten: a model
of `eqx.nn.Linear` layers is mostly Linear nodes, so it would flatten as slowly as an
`eqx.Module`.

So where an AutoModule's pytree child holds an `eqx.nn` layer, it holds the layer's
*carrier* instead (`_partition`): an instance of a class made here once per layer
class, of two slots (its `(children, aux)`, decided from the layer's values as an
AutoModule's partition is, and the layer) and no attribute dict. Its flatten is the
slot read, in C; its unflatten makes the carrier and a layer filled in at once. Its
key paths and array leaves are those of the layer. The attribute keeps the layer
itself (`real_layer`, `with_layers`): `type(model.linear) is eqx.nn.Linear`.

A carrier is seen only by `is_leaf` callbacks and `eqx.tree_at`'s `where`, and there
it stands for its layer: `isinstance(carrier, eqx.nn.Linear)` holds (its `__class__`
is the layer class), attributes, calls and their signature, indexing, `repr` and
pickling are the layer's, it is frozen as the layer is, and calling its class makes a
layer. `==` is `eqx.Module`'s on the carrier: an equal carrier, not its layer (a node
of another type, as the layer's own `==` says). It is no subclass of the layer class:
an instance of one would carry an attribute dict of its own, one more object and a
dict swap per layer on every unflatten.

A carrier's flatten returns its stored partition without looking at the layer: an
`eqx.nn` layer is immutable, as Equinox declares it, and checking for a change made
around that (`object.__setattr__` on a held layer) would put a Python call back into
every layer's flatten, which reads the slot in C.

Only classes defined in `equinox.nn` are carried, and not `StateIndex`, which Equinox
checks by exact type: a user's own `eqx.Module` class may have `__init_subclass__`
side effects or `type(x) is` checks that a carrier would break.
"""

import contextlib
import dataclasses
import functools
import inspect
import threading
from collections.abc import Callable, Iterator
from typing import Any, Final

import equinox as eqx

from ._containers import add_leaf_type, known_leaf_types, walk
from ._fields import (
    CARRIER_OF as _CARRIER_OF,
    CarrierBase,
    get_layer,
    is_automodule_class,
    prepare_class,
)

_made: dict[type, type] = {}
_carriers_lock = threading.Lock()
_object_getattribute = object.__getattribute__
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


def carrier_class(cls: type, register: Callable[[type], None]) -> type:
    """The carrier of layer class `cls`, created on first use and given to
    `register` (which makes it a pytree node) before any other thread sees it."""
    try:
        return _made[cls]
    except KeyError:
        pass
    with _carriers_lock:
        if cls not in _made:
            carrier = _make_carrier_class(cls)
            register(carrier)
            _made[cls] = carrier
        return _made[cls]


# Protocol methods a carrier answers as its layer (Python looks them up on the type,
# past `__getattr__`), where the layer class defines them.
_FORWARDED: Final = (
    "__call__",
    "__getitem__",
    "__iter__",
    "__len__",
    "__contains__",
    "__repr__",
)


def _forwarding(cls: type, name: str) -> Callable[..., Any]:
    # Wrapping the layer class's method: its signature and docstring are the
    # carrier's (`eqx.filter_vmap`'s `in_axes` by argument name reads it).
    @functools.wraps(getattr(cls, name))
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(get_layer(self), name)(*args, **kwargs)

    return method


def _carrier_getattr(self: Any, name: str) -> Any:
    return getattr(get_layer(self), name)


class _FrozenField:
    """A field of the carrier class: read from the layer, and frozen as the layer's
    is. Per field, not a `__setattr__` on the class: with object's, the carrier's
    own slots are written by specialised attribute stores (`carrier_stores`) on
    every unflatten."""

    __slots__ = ("name", "layer_class")

    def __init__(self, name: str, layer_class: type) -> None:
        self.name = name
        self.layer_class = layer_class

    def __get__(self, carrier: Any, owner: type | None = None) -> Any:
        if carrier is None:  # on the class: as the layer class has it (a default)
            return getattr(self.layer_class, self.name)
        return getattr(get_layer(carrier), self.name)

    def __set__(self, carrier: Any, value: Any) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {self.name!r}")

    def __delete__(self, carrier: Any) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot delete field {self.name!r}")


def _carrier_eq(self: Any, other: Any) -> Any:
    # As `eqx.Module.__eq__` compares the carrier, so that `==` is symmetric: a
    # carrier equals an equal carrier, and no layer (another node type), as the
    # layer's own `==` says of it.
    return eqx.tree_equal(self, other)


def _carrier_hash(self: Any) -> int:
    return hash(get_layer(self))


def _carrier_new(carrier_cls: type, *args: Any, **kwargs: Any) -> Any:
    return carrier_classes[carrier_cls](*args, **kwargs)


class _LayerSignature:
    """The carrier class's `__signature__`: its layer class's, for
    `inspect.signature(type(carrier))`; none on an instance, whose signature is its
    `__call__`'s."""

    def __get__(self, instance: Any, owner: type) -> inspect.Signature:
        if instance is not None:
            raise AttributeError("__signature__")
        return inspect.signature(carrier_classes[owner])


def _carrier_attributes(self: Any) -> dict[str, Any]:
    return _object_getattribute(get_layer(self), "__dict__")


def _make_carrier_class(cls: type) -> type:
    """A class of two slots (its partition, its layer) and no `__dict__` of its own:
    an instance reads, calls and prints as its layer, with its signature, and
    `isinstance` takes it for one (its `__class__` is the layer class); calling the
    class makes a layer. No subclass of the layer class: an instance of one would
    carry an attribute dict of its own, one more allocation and a dict swap per layer
    on every unflatten. Its fields are frozen one by one (`_FrozenField`), and its
    `__setattr__` is object's, which the unflatten's slot stores need to be fast."""
    namespace: dict[str, Any] = {
        _CARRIER_OF: cls,
        "__slots__": ("__weakref__",),
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__doc__": cls.__doc__,
        "__dataclass_fields__": cls.__dataclass_fields__,  # pyright: ignore[reportAttributeAccessIssue]  # an eqx.Module is a dataclass
        "__class__": property(lambda self: cls),
        "__dict__": property(_carrier_attributes),
        "__new__": _carrier_new,
        "__signature__": _LayerSignature(),
        "__getattr__": _carrier_getattr,
        "__eq__": _carrier_eq,
        "__hash__": _carrier_hash,
        "__reduce__": _reduce_carrier,
    }
    for field in dataclasses.fields(cls):  # pyright: ignore[reportArgumentType]  # an eqx.Module is a dataclass
        namespace[field.name] = _FrozenField(field.name, cls)
    for name in _FORWARDED:
        if getattr(cls, name, None) is not getattr(object, name, None):
            namespace[name] = _forwarding(cls, name)
    carrier = type(cls.__name__, (CarrierBase,), namespace)
    prepare_class(carrier, carrier=True)
    carrier_classes[carrier] = cls
    add_leaf_type(carrier)  # walked as an item, never into
    return carrier


# How a carrier becomes the layer it stands for.

# Each carrier class, and the layer class it stands for.
carrier_classes: dict[type, type] = {}


# A carrier always holds its layer: the one it was made from, or one unflattened
# with it.
real_layer: Callable[[Any], Any] = get_layer


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
        # anything but a carrier (TypeError).
        try:
            items = list(map(get_layer, value))
        except TypeError:
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
    except TypeError:  # a tree_map put another object there
        return items_with_layers(items)
    return parts


def items_with_layers(items: "list[Any] | tuple[Any, ...]") -> list[Any]:
    """The items of a list or tuple, as a new list, with every carrier reachable
    through built-in containers replaced by its layer."""
    if surgeries[0] and _keeps_carriers():
        return list(items)
    if _leaf_types.issuperset(map(type, items)):  # no container among them
        return [get_layer(x) if type(x) in carrier_classes else x for x in items]
    return list(walk(items, (), _real_if_carrier, None))
