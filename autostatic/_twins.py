"""Fast twins of the `eqx.nn` layers an AutoModule holds.

JAX flattens every node with the function registered for its type, and Equinox
registers each `eqx.Module` class with a generated flatten that reads the instance's
`__dict__` through `Module.__getattribute__` (Python-level) on every flatten. An
AutoModule's own flatten is one slot read, but a model of `eqx.nn.Linear` layers is
mostly Linear nodes, so it flattened as slowly as an `eqx.Module` (1.00x, 256 layers).

When an AutoModule freezes its fields, each `eqx.nn` layer in them is replaced by an
instance of the layer's *twin* (`_partition.freeze_and_twin`): a subclass created here
once per layer class (`isinstance(layer, eqx.nn.Linear)` holds; name, repr, methods
and `__init__` are the layer's) whose node is an AutoModule's: `(children, aux)` in a
slot, the partition decided from the values (fields marked `eqx.field(static=True)`
stay static), an unflatten that fills the attributes in, methods bound by descriptors.
Its key paths and array leaves are those of the original layer.

Only classes defined in `equinox.nn` are twinned, and not `StateIndex`, which Equinox
checks by exact type: a user's own `eqx.Module` class may have `__init_subclass__`
side effects or `type(x) is` checks that a subclass would break.
"""

import inspect
import threading
from typing import Any

import equinox as eqx

from ._bound_method import MethodDescriptor, wraps_as_method
from ._layout import is_automodule_class, materialise, Partitioned, prepare_class

_TWIN_OF = "_autostatic_twin_of"  # class attribute of a twin: its layer class
_twins: dict[type, type] = {}
_twins_lock = threading.Lock()
_object_getattribute = object.__getattribute__
_object_new = object.__new__


def is_twin_class(cls: type) -> bool:
    return _TWIN_OF in vars(cls)


def is_twin(x: Any) -> bool:
    return _TWIN_OF in vars(type(x))


def layer_of(twin_cls: type) -> type:
    """The layer class a twin class stands for."""
    return vars(twin_cls)[_TWIN_OF]


def is_twinned_class(cls: type) -> bool:
    """A layer class whose instances inside an AutoModule become twins."""
    return (
        cls.__module__.startswith("equinox.nn.")
        and issubclass(cls, eqx.Module)
        and not issubclass(cls, eqx.nn.StateIndex)
        and not is_automodule_class(cls)
        and not is_twin_class(cls)  # a twin already
    )


class _TwinBase(Partitioned):
    """The slot and the pickling that a twin adds to its layer class. (A twin's
    unflatten fills its attributes in at once, so it needs no `__getattr__`.)"""

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, ...]:
        # By the layer class: a twin class is made at run time, pickle cannot name it.
        # Imported here: `_partition` (which decides partitions) imports this module.
        from ._partition import restore_twin

        return (restore_twin, (layer_of(type(self)), dict(materialise(self))))


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
    # Equinox's metaclass makes the dataclass and registers it; `_partition` answers
    # its call for the flatten functions (claimed by `is_twin_class`).
    twin = type(cls)(cls.__name__, (cls, _TwinBase), namespace)
    prepare_class(twin, twin=True)
    return twin
