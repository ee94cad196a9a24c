"""Checks on static values, and their warnings (each shown once per place).

A static value is compared by `==` and baked into compiled code. A jax array inside it
that the pytree machinery cannot see (a closure cell, a `functools.partial` argument, a
jitted function's wrapped callable, an attribute of an opaque object) becomes a
compile-time constant: it receives no gradient, is not updated by optimisers, and is
copied into every compiled program. A numpy array there is a host constant, as JAX
takes one closed over by a function (diffrax's Butcher tableaus): no warning. A value
that can be neither hashed nor compared breaks JAX's compilation cache, which compares
static data with `==`.
"""

import contextlib
import functools as ft
import os
import sys
import types
import warnings
from typing import Any

import equinox as eqx
import jax
import jax.tree_util as jtu
from jax.core import Tracer

from .. import _compat
from .._identity import WeakIdentitySet
from ._containers import container_items

_MAX_DEPTH = 4
_ATOMS = (int, float, complex, bool, str, bytes, type(None), type, types.ModuleType)
# Objects already found free of arrays: functions and callables dominate static values.
_clean = WeakIdentitySet()


def find_hidden_array(value: Any) -> str | None:
    """Describes where a concrete jax array hides inside `value`, or returns None if
    none does. A tracer is not reported: a module made inside a traced function
    (a solver's state, a library's closure) holds that trace's values, and one that
    escapes the trace fails in JAX itself."""
    if value in _clean:
        return None
    tracers: list[Any] = []
    where = _search(value, 0, set(), tracers)
    if where is None and not tracers:
        _clean.add(value)
    return where


def _search(value: Any, depth: int, seen: set[int], tracers: list[Any]) -> str | None:
    """Where the first concrete array inside `value` is (tracers met go to
    `tracers`), or None."""
    if isinstance(value, _ATOMS) or id(value) in seen or depth > _MAX_DEPTH:
        return None
    if isinstance(value, Tracer):
        tracers.append(value)
        return None
    if isinstance(value, jax.Array):
        return "an array"
    seen.add(id(value))
    for label, child in _reachable_values(value):
        found = _search(child, depth + 1, seen, tracers)
        if found is not None:
            return f"{found} in {label}"
    return None


def _reachable_values(value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, ft.partial):
        return [
            ("the function of a functools.partial", value.func),
            *(
                (f"argument {i} of a functools.partial", a)
                for i, a in enumerate(value.args)
            ),
            *(
                (f"keyword {k!r} of a functools.partial", a)
                for k, a in value.keywords.items()
            ),
        ]
    if isinstance(value, types.FunctionType):
        name = value.__qualname__
        cells = zip(value.__code__.co_freevars, value.__closure__ or ())
        out = []
        for var, cell in cells:
            with contextlib.suppress(ValueError):  # an empty cell
                out.append((f"closure variable {var!r} of {name}", cell.cell_contents))
        out += [(f"a default argument of {name}", d) for d in value.__defaults__ or ()]
        out += [
            (f"default {k!r} of {name}", d)
            for k, d in (value.__kwdefaults__ or {}).items()
        ]
        return out
    if _compat.has_unread_closure(value):
        return []  # its live values are leaves of the tree beside it
    if isinstance(value, types.MethodType):
        return [
            ("the object of a bound method", value.__self__),
            ("a method", value.__func__),
        ]
    # The built-in containers JAX walks; sets and subclasses of the containers,
    # leaves to JAX, are searched all the same.
    items = container_items(value)
    if items is None and isinstance(value, (list, tuple, set, frozenset)):
        items = list(enumerate(value))
    elif items is None and isinstance(value, dict):
        items = list(value.items())
    if items is not None:
        if isinstance(value, dict):
            return [(f"key {k!r}", v) for k, v in items]
        return [(f"element {i}", v) for i, v in items]
    if isinstance(value, eqx.Module):
        leaves = jtu.tree_leaves(value)
        return [(f"a leaf of {type(value).__qualname__}", leaf) for leaf in leaves]
    out = []
    wrapped = getattr(value, "__wrapped__", None)
    if wrapped is not None:
        out.append((f"the function wrapped by {type(value).__qualname__}", wrapped))
    attributes = getattr(value, "__dict__", None)
    if isinstance(attributes, dict):
        out += [
            (f"attribute {k!r} of a {type(value).__qualname__}", v)
            for k, v in attributes.items()
            if k != "__wrapped__"
        ]
    return out


_warned: set[tuple[str, ...]] = set()


# Frames in these folders are skipped, so a warning points at the user's line.
_LIBRARY_FOLDERS = tuple(
    os.path.dirname(module.__file__ or "") + os.sep for module in (eqx, jax)
) + (os.path.dirname(os.path.dirname(__file__)) + os.sep,)


def _user_stacklevel() -> int:
    """The `stacklevel` of the innermost caller outside autostatic, Equinox and JAX."""
    frame = sys._getframe(2)  # the caller of `warn_once`
    level = 2
    while frame is not None and frame.f_code.co_filename.startswith(_LIBRARY_FOLDERS):
        frame = frame.f_back
        level += 1
    return level


def warn_once(
    key: tuple[str, ...], message: str, category: type[Warning] = UserWarning
) -> None:
    """Warns once per `key` (class, attribute and cause) for the whole process,
    pointing at the user's code."""
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(message, category, stacklevel=_user_stacklevel())


def is_uncomparable(value: Any) -> bool:
    """Neither hashable nor comparable with a `==` that gives a bool."""
    try:
        hash(value)
        return False
    except TypeError:
        pass
    try:
        return not isinstance(value == value, bool)
    except Exception:
        return True
