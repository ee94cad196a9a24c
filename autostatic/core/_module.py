"""`AutoModule`: an `eqx.Module` whose static/dynamic split is decided from values."""

import copy
import dataclasses
import functools
import inspect
from typing import Any, TYPE_CHECKING

import equinox as eqx
import jax.tree_util as jtu
import numpy as np
from typing_extensions import dataclass_transform

from .._compat import (
    assign_in_init,
    creating_subclass,
    currently_initialising,
    has_dataclass_init,
    install_flatten_generator,
    METHOD_IN_INIT_MESSAGE,
    ModuleMeta,
    skip_argument_walk,
    unset_field,
    WRAPPER_FIELD_NAMES,
)
from . import _fields, _node
from ._bound_method import BoundMethod, MethodDescriptor, same_leaves, wraps_as_method
from ._carriers import is_carried_class, is_carrier_class, layer_of
from ._checks import (
    check_acyclic,
    check_array_for_python_value,
    check_field,
    check_numpy_number,
)
from ._leaves import category, NODE, set_class_tests, stops
from ._static import JAX_FUNCTION_TYPES
from ._templates import restore_template, template_state


# Type checkers take a class built by a metaclass for a dataclass only when that
# metaclass itself carries `dataclass_transform` (pyright does not look through to
# Equinox's `_ModuleMeta`): so `Point(x=1.0, y=2)` is checked against the fields.
# Not `frozen_default=True`: a checker would then reject `self.x = ...` in a custom
# `__init__` (Equinox does not declare it either).
@dataclass_transform(field_specifiers=(dataclasses.field, eqx.field))
class _AutoModuleMeta(ModuleMeta):
    def __new__(
        mcs,
        name: str,
        bases: tuple[type, ...],
        namespace: dict[str, Any],
        **kwargs: Any,
    ) -> "_AutoModuleMeta":
        _fields.check_reserved_names(name, namespace)
        with creating_subclass(bases):
            cls = super().__new__(mcs, name, bases, namespace, **kwargs)
        skip_argument_walk(cls)
        _fields.prepare_class(cls)
        fields = set(_fields.fields_of(cls).names)
        # Methods of this class, and of non-AutoModule bases (e.g. an abstract
        # eqx.Module kept during a migration), are bound as pytree-and-hashable
        # `BoundMethod`s; AutoModule bases did this for their own already.
        own = [namespace]
        own += [
            vars(base)
            for base in cls.__mro__[1:]
            if not isinstance(base, _AutoModuleMeta)
        ]
        for attrs in own:
            for attr, value in attrs.items():
                if (
                    attr not in fields
                    and wraps_as_method(attr, value)
                    and inspect.getattr_static(cls, attr) is value
                ):
                    setattr(cls, attr, MethodDescriptor(value, attr))
        return cls

    def __call__(cls, *args: Any, **kwargs: Any):
        __tracebackhide__ = True
        if has_dataclass_init(cls):
            # Equinox flattens these arguments first, and JAX's flatten of a cyclic
            # list ends in a RecursionError that can leave the interpreter unusable.
            names = _fields.fields_of(cls).names
            for name, arg in (*zip(names, args), *kwargs.items()):
                check_acyclic(arg, cls, name)
        try:
            obj = super().__call__(*args, **kwargs)
        except TypeError as err:
            name = unset_field(err)
            if name is None:
                raise
            raise TypeError(f"{err} {_unset_hint(cls, name)}") from err
        _finish(obj)
        return obj


def _unset_hint(cls: type, name: str) -> str:
    field = cls.__dataclass_fields__.get(name)  # pyright: ignore[reportAttributeAccessIssue]  # a dataclass
    if field is not None and not field.init:
        return f"{cls.__qualname__}.{name} was never set: __post_init__ must assign it."
    hint = f"{cls.__qualname__}.{name} was never set: __init__ must assign self.{name}"
    if field is not None and field.default_factory is not dataclasses.MISSING:
        return (
            f"{hint} (its default_factory runs only in the dataclass's own __init__)."
        )
    return f"{hint} (or the field needs a default value)."


def _finish(obj: Any) -> None:
    """What ends construction: a field a custom `__init__` left unset holds its
    default (so that a flatten finds every field in the instance), the layers that an
    `is_leaf` callback saw as carriers are layers again, and every field is checked
    (`_checks`)."""
    cls = type(obj)
    spec = _fields.fields_of(cls)
    attrs = object.__getattribute__(obj, "__dict__")
    for name, declared_static, number, python in zip(
        spec.names, spec.declared_static, spec.number_fields, spec.python_fields
    ):
        if name not in attrs:
            value = _default(cls, name)
            if value is _NO_DEFAULT:
                continue
            attrs[name] = value
        value = attrs[name]
        if number and isinstance(value, np.generic):
            check_numpy_number(cls, name, value)
        elif python is not None:
            check_array_for_python_value(cls, name, value, python)
        if check_field(obj, name, value, declared_static):  # it holds carriers
            attrs[name] = jtu.tree_map(layer_of, value, is_leaf=stops)
    if len(attrs) > len(spec.names):  # Equinox's wrapper names, or a ClassVar set
        _refuse_class_level(cls, attrs)


def _refuse_class_level(cls: type, attrs: dict[str, Any]) -> None:
    """Refuses a `ClassVar` or `InitVar` that `__init__` set on the instance, as
    Equinox does: a flatten would drop it, so eager code and `jax.jit` would differ."""
    names = set(_fields.fields_of(cls).names)
    for name in attrs:
        if name in cls.__dataclass_fields__ and name not in names:  # pyright: ignore[reportAttributeAccessIssue]  # a dataclass
            raise dataclasses.FrozenInstanceError(
                f"{cls.__qualname__}.{name} is a ClassVar or an InitVar, not a field: "
                "an instance cannot hold it. Assign it to the class, or declare a field."
            )


_NO_DEFAULT: Any = object()


def _default(cls: type, name: str) -> Any:
    """What reading a field `__init__` left unset gives: a class attribute of that
    name that is no descriptor (a subclass's `config = [...]`), else none."""
    for klass in cls.__mro__:
        if name in vars(klass):
            value = vars(klass)[name]
            return _NO_DEFAULT if hasattr(type(value), "__get__") else value
    return _NO_DEFAULT


install_flatten_generator(
    lambda cls: isinstance(cls, _AutoModuleMeta), _node.flatten_functions
)


class AutoModule(eqx.Module, metaclass=_AutoModuleMeta):
    """An `eqx.Module` that decides by itself what is static.

    Write it exactly like an `eqx.Module`, without `eqx.field(static=True)`. Every
    flatten sorts the leaves its fields hold at that moment: arrays are pytree
    children, every other leaf is static aux data, split per leaf inside mixed
    containers. The attributes stay the values assigned (a list is a `list`, a layer
    an `eqx.nn` layer), so `self.layers = []` and `.append(...)` in `__init__`, or a
    container changed in place later, are what the next flatten sees. Plain
    `jax.jit`, `jax.grad` and `jax.vmap` accept it directly and its key paths are the
    natural ones (`.layers[0].weight`).

    What differs from `eqx.Module`:

    - A Python number is static, so a new value compiles anew (a `RetraceWarning`
      says so after 8 values of one field), unless the field is annotated to hold
      arrays (`n: Int[ArrayLike, ""]`, `lr: float | jax.Array`): there numbers (and
      `ShapeDtypeStruct`s) are leaves, as in an `eqx.Module`.
    - The instance is immutable after `__init__` (`autostatic.tree_at` makes copies).
    - Every instance is hashable, by its static data and the identities of its
      arrays (`lax.switch` hashes its branches); `==` is `eqx.tree_equal`, as in
      an `eqx.Module`.
    - `eqx.field(static=True)` on an array is an error; on anything else it is kept.

    Example:

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import autostatic as asx
    >>> class Scale(asx.AutoModule):
    ...     w: jax.Array
    ...     activation: object  # a function: static, no marker needed
    ...     def __call__(self, x):
    ...         return self.activation(self.w * x)
    >>> m = Scale(jnp.array([1.0, -2.0]), jax.nn.relu)
    >>> jax.tree_util.tree_leaves(m) == [m.w]
    True
    >>> jax.jit(lambda m, x: m(x))(m, 1.0).tolist()  # plain jax.jit
    [1.0, 0.0]

    ```
    """

    # Methods are bound by `MethodDescriptor`s installed per class, so Equinox's
    # Python-level `__getattribute__` (which wraps bound methods on every access) is
    # not needed; `object`'s own attribute lookup is several times faster. Hidden from
    # type checkers, which would take any attribute for known through it.
    if not TYPE_CHECKING:
        __getattribute__ = object.__getattribute__

    def __hash__(self) -> int:
        leaves, treedef = jtu.tree_flatten(self)
        return hash((treedef, tuple(map(id, leaves))))

    def __eq__(self, other: object) -> Any:
        """As `eqx.Module`'s: `eqx.tree_equal` (numeric: a bool array, traced under
        `jax.jit`), except that a module holding the very same array objects is a
        Python `True` without looking into them, as JAX's caches need: they look a
        module up by its hash (the identities of its arrays) and then compare it."""
        if type(other) is not type(self):
            return False
        if same_leaves(self, other):
            return True
        return eqx.tree_equal(self, other)

    # Hidden from type checkers, which would otherwise take every attribute for known
    # (reading one through `__getattr__`, assigning one through `__setattr__`).
    if not TYPE_CHECKING:

        def __setattr__(self, name: str, value: Any) -> None:
            if self in currently_initialising:
                if isinstance(value, BoundMethod) and value.__self__ is self:
                    raise ValueError(
                        f"{type(self).__qualname__}.{name}: {METHOD_IN_INIT_MESSAGE}"
                    )
                if name in self.__dataclass_fields__ or name in WRAPPER_FIELD_NAMES:
                    assign_in_init(self, name, value)
                    return
                raise dataclasses.FrozenInstanceError(
                    f"{type(self).__qualname__}.{name} is not a declared field. Declare "
                    f"every attribute in the class body, e.g. `{name}: Any` (an annotation "
                    "is enough; AutoModule works out whether it is static)."
                )
            if name == "__orig_class__":  # set by typing on `Module[T]()`; harmless
                object.__setattr__(self, name, value)
                return
            raise dataclasses.FrozenInstanceError(
                f"cannot assign to {type(self).__qualname__}.{name}: AutoModule instances "
                "are immutable after __init__. Make a modified copy with "
                f"autostatic.tree_at(lambda m: m.{name}, module, new_value)."
            )

    def __delattr__(self, name: str) -> None:
        raise dataclasses.FrozenInstanceError(
            f"cannot delete {type(self).__qualname__}.{name}: AutoModule instances are "
            "immutable."
        )

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        # Everything copied, as Equinox copies a module, but JAX's function objects
        # (`jax.nn.relu`, `jnp.tanh`), which `copy.deepcopy` makes anew and equal to
        # nothing: held static, they would give the copy another treedef
        # (`jax.tree.map(ema_update, copy.deepcopy(model), model)`).
        for function in _jax_functions(object.__getattribute__(self, "__dict__")):
            memo.setdefault(id(function), function)
        rebuild, arguments, *state = self.__reduce__()
        copied = rebuild(*copy.deepcopy(arguments, memo))
        if state:  # the class's own `__getstate__` / `__setstate__`
            _set_state(copied, copy.deepcopy(state[0], memo))
        return copied

    def __reduce__(self) -> tuple[Any, ...]:
        # For copy and pickle: the class and the attribute values, put back without
        # `__init__` (as Equinox's unflatten does), and for a template what it
        # flattens as: a copied filter spec or `eval_shape` tree keeps its leaves. A
        # class's own `__getstate__` / `__setstate__` make and take the values.
        template = template_state(self)
        extra = () if template is None else (template,)
        cls = type(self)
        own_state = getattr(cls, "__getstate__", None) is not _DEFAULT_GETSTATE
        if not own_state and not hasattr(cls, "__setstate__"):
            attrs = dict(object.__getattribute__(self, "__dict__"))
            return (_rebuilt, (cls, attrs, *extra))
        getter = getattr(self, "__getstate__", None)  # none before Python 3.11
        state = getter() if getter is not None else dict(vars(self))
        return (_rebuilt, (cls, {}, *extra), state)


# `object.__getstate__` (Python 3.11 on), which a class's own replaces.
_DEFAULT_GETSTATE: Any = getattr(object, "__getstate__", None)


def _set_state(obj: Any, state: Any) -> None:
    """What `copy` and `pickle` do with a reduced object's state."""
    if hasattr(obj, "__setstate__"):
        obj.__setstate__(state)
    else:
        object.__getattribute__(obj, "__dict__").update(state)


def _jax_functions(attrs: dict[str, Any]) -> list[Any]:
    """JAX's function objects among a module's attribute values: in containers, in
    its modules and layers, and in `functools.partial`s."""
    found, pending = [], [list(attrs.values())]
    while pending:
        for leaf in jtu.tree_leaves(pending.pop(), is_leaf=_is_module):
            if type(leaf) in JAX_FUNCTION_TYPES:
                found.append(leaf)
            elif type(leaf) is functools.partial:
                pending.append([leaf.func, leaf.args, leaf.keywords])
            elif _is_module(leaf):
                pending.append(list(object.__getattribute__(leaf, "__dict__").values()))
    return found


def _is_module(x: Any) -> bool:
    return category(x) == NODE


def _rebuilt(cls: type, attrs: dict[str, Any], template: Any = None) -> Any:
    obj = object.__new__(cls)
    object.__getattribute__(obj, "__dict__").update(attrs)
    if template is not None:
        restore_template(obj, template)
    return obj


set_class_tests(
    node=lambda cls: isinstance(cls, _AutoModuleMeta),
    layer=is_carried_class,
    carrier=is_carrier_class,
)
