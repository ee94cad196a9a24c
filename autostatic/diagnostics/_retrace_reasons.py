"""`retrace_reasons`: two argument trees compared the way `jax.jit`'s cache compares
them (the treedef with its static data compared by `==`, then each leaf's shape, dtype,
weak type and sharding), and what differs named by key path."""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from ..core._exposed import expose
from ..core._leaves import is_dynamic_leaf
from ..core._static import is_dtype, static_equal
from ._describe import short_repr


def _canonical(dtype: Any) -> Any:
    # Extended dtypes (PRNG keys) have no numpy dtype and are never canonicalised.
    if jnp.issubdtype(dtype, jax.dtypes.extended):
        return dtype
    return np.dtype(jax.dtypes.canonicalize_dtype(dtype))


class StaticArgument:
    """An argument named by `static_argnums`/`static_argnames`: compared with `==`."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __repr__(self) -> str:
        return repr(self.value)


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
            return f"{where}: {self.kind} ({short_repr(self.old if self.kind == 'removed' else self.new)})"
        if self.kind == "static":
            note = ""
            if type(self.old) is type(self.new) and _a_function(self.old):
                note = " (a new callable object; functions compare by identity)"
            return f"{where}: static value changed from {short_repr(self.old)} to {short_repr(self.new)}{note}"
        if self.kind == "structure":
            return f"{where}: tree structure changed from {self.old} to {self.new}"
        if self.kind == "length":
            return f"{where}: length changed from {self.old} to {self.new}"
        if self.kind == "kind":
            return f"{where}: changed between static and dynamic ({short_repr(self.old)} -> {short_repr(self.new)})"
        return f"{where}: {self.kind} changed from {self.old} to {self.new}"


def _a_function(x: Any) -> bool:
    """A callable compared by identity: not a class or a dtype (`int`, `jnp.float32`),
    which another value of replaces."""
    return callable(x) and not isinstance(x, type) and not is_dtype(x)


def _static_equal(a: Any, b: Any) -> bool:
    try:
        return static_equal(a, b)
    except Exception:
        return False


def _leaf_reasons(path: str, a: Any, b: Any) -> list[Reason]:
    if type(a) is StaticArgument or type(b) is StaticArgument:
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
                marked = _marked_static_changes(path, a, b)
                structure = Reason("structure", path, shallow_a, shallow_b)
                self.reasons.extend(marked or [structure])

    def compare_leaves(self, path: str, a: Any, b: Any) -> None:
        dynamic_a, dynamic_b = path in self.dynamic_a, path in self.dynamic_b
        if dynamic_a != dynamic_b:
            self.reasons.append(Reason("kind", path, a, b))
        elif dynamic_a:
            self.reasons.extend(_leaf_reasons(path, a, b))
        elif not _static_equal(a, b):
            self.reasons.append(Reason("static", path, a, b))


def _marked_static_changes(path: str, a: Any, b: Any) -> list[Reason]:
    """The fields of two `eqx.Module`s of one class (an `eqx.nn` layer's `padding`)
    declared `eqx.field(static=True)` whose values differ, by name."""
    if not dataclasses.is_dataclass(a):
        return []
    return [
        Reason("static", f"{path}.{field.name}", old, new)
        for field in dataclasses.fields(a)
        if field.metadata.get("static", False)
        for old, new in [(getattr(a, field.name, None), getattr(b, field.name, None))]
        if not _static_equal(old, new)
    ]


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
