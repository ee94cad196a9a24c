"""Static values as the aux data holds them: compared exactly, and shared.

A static leaf goes into the aux as it is (`hold`), unless `==` alone would not compare
it as the jit cache must: a float or complex zero or NaN is held bit for bit
(`ExactFloat`), a jaxpr as a program (`SameProgram`), a dtype as the dtype it names
(`SameDtype`), a `functools.partial` as the call it makes (`SamePartial`),
`eqx.nn.Shared`'s placeholder as one shared instance (`SHARED_NODE`), a leaf
whose `==` runs in Python behind a comparison that explains a failure (`Compared`), a
set as a frozen copy (`SetValue`). `natural` gives the value back.
"""

import copy
import dataclasses
import functools
import math
import operator
import struct
import types
from collections.abc import Iterable
from typing import Any, Final

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax.extend.core import ClosedJaxpr, Jaxpr
from jax.extend.linear_util import WrappedFun

from .._compat import SharedNode

# The types of the `types` module (a function's, a builtin's, ...), which pickle
# cannot name: the aux data pickles them by name.
_UNNAMED_TYPES: Final = {
    f"types.{name}": value
    for name, value in vars(types).items()
    if isinstance(value, type) and not name.startswith("_")
}
_NAMES_OF_TYPES: Final = {value: name for name, value in _UNNAMED_TYPES.items()}


def named_types(kinds: tuple[type, ...]) -> tuple[Any, ...]:
    """`kinds` as pickle can write them: those of the `types` module by name."""
    return tuple(_NAMES_OF_TYPES.get(kind, kind) for kind in kinds)


def types_named(named: tuple[Any, ...]) -> tuple[type, ...]:
    """The types `named_types` gave."""
    return tuple(_UNNAMED_TYPES[x] if type(x) is str else x for x in named)


# JAX's function objects, equal by identity: a custom derivative rule's function
# (`jax.nn.relu`) and a jitted one (`jnp.tanh`).
JAX_FUNCTION_TYPES: Final = (jax.custom_jvp, jax.custom_vjp, type(jax.jit(abs)))


def static_equal(a: Any, b: Any) -> bool:
    """Static leaves as the jit cache compares them: the same type, then floats bit
    for bit and jaxprs as programs (`_exact_form`), anything else with `==`."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    exact = _exact_form(a)
    if exact is not a:
        return exact == _exact_form(b)
    return bool(a == b)


def static_key(x: Any) -> tuple[type, Any]:
    """A hashable key of a hashable static leaf, equal for leaves `static_equal`
    equates."""
    return (type(x), _exact_form(x))


class SetValue(frozenset):
    """A set or frozenset held as a static leaf: a frozen copy, so that mutating the
    attribute's set cannot change a treedef JAX has cached, equal to another only
    where its items are by the static-value rule, as a list's are (`{1}` is not
    `{1.0}`: a set's own `==` would share one trace between them). Reads back as
    its `kind`."""

    __slots__ = ("kind", "_key")

    def __new__(cls, items: Iterable[Any], kind: type = set) -> "SetValue":
        self = super().__new__(cls, items)
        self.kind = kind
        self._key = (kind, frozenset(map(static_key, self)))
        return self

    def __eq__(self, other: object) -> bool:
        return type(other) is SetValue and self._key == other._key

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self._key)


def needs_exact_float(x: float | complex) -> bool:
    """A zero (`0.0 == -0.0`, yet `1 / x` differs) or NaN (never `==` itself), or a
    complex number with a zero or NaN part (`-0+2j == 2j`): a static value that `==`
    cannot compare exactly."""
    if type(x) is complex:
        return x.real == 0 or x.imag == 0 or x != x
    return x == 0 or x != x


class ExactFloat:
    """A static float or complex zero or NaN, compared bit for bit: `-0.0` does not
    share a compiled program with `0.0`, and a NaN reuses its own."""

    __slots__ = ("value", "_bits")

    def __init__(self, value: float | complex):
        self.value = value
        parts = (value.real, value.imag) if type(value) is complex else (value,)
        self._bits = (type(value), struct.pack(f"<{len(parts)}d", *parts))

    def __eq__(self, other: object) -> bool:
        return type(other) is ExactFloat and self._bits == other._bits

    def __hash__(self) -> int:
        return hash(self._bits)

    def __repr__(self) -> str:
        return f"ExactFloat({self.value!r})"


class SameDtype:
    """A static dtype specifier (`np.dtype("float32")`, `np.float32`, `jnp.float32`),
    equal to another that names the same dtype: `==` between them says so, and JAX
    traces them alike (`jnp.zeros(n, dtype)`, `x.astype(dtype)`), so an `eqx.Module`
    gives equal treedefs for them."""

    __slots__ = ("value", "_dtype")

    def __init__(self, value: Any):
        self.value = value
        self._dtype = np.dtype(value)

    def __eq__(self, other: object) -> bool:
        return type(other) is SameDtype and self._dtype == other._dtype

    def __hash__(self) -> int:
        return hash(self._dtype)

    def __repr__(self) -> str:
        return f"SameDtype({self.value!r})"


class SamePartial:
    """A static `functools.partial` (an activation `partial(jax.nn.leaky_relu,
    negative_slope=0.1)`): equal to the same partial, and to another of the same
    function whose arguments hold no array and are equal by the static-value rule
    (types kept: `1` is not `1.0`), as they make the same calls. A partial's own `==`
    is identity, so two models built alike would otherwise have unequal treedefs,
    where an `eqx.Module` holds the partial as a leaf. The arguments are looked at
    only where two partials meet: a flatten makes a `SamePartial` and nothing else."""

    __slots__ = ("value",)

    def __init__(self, value: functools.partial):
        self.value = value

    def __eq__(self, other: object) -> bool:
        if type(other) is not SamePartial:
            return False
        return self.value is other.value or _call_of(self.value) == _call_of(
            other.value
        )

    def __hash__(self) -> int:
        return hash(type(self.value.func))

    def __repr__(self) -> str:
        return f"SamePartial({self.value!r})"


def _call_of(value: functools.partial) -> tuple[Any, ...]:
    """The call a partial makes, held as static leaves are; the partial itself where
    an argument holds an array (compared elementwise)."""
    leaves, treedef = jtu.tree_flatten((value.args, value.keywords))
    if any(isinstance(x, (np.ndarray, jax.Array)) for x in leaves):  # tracers too
        return (value,)
    held = tuple(map(hold, leaves))
    return (hold(value.func), treedef, tuple(map(type, held)), held)


def is_dtype(value: Any) -> bool:
    """A numpy dtype, or a numpy or JAX scalar type (`np.float32`, `jnp.float32`)."""
    if type(value) is type:
        return issubclass(value, np.generic)
    return isinstance(value, _DTYPE_OBJECTS)


# `jnp.float32` and its like are instances of JAX's scalar metaclass.
_DTYPE_OBJECTS: Final = (np.dtype, type(jnp.float32))


class Compared:
    """A static leaf whose type's `==` runs in Python (and may raise): JAX compares
    aux data on jit cache lookups, so a failing `==` is reported with its type and
    the fix rather than as the user's own error from inside the jit call."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(other) is not Compared:
            return False
        return _compared(self.value, other.value)

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return f"Compared({self.value!r})"


def _compared(a: Any, b: Any) -> bool:
    """`static_equal`, a failure explained: JAX compares aux data on jit lookups."""
    try:
        return static_equal(a, b)
    except Exception as err:
        raise TypeError(
            f"static values {a!r} and {b!r} of type {type(a).__name__} cannot "
            f"be compared with == ({type(err).__name__}: {err}). JAX compares "
            "static values to decide whether a compiled function can be reused. "
            "Give the type a boolean __eq__, or store the data as a jax/numpy "
            "array so that it becomes dynamic."
        ) from err


class Snapshot:
    """A static leaf that has no hash, as values changed in place have none (a
    `deque`, a `bytearray`, an `array.array`, a subclass of `list` or `dict` that JAX
    takes for a leaf, a dataclass that is not frozen): held as a copy of what it is
    at the flatten, so that a value changed after a trace is another static value
    (as a list's items are, looked into), where the value itself in the aux would
    equal itself and reuse the stale trace. Read back as a copy, that changing it
    cannot change the treedef that holds it."""

    __slots__ = ("kind", "_copy")

    def __init__(self, value: Any, copied: Any):
        self.kind = type(value)
        self._copy = copied

    @property
    def value(self) -> Any:
        return copy.deepcopy(self._copy)

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(other) is not Snapshot:
            return False
        return _compared(self._copy, other._copy)

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return f"Snapshot({self._copy!r})"


def _snapshot(leaf: Any) -> Any:
    """A `Snapshot` of `leaf`; where it cannot be copied, a `Compared` (a change made
    in place to it is then not seen)."""
    try:
        copied = copy.deepcopy(leaf)
    except Exception:
        return Compared(leaf)
    return Snapshot(leaf, copied)


class SameProgram:
    """A static `jax.core.Jaxpr` (a closure-converted function's program, as
    `eqx.filter_closure_convert` holds it): equal to another that is the same program,
    printed alike and calling the same functions of its own. A jaxpr has no `==` of
    its own, so each trace of the same function would otherwise give a new static
    value and a new treedef (optimistix and lineax compare such trees across traces,
    in `custom_jvp` and `lax.cond`). The printed program names a custom derivative
    rule or a callback without telling two apart, so those are compared by identity
    (`program_functions`)."""

    __slots__ = ("value", "_text", "_functions")

    def __init__(self, value: Any):
        self.value = value
        self._text: str | None = None
        self._functions: tuple[Any, ...] | None = None

    def text(self) -> str:
        if self._text is None:
            self._text = str(self.value)
        return self._text

    def functions(self) -> tuple[Any, ...]:
        if self._functions is None:
            self._functions = program_functions(self.value)
        return self._functions

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(other) is not SameProgram:
            return False
        if self.value is other.value:
            return True
        if self.text() != other.text():
            return False
        mine, theirs = self.functions(), other.functions()
        return len(mine) == len(theirs) and all(map(operator.is_, mine, theirs))

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return f"SameProgram({self.value!r})"


# Where JAX and Equinox keep the functions a program's equations refer to for their
# own workings (a thunk or closure made for one trace): looked into, not compared.
_LIBRARIES: Final = ("jax", "jaxlib", "equinox")
# How many objects `program_functions` looks at, at most: the closures it looks
# into can reach far.
_MOST_LOOKED_AT: Final = 10_000


def program_functions(jaxpr: Any) -> tuple[Any, ...]:
    """The functions outside JAX and Equinox that the equations of `jaxpr` (and of
    the jaxprs in their parameters) refer to, in the order met: custom derivative
    rules, callback functions. Found through the parameters' containers, partials,
    `lu.WrappedFun`s, dataclasses, and the closures of JAX's own functions."""
    found: list[Any] = []
    seen: set[int] = set()
    stack: list[Any] = [jaxpr]
    while stack and len(seen) < _MOST_LOOKED_AT:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        stack.extend(reversed(_parts(x, found)))
    return tuple(found)


def _parts(x: Any, found: list[Any]) -> list[Any]:
    """What `program_functions` looks at inside `x`; a function of the user's is
    put into `found` instead."""
    if isinstance(x, Jaxpr):
        return [v for eqn in x.eqns for v in eqn.params.values()]
    if isinstance(x, ClosedJaxpr):
        return [x.jaxpr]
    if isinstance(x, (tuple, list)):
        return list(x)
    if isinstance(x, dict):
        return list(x.values())
    if isinstance(x, WrappedFun):
        return [x.f, *(args for _, args in x.transforms)]
    if isinstance(x, functools.partial):
        return [x.func, *x.args, *x.keywords.values()]
    if isinstance(x, types.MethodType):
        return [x.__func__]
    if isinstance(x, types.FunctionType):
        if (x.__module__ or "").split(".")[0] not in _LIBRARIES:
            found.append(x)
            return []
        return [_contents(c) for c in x.__closure__ or ()]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return [getattr(x, f.name, None) for f in dataclasses.fields(x)]
    return []


def _contents(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # a cell not yet assigned
        return None


def _exact_form(leaf: Any) -> Any:
    """The leaf as held where `==` alone would not compare it exactly: a float or
    complex zero or NaN as an `ExactFloat`, a jaxpr as a `SameProgram`, a
    `SharedNode` as `SHARED_NODE`; else itself."""
    kind = type(leaf)
    if kind is float and leaf == 0:  # a dropout rate of 0.0, in every layer
        return _POSITIVE_ZERO if math.copysign(1.0, leaf) > 0 else _NEGATIVE_ZERO
    if (kind is float or kind is complex) and needs_exact_float(leaf):
        return ExactFloat(leaf)
    if kind is Jaxpr:
        return SameProgram(leaf)
    if kind is SharedNode:
        return SHARED_NODE
    return leaf


# The held forms of the two float zeros, made once.
_POSITIVE_ZERO: Final = ExactFloat(0.0)
_NEGATIVE_ZERO: Final = ExactFloat(-0.0)


def _compares_in_python(value: Any) -> bool:
    return isinstance(getattr(type(value), "__eq__", None), types.FunctionType)


def hold(leaf: Any) -> Any:
    """What the aux holds for a static leaf: the leaf itself, an exact form
    (`ExactFloat`, `SameProgram`, `SHARED_NODE`), a `SameDtype`, a `SamePartial`, a
    frozen copy of a set, or a `Compared` for a leaf compared in Python."""
    if type(leaf) is set or type(leaf) is frozenset:
        return SetValue(leaf, type(leaf))
    if type(leaf).__hash__ is None:
        return _snapshot(leaf)
    exact = _exact_form(leaf)
    if exact is not leaf:
        return exact
    if is_dtype(leaf):
        return SameDtype(leaf)
    if type(leaf) is functools.partial:
        return SamePartial(leaf)
    if _compares_in_python(leaf):
        return Compared(leaf)
    return leaf


def held_as_themselves(types: Iterable[type]) -> bool:
    """Whether `hold` gives every leaf of these types as it is, whatever its value
    (a string, an int, a function; not a float, which is held exactly if zero)."""
    for kind in types:
        known = _held_as_itself.get(kind)
        if known is None:
            if len(_held_as_itself) >= _MOST_TYPES:
                _held_as_itself.clear()
            known = _held_as_itself[kind] = _holds_as_itself(kind)
        if not known:
            return False
    return True


def _holds_as_itself(kind: type) -> bool:
    if kind in _HELD_BY_VALUE or issubclass(kind, _DTYPE_OBJECTS):
        return False
    if kind.__hash__ is None:  # a `Snapshot`
        return False
    return not isinstance(getattr(kind, "__eq__", None), types.FunctionType)


# The leaf types `hold` may wrap, by the value: floats and complex numbers (zeros,
# NaNs), sets, programs, partials, classes (a numpy scalar type is a dtype), and
# `eqx.nn.Shared`'s placeholder.
_HELD_BY_VALUE: Final = frozenset(
    {float, complex, set, frozenset, Jaxpr, functools.partial, type, SharedNode}
)
# `eqx.nn.Shared` puts a new `SharedNode()`, equal only to itself, where each tied
# node was: held as this one, so that two models built alike have equal treedefs (an
# `eqx.Module` holds it as a leaf, which `eqx.filter` makes `None`).
SHARED_NODE: Final = SharedNode()
# Per type met, whether `hold` gives its values as they are; bounded as the leaf
# categories are.
_held_as_itself: dict[type, bool] = {}
_MOST_TYPES: Final = 4096


# The types of static leaves that hold a value other than themselves.
HOLDER_TYPES: Final = frozenset(
    {SetValue, Compared, SameProgram, ExactFloat, SameDtype, SamePartial, Snapshot}
)
# The types whose values `hold` never wraps: an entry of one is the value itself.
RAW_ENTRY_TYPES: Final = frozenset({int, bool, str, bytes, type(None)})


def natural(leaf: Any) -> Any:
    """The value a held static leaf stands for (`hold` undone)."""
    kind = type(leaf)
    if kind is SetValue:
        return leaf.kind(leaf)
    return leaf.value if kind in HOLDER_TYPES else leaf
