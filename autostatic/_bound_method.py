"""Bound methods of AutoModules: pytrees that are also hashable, for `lax.switch`.

`lax.switch`, `lax.cond`, `jax.checkpoint` and friends cache their traces in a
`weakref_lru_cache` keyed on the callable, so the callable is hashed and compared.
Equinox's bound methods hash their module's field values, which fails on arrays
(`unhashable type: 'ArrayImpl'`, or `DynamicJaxprTracer` under a transform).

Here a bound method hashes and compares by its function and its module, and a module
by its static data and the *identity* of its array leaves (`AutoModule.__hash__`):
never a stale trace for another module's arrays, never an error on tracers, and, as
each instance hands out the same bound method object while it lives, no retrace when the
same module's method is used again while its bound method (or the list of branches)
is kept.
"""

import types
import weakref
from collections.abc import Callable
from typing import Any

import jax.tree_util as jtu

_object_getattribute = object.__getattribute__
_NOT_WRAPPED = (staticmethod, classmethod, property, type, types.BuiltinFunctionType)


class BoundMethod:
    """`module.method`: calls `__func__(__self__, ...)`; a pytree with child `__self__`.

    Its key paths are `.__self__.<field>`, as for Equinox's bound methods, so
    `jax.grad` with respect to `module.method` gives gradients for the module.
    """

    __slots__ = ("__func__", "__self__", "__weakref__")

    def __init__(self, func: Callable[..., Any], module: Any):
        self.__func__ = func
        self.__self__ = module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        return self.__func__(self.__self__, *args, **kwargs)

    def __hash__(self) -> int:
        return hash((BoundMethod, self.__func__, self.__self__))

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is BoundMethod
            and self.__func__ == other.__func__
            and self.__self__ == other.__self__
        )

    @property
    def __wrapped__(self) -> Callable[..., Any]:
        return types.MethodType(self.__func__, self.__self__)

    def __getattr__(self, name: str) -> Any:
        # __name__, __qualname__, __doc__, __module__, ... of the function.
        if name.startswith("__") and name.endswith("__") and name != "__func__":
            return getattr(_object_getattribute(self, "__func__"), name)
        raise AttributeError(name)

    def __repr__(self) -> str:
        name = getattr(self.__func__, "__qualname__", repr(self.__func__))
        return f"<bound method {name} of {type(self.__self__).__qualname__}>"


def _flatten_with_keys(method: BoundMethod):
    return ((jtu.GetAttrKey("__self__"), method.__self__),), method.__func__


jtu.register_pytree_with_keys(
    BoundMethod,
    _flatten_with_keys,
    lambda func, children: BoundMethod(func, *children),
    flatten_func=lambda method: ((method.__self__,), method.__func__),
)


class MethodDescriptor:
    """Replaces a method in an AutoModule class body; `instance.name` gives the
    instance's (cached) `BoundMethod`, `Class.name` the function itself."""

    __slots__ = ("func", "name", "bound")

    def __init__(self, func: Callable[..., Any], name: str):
        self.func = func
        self.name = name
        self.bound: weakref.WeakValueDictionary[int, BoundMethod] = (
            weakref.WeakValueDictionary()
        )

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self.func
        # Each instance's bound method is remembered *weakly*: `m.f is m.f` while the
        # first one is alive (so a kept list of `lax.switch` branches hits JAX's trace
        # cache), without a module -> method -> module cycle that would keep the
        # module's arrays alive until the next cyclic garbage collection. Keyed by
        # `id`, since modules hash by value: while the entry lives, its method holds
        # the instance, so the id cannot be reused. Per descriptor, since a parent's
        # `f` reached through `super()` is another method.
        key = id(instance)
        method = self.bound.get(key)
        if method is None:
            method = BoundMethod(self.func, instance)
            self.bound[key] = method
        return method

    @property
    def __wrapped__(self) -> Callable[..., Any]:
        return self.func

    @property
    def __isabstractmethod__(self) -> bool:
        return getattr(self.func, "__isabstractmethod__", False)


def _is_magic(name: str) -> bool:
    return (name.startswith("__") and name.endswith("__")) or name == "_abc_impl"


def wraps_as_method(name: str, value: Any) -> bool:
    """Which class attributes become `MethodDescriptor`s: non-magic functions and
    other callables that bind like functions (`eqx.filter_jit`/`jax.jit` methods)."""
    if _is_magic(name) or isinstance(value, _NOT_WRAPPED):
        return False
    return isinstance(value, types.FunctionType) or (
        callable(value) and hasattr(type(value), "__get__")
    )
