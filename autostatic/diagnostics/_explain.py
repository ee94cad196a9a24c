"""`explain`: every value of a tree by key path with its kind, under a one-line
summary (array counts, parameters, bytes), optionally filtered by kind or path."""

import dataclasses
import html
import math
import re
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.tree_util as jtu

from ..core._exposed import expose
from ..core._leaves import is_dynamic_leaf
from ._describe import aval_text, describe

_KINDS = ("dynamic", "static", "leaf")


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
    # One copy of the tree looked at twice: another thread changing a container of
    # `tree` meanwhile does not make the two looks disagree.
    leaves, treedef = jtu.tree_flatten(tree)
    tree = jtu.tree_unflatten(treedef, leaves)
    dynamic_paths = {
        jtu.keystr(path) for path, _ in jtu.tree_flatten_with_path(tree)[0]
    }
    exposed = expose(tree)
    markers = _state_markers(exposed)
    rows, arrays = [], []
    for path, value in jtu.tree_flatten_with_path(exposed)[0]:
        key = jtu.keystr(path)
        if key not in dynamic_paths:
            kind, detail = "static", describe(value)
        elif is_dynamic_leaf(value):
            kind, detail = "dynamic", aval_text(value)
            arrays.append(value)
        else:
            kind, detail = "leaf", describe(value)
        detail += _state_note(path, markers) if markers else ""
        rows.append(Row(key, kind, type(value).__qualname__, detail))
    return rows, arrays


def _summary(rows: list[Row], arrays: list[Any], shown: int) -> Summary:
    """The counts over every row of the tree, of which the filters kept `shown`."""
    parameters, nbytes, dtypes = _array_counts(arrays)
    counts = {k: sum(r.kind == k for r in rows) for k in _KINDS}
    return Summary(
        counts["dynamic"],
        counts["static"],
        counts["leaf"],
        parameters,
        nbytes,
        dtypes,
        shown,
    )


def explain(
    tree: Any,
    *,
    kind: str | Collection[str] | None = None,
    path: str | re.Pattern[str] | None = None,
) -> Explanation:
    """Every value in `tree`, one row per key path: dynamic or static, type, and
    shape/dtype for arrays, the importable name of a function or class
    (`jax.nn.relu`), or a short repr, under a one-line summary of the whole tree.

    `leaf` marks a non-array pytree leaf: one in an `eqx.Module` field, or a Python
    number in a field annotated to hold arrays (loop state), which plain `jax.jit`
    traces as a scalar; any other non-array leaf it rejects. Entries of an `eqx.nn.State`
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
    return Explanation(shown, _summary(rows, arrays, len(shown)))
