"""Carriers: what the pytree of an AutoModule holds for each `eqx.nn` layer in it.

JAX flattens every node with the function registered for its type, and Equinox's
generated flatten reads the layer's `__dict__` through `Module.__getattribute__`, a
Python call, on every flatten. So where an AutoModule's child holds an `eqx.nn`
layer, its flatten puts the layer's *carrier* there instead: an object of two slots,
the layer's `(children, aux)` (decided by `_plan`, with the layer's own static
markers) and the layer, whose registered flatten is the slot's getter, in C. A
carrier lives as long as the flatten that made it: nothing is stored per layer, and
its unflatten gives back a layer. The attribute always holds the layer itself.

A carrier is seen only by `is_leaf` callbacks, and there it stands for its layer:
`isinstance(carrier, eqx.nn.Linear)` holds (its `__class__` is the layer class),
attributes, calls and their signature, indexing, `repr` and pickling are the
layer's, it is frozen as the layer is, and calling its class makes a layer.

Only classes defined in `equinox.nn` are carried, and not `StateIndex`, which Equinox
checks by exact type: a user's own `eqx.Module` class may have `__init_subclass__`
side effects or `type(x) is` checks that a carrier would break.
"""

import contextlib
import dataclasses
import functools
import inspect
import operator
import threading
from collections.abc import Callable, Iterator
from typing import Any, Final

import equinox as eqx


class CarrierBase:
    """The slots of every carrier: its layer's children and aux, and the layer
    (named apart from every layer's fields, which the carrier class reads through).
    The children and aux in slots of their own, not one `(children, aux)` pair: one
    object fewer per layer for the collector, in a flatten that makes a carrier of
    every layer at once."""

    __slots__ = (
        "_autostatic_children",
        "_autostatic_aux",
        "_autostatic_layer",
        "__weakref__",
    )


# A carrier's node, `(children, aux)`, read in C: its registered flatten.
get_flat: Final = operator.attrgetter("_autostatic_children", "_autostatic_aux")
carrier_children: Final = operator.attrgetter("_autostatic_children")
carrier_aux: Final = operator.attrgetter("_autostatic_aux")
get_layer: Final = CarrierBase._autostatic_layer.__get__  # pyright: ignore[reportAttributeAccessIssue]  # a slot's member descriptor

# Each carrier class, and the layer class it stands for.
carrier_classes: dict[type, type] = {}
_made: dict[type, type] = {}
_lock = threading.Lock()


def is_carried_class(cls: type) -> bool:
    """A layer class whose instances inside an AutoModule are carried."""
    return (
        cls.__module__.startswith("equinox.nn.")
        and issubclass(cls, eqx.Module)
        and not issubclass(cls, eqx.nn.StateIndex)
        and cls not in carrier_classes
    )


def is_carrier_class(cls: type) -> bool:
    return cls in carrier_classes


def carrier_class(cls: type, register: Callable[[type, type], None]) -> type:
    """The carrier class of layer class `cls`, made on first use and given to
    `register` (which makes it a pytree node) before any other thread sees it."""
    try:
        return _made[cls]
    except KeyError:
        pass
    with _lock:
        if cls not in _made:
            carrier = _make_carrier_class(cls)
            register(carrier, cls)
            carrier_classes[carrier] = cls
            _made[cls] = carrier
        return _made[cls]


def layer_of(x: Any) -> Any:
    """A node item as the node it is: a carrier handed out is its layer."""
    return get_layer(x) if type(x) in carrier_classes else x


# Per layer class whose layers hold no layer: what makes the carriers of a list of
# them in one loop (`_generated.fast_stack`).
stacks: dict[type, Callable[[Any], list[Any]]] = {}


def carriers_of(items: Any, types: set[type], one: Callable[[Any], Any]) -> Any:
    """The carriers of the list or tuple `items` of layers (of `types`), in a
    container of its type: by the loop of their class where they are of one, else
    each by `one`."""
    stack = stacks.get(next(iter(types))) if len(types) == 1 else None
    made = stack(items) if stack is not None else list(map(one, items))
    return made if type(items) is list else tuple(made)


def new_carrier(carrier_cls: type, flat: tuple[Any, Any], layer: Any) -> Any:
    carrier = object.__new__(carrier_cls)
    carrier._autostatic_children, carrier._autostatic_aux = flat
    carrier._autostatic_layer = layer
    return carrier


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


class _FrozenField:
    """A field of the carrier class: read from the layer, and frozen as the layer's
    is."""

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


class _LayerSignature:
    """The carrier class's `__signature__`: its layer class's."""

    def __get__(self, instance: Any, owner: type) -> inspect.Signature:
        if instance is not None:
            raise AttributeError("__signature__")
        return inspect.signature(carrier_classes[owner])


def _carrier_eq(self: Any, other: Any) -> Any:
    # As `eqx.Module.__eq__` compares: a carrier equals an equal carrier, and no
    # layer (another node type), as the layer's own `==` says of it.
    return eqx.tree_equal(self, other)


def _make_carrier_class(cls: type) -> type:
    namespace: dict[str, Any] = {
        "__slots__": (),
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__doc__": cls.__doc__,
        "__dataclass_fields__": cls.__dataclass_fields__,  # pyright: ignore[reportAttributeAccessIssue]  # an eqx.Module is a dataclass
        "__class__": property(lambda self: cls),
        "__dict__": property(lambda self: vars(get_layer(self))),
        "__new__": lambda carrier_cls, *a, **kw: carrier_classes[carrier_cls](*a, **kw),
        "__signature__": _LayerSignature(),
        "__getattr__": lambda self, name: getattr(get_layer(self), name),
        "__eq__": _carrier_eq,
        "__hash__": lambda self: hash(get_layer(self)),
        # As the layer it stands for: a class made at run time cannot be named.
        "__reduce__": lambda self: (_as_is, (get_layer(self),)),
    }
    for field in dataclasses.fields(cls):  # pyright: ignore[reportArgumentType]  # an eqx.Module is a dataclass
        namespace[field.name] = _FrozenField(field.name, cls)
    for name in _FORWARDED:
        if getattr(cls, name, None) is not getattr(object, name, None):
            namespace[name] = _forwarding(cls, name)
    return type(cls.__name__, (CarrierBase,), namespace)


def _as_is(x: Any) -> Any:
    return x


# Surgery: while a thread is inside `layers_as_nodes`, flattens in it give the layers
# themselves, so that what `eqx.tree_at`'s `where` finds is a node of the pytree.
_surgery = threading.local()
# How many threads are inside (`[0]`): while none is, the thread-local flag (slow
# next to a flatten) is not read.
surgeries = [0]
_surgeries_lock = threading.Lock()


@contextlib.contextmanager
def layers_as_nodes() -> Iterator[None]:
    """While active (in this thread), flattens give each `eqx.nn` layer as the node
    it is, Equinox's, not its carrier."""
    with _surgeries_lock:
        surgeries[0] += 1
    try:
        with _this_thread_in_surgery(True):
            yield
    finally:
        with _surgeries_lock:
            surgeries[0] -= 1


@contextlib.contextmanager
def layers_as_carriers() -> Iterator[None]:
    """Inside `layers_as_nodes`, flattens in this thread give carriers again, for a
    user's function that Equinox's surgery calls (`tree_at`'s `replace_fn`)."""
    with _this_thread_in_surgery(False):
        yield


@contextlib.contextmanager
def _this_thread_in_surgery(active: bool) -> Iterator[None]:
    before = getattr(_surgery, "active", False)
    _surgery.active = active
    try:
        yield
    finally:
        _surgery.active = before


def in_surgery() -> bool:
    return bool(surgeries[0]) and getattr(_surgery, "active", False)
