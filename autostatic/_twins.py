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
the layer. The attribute keeps the layer itself, and a twin made by unflattening
becomes a layer of the layer's own class when the attribute is read
(`_layout.real_layer`): `type(model.linear) is eqx.nn.Linear`.

Only classes defined in `equinox.nn` are twinned, and not `StateIndex`, which Equinox
checks by exact type: a user's own `eqx.Module` class may have `__init_subclass__`
side effects or `type(x) is` checks that a subclass would break.
"""

import inspect
import threading
from typing import Any

import equinox as eqx

from ._bound_method import MethodDescriptor, wraps_as_method
from ._layout import (
    is_automodule_class,
    prepare_class,
    real_layer,
    register_twin_class,
    TWIN_OF as _TWIN_OF,
    TwinBase,
)

_twins: dict[type, type] = {}
_twins_lock = threading.Lock()
_object_getattribute = object.__getattribute__
_object_new = object.__new__


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
