"""Which fields are annotated to hold arrays, and which to hold Python numbers.

Values alone cannot tell a size (`hidden = 32`, static) from the first value of loop
state (`num_steps = 0`, which a `lax.while_loop` body replaces by an array, so it must
be a leaf, as in an `eqx.Module`). Annotations can: a field whose annotation admits an
array (`jax.Array`, `np.ndarray`, `jax.typing.ArrayLike`, jaxtyping's
`Int[ArrayLike, ""]`, its `PyTree` bare or of `Any`, a union or `PyTree[...]` with
one of them, a module class, or a type variable not bound to other types)
holds array values, so Python numbers and `jax.ShapeDtypeStruct`s in it stand for
arrays (or, for a module class, for a subtree of them) and are leaves.
An `int`, `float`, `Any`-annotated or unannotated field keeps them static. A numpy
scalar is an array wherever it is (`eqx.is_array`), so one in a field annotated `int`
(`hidden = np.prod(shape)`, ported from a field Equinox marked static) is warned of.
"""

import re
import sys
import types
import typing
from typing import Any, Final

import equinox as eqx
import jax
import numpy as np
from jaxtyping import PyTree

# What a string annotation that cannot be evaluated (a name imported only for type
# checkers) is read by: array types by their usual names.
_ARRAY_WORDS: Final = re.compile(
    r"\b(Array|ArrayLike|ndarray|Scalar\w*|\w+ScalarLike|Shaped|Float|Int|UInt|Bool"
    r"|Complex|Real|Inexact|Num|Integer|Key)\b"
)


def array_fields(cls: type, names: tuple[str, ...]) -> tuple[bool, ...]:
    """Per field `names` of the dataclass `cls`, whether its annotation admits an
    array."""
    declared = cls.__dataclass_fields__  # pyright: ignore[reportAttributeAccessIssue]  # a dataclass
    return tuple(_admits_array(_resolve(cls, declared[n].type)) for n in names)


def number_fields(cls: type, names: tuple[str, ...]) -> tuple[bool, ...]:
    """Per field `names` of the dataclass `cls`, whether its annotation admits only
    Python numbers (`int`, `float | None`, ...)."""
    declared = cls.__dataclass_fields__  # pyright: ignore[reportAttributeAccessIssue]  # a dataclass
    return tuple(_only_numbers(_resolve(cls, declared[n].type)) for n in names)


_NUMBER_TYPES: Final = (bool, int, float, complex)
# What a field annotated as a Python value (no array admitted) may name.
_PYTHON_TYPES: Final = (*_NUMBER_TYPES, str, list, tuple, dict, set, frozenset)


def python_fields(cls: type, names: tuple[str, ...]) -> tuple[str | None, ...]:
    """Per field `names` of the dataclass `cls`, its annotation's text where it names
    only Python values (`int`, `list`, `tuple[int, ...]`, `dict[str, float] | None`):
    an array there is no size or flag; else None."""
    declared = cls.__dataclass_fields__  # pyright: ignore[reportAttributeAccessIssue]  # a dataclass
    out = []
    for name in names:
        annotation = _resolve(cls, declared[name].type)
        out.append(_text(annotation) if _only_python(annotation) else None)
    return tuple(out)


def _only_python(annotation: Any, depth: int = 0) -> bool:
    if depth > 8:
        return False
    if annotation is type(None):
        return True
    if isinstance(annotation, type):
        return annotation in _PYTHON_TYPES
    origin = typing.get_origin(annotation)
    if origin is typing.Union or isinstance(annotation, types.UnionType):
        return all(_only_python(a, depth + 1) for a in typing.get_args(annotation))
    if origin in _PYTHON_TYPES:
        return all(
            a is Ellipsis or _only_python(a, depth + 1)
            for a in typing.get_args(annotation)
        )
    return False


def _text(annotation: Any) -> str:
    return annotation.__name__ if isinstance(annotation, type) else str(annotation)


def _only_numbers(annotation: Any) -> bool:
    if annotation in _NUMBER_TYPES:
        return True
    if typing.get_origin(annotation) is typing.Union or isinstance(
        annotation, types.UnionType
    ):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return bool(args) and all(a in _NUMBER_TYPES for a in args)
    return False


def _resolve(cls: type, annotation: Any) -> Any:
    """The annotation as an object; a string that cannot be evaluated stays a string."""
    if isinstance(annotation, typing.ForwardRef):
        annotation = annotation.__forward_arg__
    if not isinstance(annotation, str):
        return annotation
    module = sys.modules.get(cls.__module__)
    namespace = dict(vars(module)) if module is not None else {}
    try:
        return eval(annotation, namespace, dict(vars(cls)))
    except Exception:
        return annotation


def _admits_array(annotation: Any, depth: int = 0) -> bool:
    if depth > 8:
        return False
    if isinstance(annotation, str):
        return _ARRAY_WORDS.search(annotation) is not None
    if isinstance(annotation, type):
        if issubclass(annotation, (jax.Array, np.ndarray, np.generic)):
            return True
        # A module class: a number there stands for a subtree of arrays (an `in_axes`
        # prefix `Wrap(0)`, a filter spec `Wrap(True)`), never for a size.
        if issubclass(annotation, eqx.Module):
            return True
        # jaxtyping's `Float[Array, "n"]`, and its `PyTree[leaf type]`.
        if hasattr(annotation, "array_type") and hasattr(annotation, "dtypes"):
            return True
        leaftype = getattr(annotation, "leaftype", None)
        if leaftype is not None:
            return leaftype is Any or _admits_array(leaftype, depth + 1)
        # jaxtyping's bare `PyTree`, any tree: a number there is a leaf, as a
        # library's axis tree (`out_axes=Result(None, 0)`) needs.
        return annotation is PyTree
    if isinstance(annotation, typing.TypeVar):
        # A generic class's slot for its user's data (diffrax's controller state,
        # optimistix's `Y`, `Aux` and solver states): unbound, it admits an array.
        if annotation.__bound__ is not None:
            return _admits_array(annotation.__bound__, depth + 1)
        constraints = annotation.__constraints__
        return not constraints or any(_admits_array(c, depth + 1) for c in constraints)
    origin = typing.get_origin(annotation)
    if origin is typing.ClassVar:
        return False
    if origin is typing.Annotated:
        return _admits_array(typing.get_args(annotation)[0], depth + 1)
    if origin is typing.Union or isinstance(annotation, types.UnionType):
        return any(_admits_array(a, depth + 1) for a in typing.get_args(annotation))
    if origin is not None:  # `list[Array]`, `dict[str, ArrayLike]`, ...
        return any(
            _admits_array(a, depth + 1)
            for a in typing.get_args(annotation)
            if a is not Ellipsis
        )
    return False
