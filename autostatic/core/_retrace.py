"""Retraces nobody asked for: a static number or a fresh function traced with many
values of one field.

A Python float in a field not annotated as an array is static, so each new value
compiles anew (50 learning rates, 50 compiles), silently. JAX unflattens a jitted
function's arguments from tracers when, and only when, it traces: so an AutoModule's
unflatten sees every trace. It compares its aux data with the last one of the same
layout (by identity, then in C), which is all a step that reuses its program pays;
only a new aux is looked into, only its numbers and functions, and only while tracing
does it count the values of each static field. After `after` traces that each brought
a new value of one field (8 by default) it warns once, naming `Class.field`, the values
and the fix. The blocks of one model that differ in a static number are one trace.
"""

import types
import weakref
from typing import Any

import jax.tree_util as jtu
from equinox import is_array
from jax.core import Tracer
from jax.extend.core import find_top_trace

from ._fields import is_partitioned_class
from ._layout import (
    Aux,
    entry_value,
    has_stored_partition,
    partition_of,
    STATIC,
)
from ._static_checks import warn_once
from ._static_values import ExactFloat, static_key


class RetraceWarning(UserWarning):
    """A static value of an AutoModule field has been traced with many values.

    Silence it with `warnings.filterwarnings("ignore", category=RetraceWarning)`, or
    `autostatic.warn_on_retrace(None)`."""


# Several, yet above what a parametrised test suite traces one field with: a training
# loop whose step gets a new static learning rate each call reaches it in 8 steps.
DEFAULT_AFTER = 8
_after: int | None = DEFAULT_AFTER
_KEPT = 8  # values shown in a warning
_generation = 0  # a new one per `warn_on_retrace`: each field may warn again


class _Seen:
    """The static values one field has been traced with."""

    __slots__ = ("keys", "shown", "traces", "last_trace")

    def __init__(self) -> None:
        self.keys: set[Any] = set()  # `static_key` of each value
        self.shown: list[Any] = []  # the first `_KEPT` values
        self.traces = 0  # how many traces brought a new value
        self.last_trace: weakref.ref[Any] | None = None


# (class, field) -> what it has been traced with.
_seen: dict[tuple[type, str], _Seen] = {}
# The types of the static values counted: numbers and plain functions.
_COUNTED_TYPES = frozenset({int, float, complex, types.FunctionType})
# The types of the aux entries that hold them (an exact float is held as
# `ExactFloat`): an unflatten calls `note_new_aux` only when one of these entries of
# its layout changed.
NOTED_ENTRY_TYPES = _COUNTED_TYPES | {ExactFloat}


def warn_on_retrace(after: int | None = DEFAULT_AFTER) -> None:
    """Warn (`RetraceWarning`) when a static number or function of an AutoModule field
    has brought a new value to `after` traces; `None` turns the check off.

    **Arguments:**

    - `after`: how many traces with a new value of one field make a warning (at
      least 2).
    """
    global _after, _generation
    if after is not None and after < 2:
        raise ValueError(f"after={after}: give at least 2, or None to turn it off")
    _after = after
    _generation += 1
    _seen.clear()


def note_new_aux(cls: type, aux: Aux, children: tuple[Any, ...]) -> None:
    """Called by an AutoModule's unflatten when a static number or function in its aux
    is not what the last one of its layout held: while tracing, counts the values."""
    if _after is not None and _is_traced(children):
        _note(cls, aux, find_top_trace(()))


def _is_traced(children: tuple[Any, ...]) -> bool:
    # While tracing, JAX unflattens from tracers only: the first leaf tells, and is
    # found without flattening the rest (blocks that differ in a static name each
    # bring a new aux to every unflatten).
    first = _first_leaf(children)
    if first is not None and is_array(first):
        return isinstance(first, Tracer)
    return any(isinstance(x, Tracer) for x in jtu.tree_leaves(children))


def _first_leaf(tree: Any) -> Any:
    """The first leaf of `tree` through lists, tuples and the stored children of
    AutoModules and carriers; None if there is none or another node comes first."""
    while True:
        kind = type(tree)
        if kind is list or kind is tuple:
            for item in tree:
                if item is not None:
                    tree = item
                    break
            else:
                return None
        elif is_partitioned_class(kind) and has_stored_partition(tree):
            tree = partition_of(tree)[0]
        else:
            return tree


def _note(cls: type, aux: Aux, trace: Any) -> None:
    layout = aux.layout
    for name, kind, entry in zip(layout.entry_names, layout.entry_kinds, aux.entries):
        if kind != STATIC:
            continue
        value = entry_value(entry)
        if type(value) not in _COUNTED_TYPES:
            continue
        seen = _seen.get((cls, name))
        if seen is None:
            seen = _seen.setdefault((cls, name), _Seen())
        if _after is not None and seen.traces >= _after:
            continue  # warned already: nothing more to keep
        key = static_key(value)
        if key in seen.keys:
            continue
        seen.keys.add(key)
        if len(seen.shown) < _KEPT:
            seen.shown.append(value)
        if seen.last_trace is None or seen.last_trace() is not trace:
            seen.last_trace = weakref.ref(trace)
            seen.traces += 1
        if _after is not None and seen.traces >= _after:
            warn_once(
                ("retrace", str(_generation), cls.__qualname__, str(id(cls)), name),
                _message(cls, name, len(seen.keys), seen.shown),
                RetraceWarning,
            )


def _message(cls: type, name: str, count: int, values: list[Any]) -> str:
    where = f"{cls.__qualname__}.{name}"
    if type(values[0]) is types.FunctionType:
        return (
            f"{where} has been traced with {count} different function objects "
            f"({values[0].__qualname__}, ...): each new one compiles anew. Define the "
            "function once (not a lambda or closure made per call), or hold its "
            "changing data as arrays in the module."
        )
    shown = ", ".join(map(repr, values[:_KEPT]))
    return (
        f"{where} has been traced with {count} different values ({shown}): it "
        "is a static Python number, so each new value compiles anew. If it changes "
        f"between calls, annotate the field as an array (`{name}: float | jax.Array`) "
        f"or convert it (`{name}: jax.Array = eqx.field(converter=jnp.asarray)`), "
        "so that it is a traced leaf."
    )
