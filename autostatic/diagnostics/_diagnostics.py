"""Making the partition visible: what is static, and why a jitted function retraced.

`explain` lists every value of a tree by key path with its kind, under a one-line
summary (array counts, parameters, bytes), optionally filtered by kind or path; it
names functions and classes as a user would import them. `retrace_reasons` compares two
argument trees the way `jax.jit`'s cache does (the treedef with its static data
compared by `==`, then each leaf's shape, dtype, weak type and sharding) and names what
differs by key path. `logged_jit` runs that comparison only when a function is traced
again, so it costs nothing while the cache hits.
"""

import dataclasses
import functools as ft
import html
import inspect
import logging
import math
import re
import sys
import warnings
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, Protocol

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from ..core._exposed import expose
from ..core._leaves import is_dynamic_leaf
from ..core._static import static_equal

logger = logging.getLogger("autostatic")

_REPR_WIDTH = 60
_KINDS = ("dynamic", "static", "leaf")


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
        return f"jit({_describe(wrapped)})"
    return name


def _partial_name(value: ft.partial) -> str:
    arguments = [_describe_argument(a) for a in value.args] + [
        f"{k}={_describe_argument(v)}" for k, v in value.keywords.items()
    ]
    text = f"partial({', '.join([_describe(value.func), *arguments])})"
    return text if len(text) <= _REPR_WIDTH else text[: _REPR_WIDTH - 3] + "..."


def _describe_argument(value: Any) -> str:
    return _aval(value) if is_dynamic_leaf(value) else _describe(value)


def _describe(value: Any) -> str:
    """A non-array value as a user would write it: functions and classes by their
    importable names, partials by their parts, anything else by a short repr."""
    try:
        if isinstance(value, ft.partial):
            return _partial_name(value)
        name = _callable_name(value)
    except Exception:  # odd attributes on a user's object must not break a diagnostic
        name = None
    return _short_repr(value) if name is None else name


def _aux_data(node: Any) -> Any:
    """What `node`'s registered flatten returned beside its children."""
    shallow = jtu.tree_structure(node, is_leaf=lambda x: x is not node)
    node_data = shallow.node_data()
    return None if node_data is None else node_data[1]


def _state_markers(tree: Any) -> dict[str, str]:
    """For each entry of an `eqx.nn.State` in `tree`: its key path text, mapped to the
    marker of the `StateIndex` it belongs to.

    `State` is registered without keys, so JAX names its entries `[<flat index i>]`;
    its aux data is the markers in the same order, which `eqx.nn.make_with_state` sets
    to where each `StateIndex` sits in the model (`BatchNorm.state_index`). An
    `object()` marker (a `State` built by hand) names nothing and is left out.
    """
    markers = {}
    is_state = lambda x: isinstance(x, eqx.nn.State)
    for path, node in jtu.tree_flatten_with_path(tree, is_leaf=is_state)[0]:
        if not is_state(node):
            continue
        for i, marker in enumerate(_aux_data(node)):
            if isinstance(marker, str):
                markers[jtu.keystr((*path, jtu.FlattenedIndexKey(i)))] = marker
    return markers


def _state_note(path: Sequence[Any], markers: dict[str, str]) -> str:
    for end in range(len(path), 0, -1):
        marker = markers.get(jtu.keystr(tuple(path[:end])))
        if marker is not None:
            return f"  (state of {marker})"
    return ""


def _plural(count: int, noun: str, plural: str | None = None) -> str:
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"


def _listed(words: Sequence[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def _bytes(count: int) -> str:
    """Decimal units, three significant digits: `24 B`, `4.94 kB`, `1.2 GB`."""
    if count < 1000:
        return f"{count} B"
    size = float(count)
    for unit in ("kB", "MB", "GB", "TB"):
        size /= 1000
        if size < 999.5:
            return f"{size:.3g} {unit}"
    return f"{size / 1000:.3g} PB"


@dataclasses.dataclass(frozen=True)
class Row:
    """One value of a tree: its key path, its kind and a short description."""

    path: str
    kind: str  # "dynamic", "static", or "leaf" (a non-array pytree leaf)
    type: str
    detail: str


@dataclasses.dataclass(frozen=True)
class Summary:
    """Counts over the whole tree given to `explain`, whatever rows a filter shows.

    `parameters` is the number of elements of the dynamic arrays and `nbytes` their
    size (element count times dtype item size); `dtypes` their distinct dtypes in
    order of first appearance; `shown` the number of rows the filter kept.
    """

    dynamic: int
    static: int
    leaves: int
    parameters: int
    nbytes: int
    dtypes: tuple[str, ...]
    shown: int

    @property
    def total(self) -> int:
        """Rows without a filter: every value of the tree."""
        return self.dynamic + self.static + self.leaves

    def __str__(self) -> str:
        arrays = _plural(self.dynamic, "dynamic array")
        if self.dynamic:
            arrays += (
                f" ({_plural(self.parameters, 'parameter')}, {_bytes(self.nbytes)}:"
                f" {_listed(self.dtypes)})"
            )
        text = ", ".join(
            [
                arrays,
                _plural(self.static, "static value"),
                _plural(self.leaves, "non-array leaf", "non-array leaves"),
            ]
        )
        if self.shown != self.total:
            text += f" (showing {self.shown:,} of {self.total:,} rows)"
        return text


@dataclasses.dataclass(frozen=True)
class Explanation:
    """The rows of `explain(tree)` under its `summary`; `str()` gives the summary line
    and a table, notebooks the same in HTML."""

    rows: tuple[Row, ...]
    summary: Summary

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
        return "\n".join([str(self.summary), *lines])

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
            f"<p>{html.escape(str(self.summary))}</p>"
            "<table><thead><tr><th>path</th><th>kind</th><th>type</th><th>value</th>"
            f"</tr></thead><tbody>{cells}</tbody></table>"
        )


def _kind_filter(kind: str | Collection[str] | None) -> frozenset[str]:
    if kind is None:
        return frozenset(_KINDS)
    # Typed as text, but checked as any value: a lone non-string is one unknown kind.
    several = isinstance(kind, Iterable) and not isinstance(kind, str)
    chosen: set[object] = set(kind) if several else {kind}
    unknown = chosen - set(_KINDS)
    if unknown:
        raise ValueError(
            f"explain(kind=...) takes 'dynamic', 'static' or 'leaf', or a collection "
            f"of them; got {', '.join(map(repr, sorted(unknown, key=str)))}"
        )
    return frozenset(k for k in _KINDS if k in chosen)


def _path_filter(path: str | re.Pattern[str] | None) -> Callable[[str], bool]:
    if path is None:
        return lambda text: True
    if isinstance(path, re.Pattern):
        return lambda text: path.search(text) is not None
    if isinstance(path, str):
        return lambda text: path in text
    raise TypeError(
        f"explain(path=...) takes a str or a compiled regular expression, got "
        f"{type(path).__qualname__}"
    )


def _array_counts(arrays: list[Any]) -> tuple[int, int, tuple[str, ...]]:
    """Elements, bytes and distinct dtypes of the dynamic arrays, as jit would see
    them (a float64 numpy array is a float32 argument unless x64 is enabled)."""
    parameters, nbytes, dtypes = 0, 0, {}
    for x in arrays:
        aval = x if isinstance(x, jax.ShapeDtypeStruct) else jax.typeof(x)
        size = math.prod(aval.shape)
        parameters += size
        nbytes += size * getattr(aval.dtype, "itemsize", 0)
        dtypes[str(aval.dtype)] = None
    return parameters, nbytes, tuple(dtypes)


def _all_rows(tree: Any) -> tuple[list[Row], list[Any]]:
    """A row for every value of `tree`, and the dynamic arrays among them."""
    dynamic_paths = {
        jtu.keystr(path) for path, _ in jtu.tree_flatten_with_path(tree)[0]
    }
    exposed = expose(tree)
    markers = _state_markers(exposed)
    rows, arrays = [], []
    for path, value in jtu.tree_flatten_with_path(exposed)[0]:
        key = jtu.keystr(path)
        if key not in dynamic_paths:
            kind, detail = "static", _describe(value)
        elif is_dynamic_leaf(value):
            kind, detail = "dynamic", _aval(value)
            arrays.append(value)
        else:
            kind, detail = "leaf", _describe(value)
        detail += _state_note(path, markers) if markers else ""
        rows.append(Row(key, kind, type(value).__qualname__, detail))
    return rows, arrays


def explain(
    tree: Any,
    *,
    kind: str | Collection[str] | None = None,
    path: str | re.Pattern[str] | None = None,
) -> Explanation:
    """Every value in `tree`, one row per key path: dynamic or static, type, and
    shape/dtype for arrays, the importable name of a function or class
    (`jax.nn.relu`), or a short repr, under a one-line summary of the whole tree.

    `leaf` marks a non-array leaf outside any AutoModule's control (e.g. in an
    `eqx.Module` field): plain `jax.jit` would reject it. Entries of an `eqx.nn.State`
    keep the key path JAX gives them (`[<flat index 0>]`, as `State` has no keys) and
    name the `StateIndex` they belong to in the value column.

    **Arguments:**

    - `tree`: any pytree; AutoModules in it show their static fields too.
    - `kind`: show only rows of this kind, `"dynamic"`, `"static"` or `"leaf"`, or of
        any kind in a collection of them. Anything else raises `ValueError`.
    - `path`: show only rows whose key path contains this text (`".layers[0]"`), or,
        given a compiled regular expression, in which it finds a match
        (`re.compile(r"\\.weight$")`).

    **Returns:** an `Explanation`: `rows` (those the filters keep) and `summary`, whose
    counts (`dynamic`, `static`, `leaves`, `parameters`, `nbytes`, `dtypes`) describe
    the whole tree and `shown` the rows kept.

    Example:

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import autostatic as asx
    >>> class Scale(asx.AutoModule):
    ...     w: jax.Array
    ...     activation: object
    ...     steps: int
    >>> m = Scale(jnp.ones((2, 3)), jax.nn.relu, 3)
    >>> print(asx.explain(m))
    1 dynamic array (6 parameters, 24 B: float32), 2 static values, 0 non-array leaves
    path         kind     type        value
    .w           dynamic  ArrayImpl   float32[2,3]
    .activation  static   custom_jvp  jax.nn.relu
    .steps       static   int         3
    >>> print(asx.explain(m, kind="static", path="act"))
    1 dynamic array (6 parameters, 24 B: float32), 2 static values, 0 non-array leaves (showing 1 of 3 rows)
    path         kind    type        value
    .activation  static  custom_jvp  jax.nn.relu

    ```
    """
    kinds, path_matches = _kind_filter(kind), _path_filter(path)
    rows, arrays = _all_rows(tree)
    shown = tuple(r for r in rows if r.kind in kinds and path_matches(r.path))
    parameters, nbytes, dtypes = _array_counts(arrays)
    counts = {k: sum(r.kind == k for r in rows) for k in _KINDS}
    summary = Summary(
        counts["dynamic"],
        counts["static"],
        counts["leaf"],
        parameters,
        nbytes,
        dtypes,
        len(shown),
    )
    return Explanation(shown, summary)


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


class LoggedJit(Protocol):
    """What `logged_jit` returns: a jitted function that keeps the retraces it logged."""

    retraces: list[tuple[int, list[Reason]]]

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...


def logged_jit(fun: Callable[..., Any], /, **jit_kwargs: Any) -> LoggedJit:
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

    jitted: Any = jax.jit(traced, **jit_kwargs)
    jitted.retraces = retraces
    return jitted


def _warn_changing_scalars(
    name: str, changes: dict[str, int], reasons: list[Reason]
) -> None:
    from ..core._checks import warn_once

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
