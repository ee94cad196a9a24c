"""`logged_jit`: `jax.jit` that names what changed, by argument key path, each time a
function is traced again. The comparison runs only while tracing, so it costs nothing
while the cache hits."""

import functools as ft
import inspect
import logging
from collections.abc import Callable
from typing import Any, Final, Protocol

import jax
import jax.tree_util as jtu

from ._retrace_reasons import Reason, retrace_reasons, StaticArgument

logger = logging.getLogger("autostatic")


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


def _signature_of(fun: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fun)
    except (TypeError, ValueError):
        return None


def _static_arguments(
    signature: inspect.Signature | None, jit_kwargs: dict[str, Any]
) -> tuple[set[int], set[str]]:
    """The positions and the names of the arguments `jax.jit` is told are static; a
    position is named too where the signature gives its parameter."""
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
    return static_numbers, static_names


def _by_name(
    signature: inspect.Signature | None,
    static_numbers: set[int],
    static_names: set[str],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """The arguments of a call by parameter name where the signature binds them, the
    static ones marked."""
    # Reasons then read `model.layers[0].weight`, not `[0][0].layers[0].weight`.
    try:
        bound = signature.bind(*args, **kwargs).arguments  # type: ignore[union-attr]
    except (AttributeError, TypeError):
        args = tuple(
            StaticArgument(a) if i in static_numbers else a for i, a in enumerate(args)
        )
        return (args, kwargs)
    named = _Arguments(
        (name, StaticArgument(value) if name in static_names else value)
        for name, value in bound.items()
    )
    # `jax.jit` keys a call by how each argument is passed, too.
    named[_BY_KEYWORD] = StaticArgument(tuple(kwargs))
    return named


_BY_KEYWORD: Final = "(passed by keyword)"


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
    signature = _signature_of(fun)
    static_numbers, static_names = _static_arguments(signature, jit_kwargs)
    by_name = ft.partial(_by_name, signature, static_numbers, static_names)

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
                "; ".join(map(str, reasons)) or _NO_DIFFERENCE,
            )
            _warn_changing_scalars(name, state["changes"], reasons)
        state["previous"] = current
        return fun(*args, **kwargs)

    jitted: Any = jax.jit(traced, **jit_kwargs)
    jitted.retraces = retraces
    return jitted


_NO_DIFFERENCE: Final = (
    "no difference in the arguments' structure, static values, shapes or dtypes "
    "(an input's sharding or placement, which the trace does not see, retraces too)"
)


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
