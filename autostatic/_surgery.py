"""Model surgery that can reach static values: `tree_at` and `inference_mode`.

`eqx.tree_at` only reaches pytree leaves and nodes, and an AutoModule keeps its
non-array values in aux data. These functions first *expose* every AutoModule in the
tree (a copy whose every field, static values included, is a pytree child), run the
Equinox operation on that, then decide the partition of every AutoModule afresh, so a
replaced value is classified by what it is now: an array put where a float was becomes
dynamic, a static submodule that gains arrays becomes dynamic.
"""

from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax.tree_util as jtu

from . import _partition

_sentinel: Any = object()


def _is_automodule(x: Any) -> bool:
    return hasattr(type(x), "__autostatic_fields__")


def _map_modules(fn: Callable[[Any], Any], tree: Any) -> Any:
    return jtu.tree_map(
        lambda x: fn(x) if _is_automodule(x) else x, tree, is_leaf=_is_automodule
    )


def _field_names(module: Any) -> tuple[str, ...]:
    return tuple(name for name, _ in type(module).__autostatic_fields__)


def expose(tree: Any, *, keep_declared_static: bool = False) -> Any:
    """A copy of `tree` in which every AutoModule has all its fields as children
    (except, with `keep_declared_static`, those declared `eqx.field(static=True)`, as
    an `eqx.Module` would flatten them)."""

    def expose_module(module: Any) -> Any:
        cls = type(module)
        attrs = _partition.materialise(module)
        kinds, children, static = [], [], []
        for name, declared_static in cls.__autostatic_fields__:
            if keep_declared_static and declared_static:
                kinds.append(_partition.STATIC)
                static.append(attrs[name])
            else:
                kinds.append(_partition.DYNAMIC)
                children.append(_map_modules(expose_module, attrs[name]))
        layout = _partition.layout_for(cls, tuple(kinds))
        aux = (layout, tuple(map(type, static)), *static)
        return _partition.unflatten(cls, aux, tuple(children))

    return _map_modules(expose_module, tree)


def refreeze(tree: Any) -> Any:
    """Decides the partition of every AutoModule in `tree` from its current values."""

    def refreeze_module(module: Any) -> Any:
        cls = type(module)
        attrs = _partition.materialise(module)
        fresh = object.__new__(cls)
        object.__getattribute__(fresh, "__dict__").update(
            (n, _map_modules(refreeze_module, attrs[n])) for n in _field_names(module)
        )
        _partition.freeze_partition(fresh)
        return fresh

    return _map_modules(refreeze_module, tree)


def tree_at(
    where: Callable[[Any], Any],
    pytree: Any,
    replace: Any | Sequence[Any] = _sentinel,
    replace_fn: Callable[[Any], Any] = _sentinel,
    is_leaf: Callable[[Any], bool] | None = None,
) -> Any:
    """`eqx.tree_at` that can also replace the static values of AutoModules.

    Same signature and semantics as `equinox.tree_at`; `where` may point at any
    attribute, array or not: `tree_at(lambda m: m.dropout.p, model, 0.2)`. The result's
    AutoModules are re-partitioned, so the replacement is static or dynamic according
    to what it is.
    """
    kwargs: dict[str, Any] = {"is_leaf": is_leaf}
    if replace is not _sentinel:
        kwargs["replace"] = replace
    if replace_fn is not _sentinel:
        kwargs["replace_fn"] = replace_fn
    return refreeze(eqx.tree_at(where, expose(pytree), **kwargs))


def inference_mode(pytree: Any, value: bool = True) -> Any:
    """`eqx.nn.inference_mode` for trees holding AutoModules.

    Inside an AutoModule the `inference` flags of `eqx.nn.Dropout`/`BatchNorm` are
    static values, which `eqx.nn.inference_mode` cannot reach; this sets them all.
    """
    return refreeze(eqx.nn.inference_mode(expose(pytree), value))
