"""Making the partition visible: what is static, and why a jitted function retraced.

`explain` lists every value of a tree by key path with its kind. `retrace_reasons`
compares two argument trees the way `jax.jit`'s cache does (the treedef with its static
data compared by `==`, then each leaf's shape, dtype, weak type and sharding) and names
what differs by key path. `logged_jit` runs that comparison only when a function is
traced again, so it costs nothing while the cache hits.
"""

import dataclasses
import functools as ft
import html
import inspect
import logging
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from ._layout import static_equal
from ._partition import expose, is_dynamic_leaf

logger = logging.getLogger("autostatic")

_REPR_WIDTH = 60


def _short_repr(value: Any) -> str:
    text = repr(value).replace("\n", " ")
    return text if len(text) <= _REPR_WIDTH else text[: _REPR_WIDTH - 3] + "..."


def _aval(x: Any) -> str:
    if isinstance(x, jax.ShapeDtypeStruct):
        weak = "~" if getattr(x, "weak_type", False) else ""
        return f"{weak}{x.dtype}{list(x.shape)}"
    return str(jax.typeof(x))


def _canonical(dtype: Any) -> Any:
    # Extended dtypes (PRNG keys) have no numpy dtype and are never canonicalised.
    if jnp.issubdtype(dtype, jax.dtypes.extended):
        return dtype
    return np.dtype(jax.dtypes.canonicalize_dtype(dtype))


@dataclasses.dataclass(frozen=True)
class Row:
    """One value of a tree: its key path, its kind and a short description."""

    path: str
    kind: str  # "dynamic", "static", or "leaf" (a non-array pytree leaf)
    type: str
    detail: str


@dataclasses.dataclass(frozen=True)
class Explanation:
    """The rows of `explain(tree)`; `str()` gives a table, notebooks an HTML table."""

    rows: tuple[Row, ...]

    def __str__(self) -> str:
        header = Row("path", "kind", "type", "value")
        rows = (header, *self.rows)
        widths = [
            max(len(getattr(r, f)) for r in rows) for f in ("path", "kind", "type")
        ]
        lines = [
            f"{r.path:<{widths[0]}}  {r.kind:<{widths[1]}}  {r.type:<{widths[2]}}  {r.detail}"
            for r in rows
        ]
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        cells = "".join(
            "<tr>"
            + "".join(
                f"<td>{html.escape(v)}</td>" for v in (r.path, r.kind, r.type, r.detail)
            )
            + "</tr>"
            for r in self.rows
        )
        return (
            "<table><thead><tr><th>path</th><th>kind</th><th>type</th><th>value</th>"
            f"</tr></thead><tbody>{cells}</tbody></table>"
        )


def explain(tree: Any) -> Explanation:
    """Every value in `tree`, one row per key path: dynamic or static, type, and
    shape/dtype for arrays or a short repr for static values.

    `leaf` marks a non-array leaf outside any AutoModule's control (e.g. in an
    `eqx.Module` field): plain `jax.jit` would reject it.
    """
    dynamic_paths = {
        jtu.keystr(path) for path, _ in jtu.tree_flatten_with_path(tree)[0]
    }
    rows = []
    for path, value in jtu.tree_flatten_with_path(expose(tree))[0]:
        key = jtu.keystr(path)
        if key not in dynamic_paths:
            kind, detail = "static", _short_repr(value)
        elif is_dynamic_leaf(value):
            kind, detail = "dynamic", _aval(value)
        else:
            kind, detail = "leaf", _short_repr(value)
        rows.append(Row(key, kind, type(value).__qualname__, detail))
    return Explanation(tuple(rows))


@dataclasses.dataclass(frozen=True)
class Reason:
    """Why two calls of a jitted function do not share a compiled program."""

    kind: str  # "static", "added", "removed", "shape", "dtype", "weak_type", ...
    path: str
    old: Any = None
    new: Any = None

    def __str__(self) -> str:
        where = self.path or "<root>"
        if self.kind in ("added", "removed"):
            return f"{where}: {self.kind} ({_short_repr(self.old if self.kind == 'removed' else self.new)})"
        if self.kind == "static":
            note = ""
            if type(self.old) is type(self.new) and callable(self.old):
                note = " (a new callable object; functions compare by identity)"
            return f"{where}: static value changed from {_short_repr(self.old)} to {_short_repr(self.new)}{note}"
        if self.kind == "structure":
            return f"{where}: tree structure changed from {self.old} to {self.new}"
        if self.kind == "length":
            return f"{where}: length changed from {self.old} to {self.new}"
        if self.kind == "kind":
            return f"{where}: changed between static and dynamic ({_short_repr(self.old)} -> {_short_repr(self.new)})"
        return f"{where}: {self.kind} changed from {self.old} to {self.new}"


def _static_equal(a: Any, b: Any) -> bool:
    try:
        return static_equal(a, b)
    except Exception:
        return False


def _leaf_reasons(path: str, a: Any, b: Any) -> list[Reason]:
    if type(a) is _StaticArgument or type(b) is _StaticArgument:
        a, b = getattr(a, "value", a), getattr(b, "value", b)
        return [] if _static_equal(a, b) else [Reason("static", path, a, b)]
    if not (is_dynamic_leaf(a) and is_dynamic_leaf(b)):
        try:  # Python scalars are traced like arrays, by their abstract value
            return _aval_reasons(path, a, b)
        except TypeError:
            pass
        if is_dynamic_leaf(a) or is_dynamic_leaf(b):
            return [Reason("kind", path, type(a).__qualname__, type(b).__qualname__)]
        return [] if _static_equal(a, b) else [Reason("leaf", path, a, b)]
    reasons = _aval_reasons(path, a, b)
    sharding_a = (
        getattr(a, "sharding", None) if getattr(a, "committed", False) else None
    )
    sharding_b = (
        getattr(b, "sharding", None) if getattr(b, "committed", False) else None
    )
    if sharding_a != sharding_b:
        reasons.append(Reason("sharding", path, sharding_a, sharding_b))
    return reasons


def _signature(x: Any) -> tuple[tuple[int, ...], Any, bool]:
    """Shape, dtype and weak type as `jax.jit` keys its cache (dtypes canonicalised)."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return tuple(x.shape), _canonical(x.dtype), bool(getattr(x, "weak_type", False))
    aval = jax.typeof(x)
    return tuple(aval.shape), _canonical(aval.dtype), bool(aval.weak_type)


def _aval_reasons(path: str, a: Any, b: Any) -> list[Reason]:
    (shape_a, dtype_a, weak_a), (shape_b, dtype_b, weak_b) = (
        _signature(a),
        _signature(b),
    )
    reasons = []
    if shape_a != shape_b:
        reasons.append(Reason("shape", path, shape_a, shape_b))
    if dtype_a != dtype_b:
        reasons.append(Reason("dtype", path, dtype_a, dtype_b))
    if weak_a != weak_b:
        reasons.append(Reason("weak_type", path, weak_a, weak_b))
    return reasons


def _keyed_children(node: Any) -> list[tuple[str, Any]]:
    """One level of a pytree node: (key as text, child) pairs."""
    pairs = jtu.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)[0]
    return [(jtu.keystr(path), child) for path, child in pairs]


def _is_leaf(x: Any) -> bool:
    return jtu.treedef_is_leaf(jtu.tree_structure(x)) and x is not None


class _StructureDiff:
    """Walks two trees (exposed, so static values are leaves too) side by side."""

    def __init__(self, a: Any, b: Any):
        self.dynamic_a = {jtu.keystr(p) for p, _ in jtu.tree_flatten_with_path(a)[0]}
        self.dynamic_b = {jtu.keystr(p) for p, _ in jtu.tree_flatten_with_path(b)[0]}
        self.reasons: list[Reason] = []
        self.compare("", expose(a), expose(b))

    def compare(self, path: str, a: Any, b: Any) -> None:
        if _is_leaf(a) and _is_leaf(b):
            self.compare_leaves(path, a, b)
            return
        if type(a) is not type(b) or _is_leaf(a) or _is_leaf(b):
            self.reasons.append(
                Reason("structure", path, type(a).__qualname__, type(b).__qualname__)
            )
            return
        children_a, children_b = dict(_keyed_children(a)), dict(_keyed_children(b))
        if isinstance(a, (list, tuple)) and len(a) != len(b):
            self.reasons.append(Reason("length", path, len(a), len(b)))
        else:
            for key in children_a.keys() - children_b.keys():
                self.reasons.append(
                    Reason("removed", path + key, children_a[key], None)
                )
            for key in children_b.keys() - children_a.keys():
                self.reasons.append(Reason("added", path + key, None, children_b[key]))
        found = len(self.reasons)
        for key, child in children_a.items():
            if key in children_b:
                self.compare(path + key, child, children_b[key])
        if len(self.reasons) == found and set(children_a) == set(children_b):
            shallow_a = jtu.tree_structure(a, is_leaf=lambda x: x is not a)
            shallow_b = jtu.tree_structure(b, is_leaf=lambda x: x is not b)
            if not _static_equal(shallow_a, shallow_b):  # aux data the walk cannot see
                self.reasons.append(Reason("structure", path, shallow_a, shallow_b))

    def compare_leaves(self, path: str, a: Any, b: Any) -> None:
        dynamic_a, dynamic_b = path in self.dynamic_a, path in self.dynamic_b
        if dynamic_a != dynamic_b:
            self.reasons.append(Reason("kind", path, a, b))
        elif dynamic_a:
            self.reasons.extend(_leaf_reasons(path, a, b))
        elif not _static_equal(a, b):
            self.reasons.append(Reason("static", path, a, b))


def retrace_reasons(a: Any, b: Any) -> list[Reason]:
    """The reasons a function jitted with plain `jax.jit` and called with arguments `a`
    and then `b` would not reuse its compiled program; empty exactly when it would.

    `a` and `b` are argument trees (modules, tuples of arguments, ...); arrays and
    `jax.ShapeDtypeStruct`s may be mixed.
    """
    leaves_a, treedef_a = jtu.tree_flatten_with_path(a)
    leaves_b, treedef_b = jtu.tree_flatten_with_path(b)
    try:
        same_structure = treedef_a == treedef_b
    except Exception as err:  # a static value that cannot be compared
        return [Reason("uncomparable", "", None, f"{type(err).__name__}: {err}")]
    if same_structure:
        return [
            reason
            for (path, x), (_, y) in zip(leaves_a, leaves_b)
            for reason in _leaf_reasons(jtu.keystr(path), x, y)
        ]
    reasons = _StructureDiff(a, b).reasons
    if not reasons:  # e.g. a list became a tuple, or an empty container appeared
        reasons.append(Reason("structure", "", treedef_a, treedef_b))
    return reasons


def _abstract(tree: Any) -> Any:
    """`tree` with arrays and tracers replaced by `ShapeDtypeStruct`s (keeps no tracer)."""

    def to_struct(x: Any) -> Any:
        if isinstance(x, jax.Array):
            aval = jax.typeof(x)
            return jax.ShapeDtypeStruct(
                aval.shape, aval.dtype, weak_type=aval.weak_type
            )
        return x

    return jtu.tree_map(to_struct, tree)


class _StaticArgument:
    """An argument named by `static_argnums`/`static_argnames`: compared with `==`."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value


class _Arguments(dict):
    """Bound arguments by name; key paths print as `name.attr`, not `['name'].attr`."""


class _ArgumentKey(jtu.GetAttrKey):
    def __str__(self) -> str:
        return self.name


jtu.register_pytree_with_keys(
    _Arguments,
    lambda d: (tuple((_ArgumentKey(k), v) for k, v in d.items()), tuple(d)),
    lambda keys, values: _Arguments(zip(keys, values)),
)


def logged_jit(fun: Callable[..., Any], /, **jit_kwargs: Any) -> Callable[..., Any]:
    """`jax.jit(fun, **jit_kwargs)` that logs, on every retrace, what changed since the
    previous trace, by argument key path (logger "autostatic", level WARNING).

    The comparison runs only while tracing, so a cache hit costs nothing extra. The
    returned function has `.retraces`: a list of `(trace_number, reasons)`. A Python
    float or int that changes across three or more retraces gets a one-off warning
    suggesting to store it as an array.
    """
    state: dict[str, Any] = {"previous": None, "count": 0, "changes": {}}
    retraces: list[tuple[int, list[Reason]]] = []
    name = getattr(fun, "__qualname__", repr(fun))

    try:
        signature: inspect.Signature | None = inspect.signature(fun)
    except (TypeError, ValueError):
        signature = None

    static_numbers = jit_kwargs.get("static_argnums", ())
    static_numbers = (
        {static_numbers} if isinstance(static_numbers, int) else set(static_numbers)
    )
    static_names = jit_kwargs.get("static_argnames", ())
    static_names = (
        {static_names} if isinstance(static_names, str) else set(static_names)
    )
    if signature is not None:
        parameters = list(signature.parameters)
        static_names |= {
            parameters[i]
            for i in static_numbers
            if -len(parameters) <= i < len(parameters)
        }

    def by_name(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # Reasons then read `model.layers[0].weight`, not `[0][0].layers[0].weight`.
        try:
            bound = signature.bind(*args, **kwargs).arguments  # type: ignore[union-attr]
        except (AttributeError, TypeError):
            args = tuple(
                _StaticArgument(a) if i in static_numbers else a
                for i, a in enumerate(args)
            )
            return (args, kwargs)
        return _Arguments(
            (name, _StaticArgument(value) if name in static_names else value)
            for name, value in bound.items()
        )

    @ft.wraps(fun)
    def traced(*args: Any, **kwargs: Any) -> Any:
        current = _abstract(by_name(args, kwargs))
        state["count"] += 1
        if state["previous"] is not None:
            reasons = retrace_reasons(state["previous"], current)
            retraces.append((state["count"], reasons))
            logger.warning(
                "jit of %s traced again (trace %d): %s",
                name,
                state["count"],
                "; ".join(map(str, reasons)) or "no difference in the arguments",
            )
            _warn_changing_scalars(name, state["changes"], reasons)
        state["previous"] = current
        return fun(*args, **kwargs)

    jitted = jax.jit(traced, **jit_kwargs)
    jitted.retraces = retraces  # type: ignore[attr-defined]
    return jitted


def _warn_changing_scalars(
    name: str, changes: dict[str, int], reasons: list[Reason]
) -> None:
    from ._static_checks import warn_once

    for reason in reasons:
        if (
            reason.kind == "static"
            and isinstance(reason.new, (int, float))
            and not isinstance(reason.new, bool)
        ):
            changes[reason.path] = changes.get(reason.path, 0) + 1
            if changes[reason.path] == 3:
                warn_once(
                    ("retrace", name, reason.path),
                    f"{reason.path} is a Python {type(reason.new).__name__} whose value "
                    f"has changed on {changes[reason.path]} calls of {name}, and each "
                    "new value retraces because it is static. If it changes every step, "
                    "store it as an array, e.g. `eqx.field(converter=jnp.asarray)`.",
                )
