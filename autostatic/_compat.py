"""The Equinox internals that AutoModule relies on, checked once at import.

`eqx.Module` registers every subclass as a pytree inside its metaclass, with flatten
functions produced by `equinox._module._module.generate_flatten_functions`, and JAX has
no way to unregister a type. AutoModule therefore hands Equinox its own flatten
functions at that single point. Everything touched here is private to Equinox, so a
version whose internals differ fails loudly at import instead of misbehaving later.
"""

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import equinox as eqx
import equinox._module._module as _eqx_module

# Equinox's `_ModuleMeta.__call__` raises TypeError(f"Field {name!r} was not initialized.")
_UNSET_FIELD_MESSAGE_END = " was not initialized."
_UNSET_FIELD = re.compile(r"Field '(\w+)' was not initialized\.")

SUPPORTED_EQUINOX = (
    (0, 13, 3),
    (0, 14, 0),
)  # [lower, upper): 0.13.3, 0.13.6, 0.13.8 tested


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")[:3] if part.isdigit())


def _check_equinox() -> None:
    version = _version_tuple(eqx.__version__)
    lower, upper = SUPPORTED_EQUINOX
    problems = []
    if not lower <= version < upper:
        problems.append(f"equinox {eqx.__version__} is outside the verified range")
    for name in (
        "generate_flatten_functions",
        "_currently_initialising",
        "_ModuleMeta",
        "WRAPPER_FIELD_NAMES",
    ):
        if not hasattr(_eqx_module, name):
            problems.append(f"equinox._module._module.{name} is missing")
    meta_call = vars(getattr(_eqx_module, "_ModuleMeta", type)).get("__call__")
    call_consts = getattr(getattr(meta_call, "__code__", None), "co_consts", ())
    if _UNSET_FIELD_MESSAGE_END not in call_consts:
        problems.append("_ModuleMeta.__call__ no longer reports unset fields as before")
    meta_new = getattr(getattr(_eqx_module, "_ModuleMeta", None), "__new__", None)
    code_names = getattr(getattr(meta_new, "__code__", None), "co_names", ())
    for name in ("generate_flatten_functions", "register_pytree_with_keys"):
        if name not in code_names:
            problems.append(f"_ModuleMeta.__new__ no longer calls {name}")
    if problems:
        raise ImportError(
            "autostatic cannot work with the installed equinox: "
            + "; ".join(problems)
            + ". Install a verified version: pip install 'equinox>="
            + ".".join(map(str, lower))
            + ",<"
            + ".".join(map(str, upper))
            + "'."
        )


_check_equinox()

# `_check_equinox` has verified each of these private names above.
ModuleMeta = _eqx_module._ModuleMeta
currently_initialising = _eqx_module._currently_initialising
WRAPPER_FIELD_NAMES: tuple[str, ...] = _eqx_module.WRAPPER_FIELD_NAMES  # pyright: ignore[reportPrivateImportUsage]  # verified at import

FlattenFunctions = tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]


def install_flatten_generator(
    claims: Callable[[type], bool], generate: Callable[[type], FlattenFunctions]
) -> None:
    """Route `generate_flatten_functions` to `generate` for classes that `claims`.

    Every other class keeps Equinox's own generated functions; the dispatcher stays
    installed, so class creation in any thread sees a consistent function.
    """
    original = _eqx_module.generate_flatten_functions  # pyright: ignore[reportPrivateImportUsage]  # verified at import

    def generate_flatten_functions(
        cls: type, fields: tuple[dataclasses.Field, ...]
    ) -> FlattenFunctions:
        if claims(cls):
            return generate(cls)
        return original(cls, fields)

    generate_flatten_functions.__wrapped__ = original  # pyright: ignore[reportFunctionMemberAccess]  # functools' convention for what a wrapper wraps
    _eqx_module.generate_flatten_functions = generate_flatten_functions  # pyright: ignore[reportPrivateImportUsage]  # verified at import


def unset_field(err: TypeError) -> str | None:
    """The field name if `err` is Equinox's error for a field `__init__` never set."""
    match = _UNSET_FIELD.fullmatch(str(err))
    return None if match is None else match[1]
