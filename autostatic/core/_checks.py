"""Checks of a module's field values when construction ends, and their warnings
(each shown once per place).

Refused, naming the key path: a container that contains itself (a pytree cannot
hold a cycle, and JAX's flatten of one ends in a RecursionError), a field holding its
module itself, a numpy array of a dtype JAX cannot hold, an array in a field marked
`eqx.field(static=True)`.

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
import itertools
import operator
import os
import sys
import types
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Final

import equinox as eqx
import jax
import jax.tree_util as jtu
import numpy as np
from jax.core import Tracer

from .. import _compat
from .._identity import WeakIdentitySet
from ._leaves import (
    ARRAY,
    BUILTIN_CONTAINERS,
    CARRIER,
    category,
    CONTAINER,
    is_array,
    item_categories,
    LAYER,
    NDARRAY,
    NODE,
    NONE,
    NUMBER,
    SHAPE,
    stops,
)

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
    items = _items(value)
    if items is None and isinstance(value, _SEQUENCE_LEAVES):
        items = list(enumerate(value))
    elif items is None and isinstance(value, _MAPPING_LEAVES):
        items = list(value.items())
    if items is not None:
        if isinstance(value, _MAPPING_LEAVES):
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


# Containers searched though JAX takes them as leaves: subclasses of list, tuple and
# dict, sets, deques, and a dict's read-only proxy (`types.MappingProxyType`).
_SEQUENCE_LEAVES: Final = (list, tuple, set, frozenset, deque)
_MAPPING_LEAVES: Final = (dict, types.MappingProxyType)


_warned: set[tuple[str, ...]] = set()


# Frames in these folders are skipped, so a warning points at the user's line.
_LIBRARY_FOLDERS = tuple(
    os.path.dirname(module.__file__ or "") + os.sep for module in (eqx, jax)
) + (
    os.path.dirname(os.path.dirname(__file__)) + os.sep,
    "<autostatic ",  # the generated code (`_generated`)
)


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


def _items(value: Any) -> list[tuple[Any, Any]] | None:
    """`(key, item)` pairs of a built-in container JAX flattens as a node, else None."""
    if not _walked(type(value)):
        return None
    if isinstance(value, tuple | list):  # a namedtuple too
        return list(enumerate(value))
    return list(value.items())


def _walked(kind: type) -> bool:
    """Whether a value of type `kind` is a built-in container JAX flattens as a node
    (a list, tuple, namedtuple or dict): told by type, as `isinstance` would ask an
    `eqx.Module` for its `__class__` through its Python `__getattribute__`."""
    return kind in BUILTIN_CONTAINERS or (
        issubclass(kind, tuple) and hasattr(kind, "_fields")
    )


def format_path(where: str, keys: tuple[Any, ...]) -> str:
    return where + "".join(f"[{key!r}]" for key in keys)


class ContainerCycleError(TypeError):
    """A list, dict or tuple that contains itself: a pytree cannot hold a cycle."""


def static_leaves(value: Any, where: str) -> list[tuple[tuple[Any, ...], Any]]:
    """Every leaf of `value` reached through built-in containers, with its keys:
    nodes and other registered pytrees are leaves here. Iterative (a nest is limited
    by JAX's own flatten, not Python's recursion limit); a container met again on
    its own path raises `ContainerCycleError` naming where."""
    if not _walked(type(value)):  # a leaf itself: most fields
        return [((), value)]
    out: list[tuple[tuple[Any, ...], Any]] = []
    stack: list[tuple[tuple[Any, ...], Any, bool]] = [((), value, False)]
    on_path: set[int] = set()
    while stack:
        keys, item, leaving = stack.pop()
        if leaving:
            on_path.discard(id(item))
            continue
        items = _items(item)
        if items is None:
            out.append((keys, item))
            continue
        if id(item) in on_path:
            raise ContainerCycleError(
                f"{format_path(where, keys)} is a container that contains itself (a "
                "cycle). A pytree cannot hold a cycle: store the data without the "
                "self-reference."
            )
        on_path.add(id(item))
        stack.append((keys, item, True))
        stack.extend(((*keys, k), x, False) for k, x in reversed(items))
    return out


def _plain_items(value: Any) -> set[int] | None:
    """The item categories of a list or tuple of arrays, numbers, `None`s, modules
    or layers (no container: nothing to look into, fast for 20,000); else None."""
    if type(value) not in (list, tuple):
        return None
    cats = item_categories(value)
    return cats if _FINE.issuperset(cats) else None


def check_acyclic(value: Any, cls: type, name: str) -> None:
    """Refuses an argument for the field `name` of `cls` that contains itself."""
    if _plain_items(value) is not None:
        return
    if _walked(type(value)):
        static_leaves(value, f"{cls.__qualname__}.{name}")


def check_field(module: Any, name: str, value: Any, declared_static: bool) -> bool:
    """Refuses or warns of what the field `name` of `module` holds (see the module
    docstring). A JAX-transformed callable is warned of inside containers only:
    Equinox's own `__setattr__` warns of one assigned to a field. Returns whether
    the value holds a carrier (handed out to an `is_leaf` callback)."""
    kind = category(value)
    if kind in _NOTHING_TO_CHECK or (kind == ARRAY and not declared_static):
        return False
    cls = type(module)
    where = f"{cls.__qualname__}.{name}"
    if (cats := _plain_items(value)) is not None:
        if declared_static and not cats.isdisjoint((ARRAY, NDARRAY)):
            _refuse_static_array(where, value)
        if NODE in cats and any(map(operator.is_, value, itertools.repeat(module))):
            raise _contains_itself(cls, where)
        return CARRIER in cats
    carriers = False
    for keys, leaf in static_leaves(value, where):
        cat = category(leaf)
        if leaf is module:
            raise _contains_itself(cls, where)
        carriers = carriers or cat == CARRIER
        if cat in (NUMBER, NONE, NODE, LAYER, CARRIER, SHAPE):
            continue
        if cat == CONTAINER:  # a user's eqx.Module: its leaves, by their own paths
            _check_node(module, where, keys, leaf, declared_static)
        elif is_array(leaf):
            if declared_static:
                _refuse_static_array(where, value)
        elif cat == NDARRAY:
            _refuse_ndarray(format_path(where, keys), leaf)
        else:
            _check_static(cls, where, keys, leaf, bool(keys))
    return carriers


# Field values that are leaves with nothing to refuse or warn of, wherever they are.
_NOTHING_TO_CHECK: Final = frozenset({NONE, NUMBER, SHAPE})


def check_numpy_number(cls: type, name: str, value: Any) -> None:
    """Warns of a numpy scalar in a field annotated to hold a Python number: it is an
    array, so a traced leaf, where the annotation says a size or a flag."""
    if not is_array(value):
        return
    where = f"{cls.__qualname__}.{name}"
    python = type(value.item()).__name__
    warn_once(
        ("numpy number", cls.__qualname__, str(id(cls)), name),
        f"{where} is annotated as a Python number but holds a numpy "
        f"{value.dtype} scalar ({value!r}), which is an array: a traced leaf under "
        f"jax.jit, so using it as a size (jnp.zeros(self.{name})) fails there. If it "
        f"is a size or another hyperparameter, store a Python number "
        f"({python}(...), or math.prod for a product); if it should be traced, "
        "annotate the field as an array.",
    )


def check_array_for_python_value(
    cls: type, name: str, value: Any, annotation: str
) -> None:
    """Warns of an array in a field annotated as a Python value (`sizes: list`,
    `n: int`): an array is always a traced leaf, so one used as a size or shape
    fails under `jax.jit`, with JAX's error naming no field."""
    if not isinstance(value, (jax.Array, np.ndarray)) or isinstance(value, Tracer):
        return
    where = f"{cls.__qualname__}.{name}"
    warn_once(
        ("array as a Python value", cls.__qualname__, str(id(cls)), name),
        f"{where} is annotated `{annotation}` but holds an array "
        f"({type(value).__name__} of shape {value.shape}): an array is always a "
        "traced leaf under jax.jit, so using it as a size or a shape fails there "
        "(a ConcretizationTypeError). If these are sizes or other hyperparameters, "
        f"store Python values ({_as_python(value)}); if it should be traced, "
        "annotate the field as an array.",
    )


def _as_python(value: Any) -> str:
    if value.size <= 16:
        return f"`{value.tolist()!r}`, its `.tolist()`"
    return "its `.tolist()`"


# Item categories with nothing to check in a flat list (but a module holding itself,
# or an array marked static).
_FINE = frozenset({ARRAY, NONE, NUMBER, NODE, LAYER, CARRIER, SHAPE})


def _contains_itself(cls: type, where: str) -> TypeError:
    return TypeError(
        f"{where} holds the {cls.__qualname__} instance itself: a module is a tree "
        "of its fields and cannot contain itself. Store the data it needs instead, "
        "or pass the module as an argument where it is used."
    )


def _check_node(
    module: Any,
    where: str,
    keys: tuple[Any, ...],
    node: Any,
    declared_static: bool,
) -> None:
    for path, leaf in jtu.tree_flatten_with_path(node, is_leaf=stops)[0]:
        here = format_path(where, keys) + jtu.keystr(path)
        if is_array(leaf):
            if declared_static:
                _refuse_static_array(where, node)
        elif category(leaf) == NDARRAY:
            _refuse_ndarray(here, leaf)
        elif category(leaf) not in (NUMBER, NONE, NODE, LAYER, CARRIER, SHAPE):
            _check_static(type(module), here, (), leaf, True)


def _refuse_static_array(where: str, value: Any) -> None:
    n = sum(map(is_array, jtu.tree_leaves(value)))
    raise TypeError(
        f"{where} is marked eqx.field(static=True) but holds {n} array(s). AutoModule "
        "never makes an array static: remove static=True (AutoModule makes the "
        "non-array parts static by itself), or store hashable Python data there "
        "instead."
    )


def _refuse_ndarray(where: str, leaf: Any) -> None:
    raise TypeError(
        f"{where} is a numpy array of dtype {leaf.dtype}, which JAX can neither trace "
        "nor store. Convert it to a numeric dtype, or keep its items in a list or "
        "tuple (static): e.g. `tuple(x.tolist())`."
    )


# Who is told of the problems found in a class, instead of a warning: a rebase tells
# whoever runs a library rebased once per class, in its summary, so that a suite
# run with warnings as errors is not failed by code its runner did not port.
ProblemSink = Callable[[type, str], bool]  # True: taken, no warning
_problem_sink: ProblemSink | None = None


def send_problems_to(sink: ProblemSink | None) -> None:
    """Sends the problems `check_field` finds to `sink` (None: warnings again)."""
    global _problem_sink
    _problem_sink = sink


def _check_static(
    cls: type, field: str, keys: tuple[Any, ...], leaf: Any, transformed: bool
) -> None:
    """Warns of a static leaf (of `field`, at `keys` inside it) that hides an array,
    cannot be compared, or is an iterator; and, as Equinox does, of a JAX-transformed
    callable (where Equinox's own `__setattr__` does not: inside a container)."""
    if type(leaf) in _PLAIN_STATIC:
        return
    if transformed:
        _compat.warn_if_transformed(cls, leaf)
    problem = _static_problem(leaf)
    if problem is None:
        return
    where = format_path(field, keys)
    if _problem_sink is not None and _problem_sink(cls, f"{where} {problem}"):
        return
    warn_once((where, problem), f"{where} {problem}")


# Static leaves of these types are fine as they are: nothing to warn of (numbers and
# `None` do not get here).
_PLAIN_STATIC: Final = frozenset({str, bytes})


def _static_problem(value: Any) -> str | None:
    """What is wrong with `value` as a static leaf, as the end of a sentence."""
    if isinstance(value, Iterator):
        return (
            f"is an iterator ({type(value).__qualname__}), kept as a static value: "
            "the first loop over it consumes it, and every later one sees it empty. "
            "Store a list or tuple of its items instead (e.g. `list(...)`)."
        )
    hidden = find_hidden_array(value)
    if hidden is not None:
        return (
            f"holds {hidden}, where AutoModule cannot see it, so it is part of a "
            "static value: it will be baked into compiled code as a constant, get no "
            "gradient, and a new one retraces. Store the array as an attribute (or in "
            "a list/dict/tuple/Module attribute), or use eqx.Partial / "
            "jax.tree_util.Partial instead of functools.partial or a closure."
        )
    if is_uncomparable(value):
        return (
            f"is a static value of type {type(value).__qualname__} that can be neither "
            "hashed nor compared with a boolean ==. jax.jit compares static values to "
            "reuse compiled code, and will fail on it. Give the type a boolean __eq__, "
            "or store its data as arrays."
        )
    return None
