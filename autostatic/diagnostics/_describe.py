"""Values as a user would write them: functions and classes by the names they are
imported by (`jax.nn.relu`), partials by their parts, arrays by their abstract value,
anything else by a short repr."""

import functools as ft
import inspect
import sys
import warnings
from typing import Any

import jax

from ..core._leaves import is_dynamic_leaf

_REPR_WIDTH = 60


def short_repr(value: Any) -> str:
    text = repr(value).replace("\n", " ")
    return text if len(text) <= _REPR_WIDTH else text[: _REPR_WIDTH - 3] + "..."


def aval_text(x: Any) -> str:
    if isinstance(x, jax.ShapeDtypeStruct):
        weak = "~" if getattr(x, "weak_type", False) else ""
        return f"{weak}{x.dtype}{list(x.shape)}"
    return str(jax.typeof(x))


_NOT_FOUND = object()


def _lookup(module_name: str, qualname: str) -> Any:
    """`module_name.qualname` among the modules imported already, or `_NOT_FOUND`;
    a deprecated alias counts as not found, so it is never suggested."""
    found: Any = sys.modules.get(module_name, _NOT_FOUND)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for part in qualname.split("."):
            try:
                found = getattr(found, part, _NOT_FOUND)
            except Exception:  # a module's lazy `__getattr__` may raise anything
                return _NOT_FOUND
    deprecated = any(issubclass(w.category, DeprecationWarning) for w in caught)
    return _NOT_FOUND if deprecated else found


def _public_modules(module: str) -> list[str]:
    """Modules a user would import `module`'s names from, nearest first:
    `jax._src.nn.functions` gives `jax.nn.functions`, `jax.nn`, `jax`."""
    public = [part for part in module.split(".") if not part.startswith("_")]
    return [".".join(public[:n]) for n in range(len(public), 0, -1)]


def _public_name(value: Any, module: str, qualname: str) -> str | None:
    """Where `value` itself is reachable from a public module, nearest first. The bare
    name is tried too, as some classes carry a qualname of where they are implemented
    (`jax.Array` has `jaxlib._jax.Array`)."""
    names = dict.fromkeys((qualname, qualname.rpartition(".")[2]))
    for candidate in _public_modules(module):
        for name in names:
            if _lookup(candidate, name) is value:
                return _dotted(candidate, name)
    return None


def _dotted(module: str, qualname: str) -> str:
    # Names in a script or among the builtins are written bare.
    return qualname if module in ("__main__", "builtins") else f"{module}.{qualname}"


def _local_name(module: str, qualname: str) -> str:
    """A lambda or a function defined inside another one, which no import reaches:
    `<lambda> in my_module.make_model`."""
    outer, _, inner = qualname.rpartition(".<locals>.")
    return f"{inner} in {_dotted(module, outer) if outer else module}"


def _identity(value: Any) -> tuple[str, str] | None:
    """`(module, qualname)` of a function-like value or of what it wraps (custom_jvp,
    custom_vjp and jit objects carry their function's; other wrappers may not)."""
    candidates = (value, getattr(value, "__wrapped__", None))
    for candidate in filter(lambda c: c is not None, candidates):
        qualname = getattr(candidate, "__qualname__", None) or getattr(
            candidate, "__name__", None
        )
        module = getattr(candidate, "__module__", None)
        if isinstance(qualname, str) and isinstance(module, str):
            return module, qualname
    return None


def _callable_name(value: Any) -> str | None:
    """A function, builtin, class or function wrapper by the name a user would write:
    its public import path if `value` itself is reachable there (`jax.nn.relu`, not
    `jax._src.nn.functions.relu`), else where it is defined. A jitted function that is
    not itself importable shows as `jit(...)` of what it wraps."""
    if inspect.ismethod(value) or not callable(value):
        return None  # a bound method's repr already names its function and object
    identity = _identity(value)
    if identity is None:
        return None
    module, qualname = identity
    if "<" in qualname:  # <lambda>, <locals>: not importable
        name = _local_name(module, qualname)
    else:
        public = _public_name(value, module, qualname)
        if public is not None:
            return public
        name = _dotted(module, qualname)
    wrapped = getattr(value, "__wrapped__", None)
    if wrapped is not None and hasattr(value, "lower"):  # a `jax.jit` object
        return f"jit({describe(wrapped)})"
    return name


def _partial_name(value: ft.partial) -> str:
    arguments = [_describe_argument(a) for a in value.args] + [
        f"{k}={_describe_argument(v)}" for k, v in value.keywords.items()
    ]
    text = f"partial({', '.join([describe(value.func), *arguments])})"
    return text if len(text) <= _REPR_WIDTH else text[: _REPR_WIDTH - 3] + "..."


def _describe_argument(value: Any) -> str:
    return aval_text(value) if is_dynamic_leaf(value) else describe(value)


def describe(value: Any) -> str:
    """A non-array value as a user would write it: functions and classes by their
    importable names, partials by their parts, anything else by a short repr."""
    try:
        if isinstance(value, ft.partial):
            return _partial_name(value)
        name = _callable_name(value)
    except Exception:  # odd attributes on a user's object must not break a diagnostic
        name = None
    return short_repr(value) if name is None else name
