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

from ._partition import expose, refreeze

_sentinel: Any = object()


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
