"""Fast twins of the `eqx.nn` layers an AutoModule holds.

JAX flattens every node with the function registered for its type, and Equinox
registers each `eqx.Module` class with a generated flatten that reads the instance's
`__dict__` through `Module.__getattribute__` (Python-level) on every flatten. An
AutoModule's own flatten is one slot read, but a model of `eqx.nn.Linear` layers is
mostly Linear nodes, so it flattened as slowly as an `eqx.Module` (1.00x, 256 layers).

When an AutoModule freezes its fields, each `eqx.nn` layer in them is replaced by an
instance of the layer's *twin*: a subclass created here once per layer class
(`isinstance(layer, eqx.nn.Linear)` holds; name, repr, methods and `__init__` are the
layer's) whose node is stored like an AutoModule's (`_layout`): `(children, aux)` in
a slot, an unflatten generated for its layout that fills the attributes in, methods
bound by descriptors. The partition is Equinox's:
fields marked `eqx.field(static=True)` are aux data and every other field is a child
as it is, so key paths, leaves and retraces are those of the original layer.

Only classes defined in `equinox.nn` are twinned, and not `StateIndex`, which Equinox
checks by exact type: a user's own `eqx.Module` class may have `__init_subclass__`
side effects or `type(x) is` checks that a subclass would break.
"""

import dataclasses
import inspect
import threading
from typing import Any

import equinox as eqx
import jax.tree_util as jtu

from ._bound_method import MethodDescriptor, wraps_as_method
from ._compat import install_flatten_generator
from ._containers import ContainerPath, freeze
from ._layout import (
    DYNAMIC,
    fields_of,
    Flatten,
    flatten_functions,
    is_automodule_class,
    layout_for,
    make_aux,
    materialise,
    Partitioned,
    prepare_class,
    set_partition,
    STATIC,
)

_TWIN_OF = "_autostatic_twin_of"  # class attribute of a twin: its layer class
_twins: dict[type, type] = {}
_twins_lock = threading.Lock()
_object_getattribute = object.__getattribute__
_object_new = object.__new__


def is_twin_class(cls: type) -> bool:
    return _TWIN_OF in vars(cls)


def is_twin(x: Any) -> bool:
    return _TWIN_OF in vars(type(x))


def _twinned(cls: type) -> bool:
    return (
        cls.__module__.startswith("equinox.nn.")
        and issubclass(cls, eqx.Module)
        and not issubclass(cls, eqx.nn.StateIndex)
        and not is_automodule_class(cls)
    )


class _TwinBase(Partitioned):
    """The slot and the pickling that a twin adds to its layer class. (A twin's
    unflatten fills its attributes in at once, so it needs no `__getattr__`.)"""

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, ...]:
        # By the layer class: a twin class is made at run time, pickle cannot name it.
        layer_cls = vars(type(self))[_TWIN_OF]
        return (_restore, (layer_cls, dict(materialise(self))))


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
        "__reduce__": _TwinBase.__reduce__,
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
    # Equinox's metaclass makes the dataclass and registers it; `flatten_functions`
    # answers its call for the flatten functions (claimed by `is_twin_class`).
    twin = type(cls)(cls.__name__, (cls, _TwinBase), namespace)
    prepare_class(twin, equinox_partition=True)
    return twin


def _equinox_kinds(cls: type) -> tuple[int, ...]:
    """Equinox's partition: declared-static fields in the aux data, every other
    field a child as it is."""
    fields = dataclasses.fields(cls)  # pyright: ignore[reportArgumentType]  # an eqx.Module is a dataclass
    return tuple(STATIC if f.metadata.get("static", False) else DYNAMIC for f in fields)


def provisional_partition(obj: Any) -> Flatten:
    """The partition of a twin (also of one built by calling its class)."""
    cls = type(obj)
    spec = fields_of(cls)
    attrs = _object_getattribute(obj, "__dict__")
    children, static_values = [], []
    for name, declared_static in zip(spec.names, spec.declared_static):
        value = attrs.get(name, spec.defaults.get(name))
        (static_values if declared_static else children).append(value)
    layout = layout_for(cls, _equinox_kinds(cls))
    return tuple(children), make_aux(layout, tuple(static_values))


# Per type met by `_to_twin`: its layer class if it is a twin, True if it is a layer
# class to twin, False otherwise (arrays, numbers, functions: most calls).
_kinds_of_types: dict[type, type | bool] = {}


def _kind_of_type(cls: type) -> type | bool:
    kind = vars(cls).get(_TWIN_OF) or _twinned(cls)
    _kinds_of_types[cls] = kind
    return kind


def _to_twin(layer: Any, path: ContainerPath) -> Any:
    """`layer` as an instance of its twin, with the layers inside it twinned and its
    containers frozen; other objects as they are."""
    cls = type(layer)
    kind = _kinds_of_types.get(cls)
    if kind is None:
        kind = _kind_of_type(cls)
    if kind is False:
        return layer
    twin_of = None if kind is True else kind
    source = materialise(layer) if twin_of else _object_getattribute(layer, "__dict__")
    attrs = {
        name: freeze_and_twin(value, (*path, jtu.GetAttrKey(name)))
        for name, value in source.items()
    }
    if twin_of is not None and all(attrs[n] is v for n, v in source.items()):
        return layer  # a twin already, with nothing inside to change
    twin = _object_new(twin_class(twin_of or cls))
    _object_getattribute(twin, "__dict__").update(attrs)
    set_partition(twin, provisional_partition(twin))
    return twin


def freeze_and_twin(value: Any, path: ContainerPath) -> Any:
    """`freeze` that also replaces every `eqx.nn` layer reachable through built-in
    containers and layer fields by its twin."""
    return freeze(value, path, _to_twin)


def _restore(layer_cls: type, attrs: dict[str, Any]) -> Any:
    twin = _object_new(twin_class(layer_cls))
    _object_getattribute(twin, "__dict__").update(attrs)
    set_partition(twin, provisional_partition(twin))
    return twin


install_flatten_generator(
    is_twin_class,
    lambda cls: flatten_functions(
        cls, provisional_partition, fixed_kinds=_equinox_kinds(cls)
    ),
)
