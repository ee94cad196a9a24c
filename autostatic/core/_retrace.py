"""Retraces nobody asked for: a static number traced with many values of one field.

A Python float in a field not annotated as an array is static, so each new value
compiles anew (50 learning rates, 50 compiles), silently, where an `eqx.Module`'s
field would hold it as a traced leaf. (A new function object compiles anew under
Equinox's `filter_jit` too, and a suite of tests each passing its own function would
reach any count: functions are not counted.)

JAX unflattens a jitted function's arguments from tracers when, and only when, it
traces: so an AutoModule's unflatten sees every trace. It compares its aux data with
the last one of the same plan (by identity), which is all a step that reuses its
program pays; only a new aux is looked into, only its numbers, and only while staging
a program (`jax.jit`, not an eager `jax.grad` or `jax.vmap`, which compile nothing)
does it count the values of each static field, where the node's arrays have the
shapes and dtypes they had the last time (a sweep of model sizes retraces for its
shapes, whatever the number). After `after` traces that each brought a new value of
one field (8 by default) it warns once, naming `Class.field`, the values and the fix.
The blocks of one model that differ in a static number are one trace.
"""

import weakref
from collections.abc import Callable
from typing import Any, Final

import jax.tree_util as jtu

from .._compat import STAGING_TRACE, trace_state
from ._carriers import is_carried_class
from ._checks import warn_once
from ._fields import fields_of
from ._split import COUNTED_NUMBERS, static_value
from ._static import static_key
from ._ways import CHILD, ENTRY


class RetraceWarning(UserWarning):
    """A static value of an AutoModule field has been traced with many values.

    Silence it with `warnings.filterwarnings("ignore", category=RetraceWarning)`, or
    `autostatic.warn_on_retrace(None)`."""


# Several, yet above what a parametrised test suite traces one field with: a training
# loop whose step gets a new static learning rate each call reaches it in 8 steps.
DEFAULT_AFTER = 8
_after: int | None = DEFAULT_AFTER
_KEPT = 8  # values shown in a warning
_MOST_KEPT = 256  # values remembered per field, to tell a new one from a seen one
_generation = 0  # a new one per `warn_on_retrace`: each field may warn again


class _Seen:
    """The static values one field has been traced with."""

    __slots__ = ("keys", "shown", "traces", "last_trace", "last_shapes")

    def __init__(self) -> None:
        self.keys: set[Any] = set()  # `static_key` of each value
        self.shown: list[Any] = []  # the first `_KEPT` values
        self.traces = 0  # how many traces brought a new value to arrays shaped alike
        self.last_trace: weakref.ref[Any] | None = None
        self.last_shapes: tuple[Any, ...] | None = None  # of that trace's arrays


# Per class (held weakly: the counts never keep a class alive), per field, what it
# has been traced with.
_seen: "weakref.WeakKeyDictionary[type, dict[str, _Seen]]" = weakref.WeakKeyDictionary()


def warn_on_retrace(after: int | None = DEFAULT_AFTER) -> None:
    """Warn (`RetraceWarning`) when a static number of an AutoModule field
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


def note_new_aux(cls: type, aux: Any, children: Any) -> None:
    """Called while tracing by an unflatten whose aux holds static numbers and is
    not the last one its plan met: counts the values."""
    if _after is not None and type(trace_state.value) is STAGING_TRACE:
        _note(cls, aux, trace_state.value, _shapes(children))


def _shapes(children: Any) -> tuple[Any, ...]:
    """The shapes and dtypes of a node's arrays (tracers, while tracing)."""
    return tuple(
        (getattr(x, "shape", None), getattr(x, "dtype", None))
        for x in jtu.tree_leaves(children)
    )


# The type of the trace JAX runs under when nothing is being traced.
_NOT_TRACING: Final = type(trace_state.value)


def is_traced() -> bool:
    """Whether JAX is tracing now: an unflatten then makes a node of a trace."""
    return type(trace_state.value) is not _NOT_TRACING


def _note(cls: type, aux: Any, trace: Any, shapes: tuple[Any, ...]) -> None:
    plan = aux[0]
    declared = dict(zip(plan.names, fields_of(cls).declared_static))
    with_entries = [p for p in plan.parts if p != CHILD]  # in the entries' order
    for name, part, entry in zip(plan.entry_names, with_entries, aux[1:]):
        if part != ENTRY or declared[name]:
            continue
        value = static_value(entry)
        if type(value) in COUNTED_NUMBERS:
            _count(cls, name, value, trace, shapes, _message)


def note_held_numbers(cls: type, plan: Any, children: Any) -> None:
    """Called while tracing by the unflatten of a template: a Python number that is
    the child of a field annotated to hold arrays was held static by the caller, as
    `eqx.filter_jit` holds every non-array leaf, where `jax.jit` would trace it. Its
    values are counted as a static field's. (The exposed form, every field a child,
    holds numbers that are static in the model: not counted here.)"""
    if _after is None or plan.exposed or type(trace_state.value) is not STAGING_TRACE:
        return
    shapes = _shapes(children)
    array_fields = dict(zip(plan.names, fields_of(cls).array_fields))
    names = (name for name, part in zip(plan.names, plan.parts) if part != ENTRY)
    for name, child in zip(names, children):
        if type(child) in COUNTED_NUMBERS and array_fields[name]:
            _count(cls, name, child, trace_state.value, shapes, _held_message)


def _count(
    cls: type,
    name: str,
    value: Any,
    trace: Any,
    shapes: tuple[Any, ...],
    message: Callable[..., str],
) -> None:
    """Counts `value` of `cls.name` in `trace`, whose node's arrays are of `shapes`;
    warns when `after` traces have each brought a new one to arrays shaped alike."""
    fields = _seen.get(cls)
    if fields is None:
        fields = _seen.setdefault(cls, {})
    seen = fields.get(name)
    if seen is None:
        seen = fields.setdefault(name, _Seen())
    if _after is None or seen.traces >= _after:
        return  # warned already: nothing more to keep
    key = static_key(value)
    if key in seen.keys:
        return
    if len(seen.keys) < _MOST_KEPT:
        seen.keys.add(key)
    if len(seen.shown) < _KEPT:
        seen.shown.append(value)
    if seen.last_trace is None or seen.last_trace() is not trace:
        seen.last_trace = weakref.ref(trace)
        if seen.last_shapes in (None, shapes):
            seen.traces += 1
        seen.last_shapes = shapes
    if seen.traces >= _after:
        warn_once(
            ("retrace", str(_generation), cls.__qualname__, str(id(cls)), name),
            message(cls, name, len(seen.keys), seen.shown),
            RetraceWarning,
        )


def _listed(count: int, values: list[Any]) -> str:
    """The values shown, and how many more there were."""
    shown = ", ".join(map(repr, values[:_KEPT]))
    more = count - min(len(values), _KEPT)
    return f"{shown}, and {more} more" if more > 0 else shown


# The annotation that makes a Python number of each type a traced leaf.
_ARRAY_ANNOTATIONS: Final = {
    int: 'Int[ArrayLike, ""]',
    float: 'Float[ArrayLike, ""]',
    complex: 'Complex[ArrayLike, ""]',
}


def _held_message(cls: type, name: str, count: int, values: list[Any]) -> str:
    return (
        f"{cls.__qualname__}.{name} is annotated to hold arrays, yet has been traced "
        f"with {count} different Python numbers ({_listed(count, values)}) held "
        "static by the caller, as `eqx.filter_jit` holds every leaf that is no "
        "array: each new value compiles anew. Call through `jax.jit`, which traces "
        f"it, or store it as an array (`jnp.asarray({values[0]!r})`)."
    )


def _message(cls: type, name: str, count: int, values: list[Any]) -> str:
    kind = type(values[0])
    said = (
        f"{cls.__qualname__}.{name} has been traced with {count} different values "
        f"({_listed(count, values)}): it is a static Python {kind.__name__}, so each "
        "new value compiles anew. If it changes between calls, make it a traced "
    )
    if is_carried_class(cls):  # a held layer's: not the user's field
        return said + f"leaf: give the layer an array (`jnp.asarray({values[0]!r})`)."
    return said + (
        "leaf: annotate the field as an array (jaxtyping's "
        f"`{name}: {_ARRAY_ANNOTATIONS[kind]}`, or `{name}: {kind.__name__} | "
        f"jax.Array`), or store an array (`jnp.asarray({values[0]!r})`, or "
        f"`{name}: jax.Array = eqx.field(converter=jnp.asarray)`)."
    )
