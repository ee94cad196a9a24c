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

import functools
import operator
import types
import weakref
from collections.abc import Callable
from typing import Any

import jax.tree_util as jtu

_object_getattribute = object.__getattribute__


class _DocOfFunction:
    """`BoundMethod.__doc__`: the function's docstring on an instance (what `help`,
    `inspect.getdoc` and doctest read), the class's own on the class (`type` passes
    `None` as the instance when it reads a class's `__doc__`)."""

    def __init__(self, class_doc: str | None):
        self.class_doc = class_doc

    def __get__(self, instance: Any, owner: type | None = None) -> str | None:
        if instance is None:
            return self.class_doc
        return getattr(_object_getattribute(instance, "__func__"), "__doc__", None)


class _ModuleOfFunction(str):
    """`BoundMethod.__module__`: the function's module on an instance (what
    `inspect.getmodule` and pydoc read). On the class, `type` returns this object
    itself without calling `__get__`, so it is the class's module name, a `str`
    (pickle and `repr` of the class need one)."""

    def __reduce__(self):
        # Pickled as the `str` it equals: pickle writes a class's module name
        # with `save` (protocols 4, 5), and `STACK_GLOBAL` takes a `str` only.
        return (str, (str(self),))

    def __get__(self, instance: Any, owner: type | None = None) -> str:
        if instance is None:
            return str(self)
        func = _object_getattribute(instance, "__func__")
        return getattr(func, "__module__", None) or str(self)


def same_leaves(a: Any, b: Any) -> bool:
    """`a` and `b` are one pytree: equal treedefs (static data included) and the very
    same leaf objects. What a trace cached for `a` may be reused for, decided
    without looking into an array, so never a tracer."""
    if a is b:
        return True
    leaves, treedef = jtu.tree_flatten(a)
    other_leaves, other_treedef = jtu.tree_flatten(b)
    return treedef == other_treedef and all(map(operator.is_, leaves, other_leaves))


class BoundMethod:
    # (The class docstring is set below: `__doc__` here is the function's docstring.)

    __slots__ = ("__func__", "__self__", "__weakref__")
    __module__ = _ModuleOfFunction(__name__)

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
            and same_leaves(self.__self__, other.__self__)
        )

    def __get__(self, instance: Any, owner: type | None = None) -> "BoundMethod":
        # Itself, as a bound method stored on a class behaves; having `__get__` makes
        # it a routine to `inspect.isroutine`, so `help(model.f)`, pydoc and autodoc
        # tools document it as the method it is.
        return self

    @property
    def __wrapped__(self) -> Callable[..., Any]:
        # Python's own bound method: `inspect.signature(model.f)` has no `self`.
        return types.MethodType(self.__func__, self.__self__)

    def __getattr__(self, name: str) -> Any:
        # __name__, __qualname__, __annotations__, ... of the function. Not its
        # __signature__ (it has `self`): `inspect.signature` then takes `__wrapped__`.
        if (
            name.startswith("__")
            and name.endswith("__")
            and name not in ("__func__", "__signature__")
        ):
            return getattr(_object_getattribute(self, "__func__"), name)
        raise AttributeError(name)

    def __repr__(self) -> str:
        name = getattr(self.__func__, "__qualname__", repr(self.__func__))
        return f"<bound method {name} of {type(self.__self__).__qualname__}>"


BoundMethod.__doc__ = _DocOfFunction(  # pyright: ignore[reportAttributeAccessIssue]  # a descriptor: the function's docstring on instances
    """`module.method`: calls `__func__(__self__, ...)`; a pytree with child `__self__`.

    Its key paths are `.__self__.<field>`, as for Equinox's bound methods, so
    `jax.grad` with respect to `module.method` gives gradients for the module. To
    tools (`inspect`, `help`, doctest) it looks like the method: `__doc__`,
    `__module__`, `__name__`, `__qualname__` are the function's, and
    `inspect.signature` gives the signature without `self`.
    """
)
_NOT_WRAPPED = (
    staticmethod,
    classmethod,
    property,
    type,
    types.BuiltinFunctionType,
    BoundMethod,
)


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
    instance's (cached) `BoundMethod`, `Class.name` the function itself.

    It carries the function's `__module__`, `__name__`, `__qualname__`, `__doc__` and
    `__wrapped__` (as `functools.update_wrapper` sets them), and is a method
    descriptor to `inspect.isroutine`: doctest, which walks a class's `__dict__`,
    finds the method's examples and attributes them to the function's module.
    """

    __slots__ = ("func", "name", "bound", "__dict__")

    def __init__(self, func: Callable[..., Any], name: str):
        self.func = func
        self.name = name
        self.bound: weakref.WeakValueDictionary[int, BoundMethod] = (
            weakref.WeakValueDictionary()
        )
        # What `functools.update_wrapper` does (typed for callables only).
        for attr in functools.WRAPPER_ASSIGNMENTS:
            if hasattr(func, attr):
                setattr(self, attr, getattr(func, attr))
        self.__dict__.update(getattr(func, "__dict__", {}))
        self.__wrapped__ = func

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

    def __reduce__(self) -> tuple[Any, ...]:
        # A class pickled by value (cloudpickle) carries its descriptors; the
        # bound methods remembered weakly are no part of one.
        return (MethodDescriptor, (self.func, self.name))

    def __repr__(self) -> str:
        return f"<method descriptor {getattr(self, '__qualname__', self.name)}>"

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
