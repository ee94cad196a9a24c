"""Running an Equinox-based codebase with its Modules auto-static, without editing it.

`rebase(["diffrax", "lineax"])` makes every class statement in those packages (and in
modules under them) whose bases name `eqx.Module` create an `AutoModule` subclass
instead, and a metaclass of theirs derived from Equinox's derive from AutoModule's:
at the one point where Python takes a class statement's bases, `__build_class__`.
Nothing is rewritten on disk or in source, so it composes with pytest's assertion
rewriting and jaxtyping's import hook. With `drop_static_markers`, every
`eqx.field(static=True)` of those packages' AutoModules loses its marker (in
Equinox's metaclass, where the class body is known): the world auto-static promises,
where nobody writes one.

A rebase that changes nothing must not pass for one that worked: installing it after
a named package was imported is an error, and `Rebase.check` fails for a package in
which no class was rebased.
"""

import builtins
import copy
import dataclasses
import sys
import threading
import types
from collections.abc import Callable, Iterable
from typing import Any

import equinox as eqx

from .._compat import ModuleMeta, wrap_module_creation
from ..core._module import AutoModule


class RebaseError(RuntimeError):
    """A rebase that could not take effect."""


class Rebase:
    """An installed rebase: what it changed so far, per named package."""

    def __init__(self, packages: tuple[str, ...], drop_static_markers: bool):
        self.packages = packages
        self.drop_static_markers = drop_static_markers
        self.rebased: dict[str, list[str]] = {p: [] for p in packages}
        self.markers_dropped: dict[str, int] = dict.fromkeys(packages, 0)
        self._undo: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def package_of(self, module: str) -> str | None:
        return next((p for p in self.packages if _is_within(module, p)), None)

    def _rebase_class_statement(
        self, module: str, name: str, bases: tuple[Any, ...], kwds: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The bases and keywords of a class statement in `module`: `eqx.Module` as
        a base becomes `AutoModule`, and Equinox's metaclass (as a base of a library's
        own metaclass, or given as `metaclass=`) becomes AutoModule's."""
        package = self.package_of(module)
        if package is None:
            return bases, kwds
        auto_meta = type(AutoModule)
        if eqx.Module in bases:
            bases = tuple(AutoModule if b is eqx.Module else b for b in bases)
            with self._lock:
                self.rebased[package].append(f"{module}.{name}")
        if ModuleMeta in bases:
            bases = tuple(auto_meta if b is ModuleMeta else b for b in bases)
        if kwds.get("metaclass") is ModuleMeta:
            kwds = {**kwds, "metaclass": auto_meta}
        return bases, kwds

    def _drop_markers(
        self, bases: tuple[type, ...], namespace: dict[str, Any]
    ) -> dict[str, Any]:
        """The namespace of a new AutoModule class of a named package, without
        `static=True` in its fields."""
        package = self.package_of(str(namespace.get("__module__", "")))
        if package is None or not any(issubclass(b, AutoModule) for b in bases):
            return namespace
        namespace, dropped = _without_static_markers(namespace)
        with self._lock:
            self.markers_dropped[package] += dropped
        return namespace

    def summary(self) -> str:
        parts = [
            f"{p}: {len(self.rebased[p])} direct eqx.Module subclasses rebased"
            + (
                f", {self.markers_dropped[p]} static markers dropped"
                if self.drop_static_markers
                else ""
            )
            for p in self.packages
        ]
        return "autostatic rebase: " + "; ".join(parts)

    def check(self, *, imported_only: bool = False) -> None:
        """Raises `RebaseError` if a named package was never imported (with
        `imported_only`, not checked), or if no class at all was rebased. A package
        imported after the rebase was installed had every class rebased that has
        `eqx.Module` as a direct base: it may legitimately have none (a test package
        using the library's classes)."""
        for package in self.packages:
            if package not in sys.modules and not imported_only:
                raise RebaseError(
                    f"autostatic rebase: {package!r} was never imported, so nothing "
                    "in it was rebased. Check the package name."
                )
        if not any(self.rebased.values()) and (
            not imported_only or any(p in sys.modules for p in self.packages)
        ):
            raise RebaseError(
                f"autostatic rebase: no class of {', '.join(map(repr, self.packages))} "
                "was rebased: none of them defines a class with eqx.Module as a "
                "direct base."
            )

    def undo(self) -> None:
        """Stops rebasing classes made from now on; those made stay AutoModules."""
        global _active
        while self._undo:
            self._undo.pop()()
        if _active is self:
            _active = None


def _without_static_markers(
    namespace: dict[str, Any],
) -> tuple[dict[str, Any], int]:
    namespace = dict(namespace)
    dropped = 0
    for name, value in namespace.items():
        if isinstance(value, dataclasses.Field) and value.metadata.get("static"):
            field = copy.copy(value)
            metadata = {k: v for k, v in value.metadata.items() if k != "static"}
            field.metadata = types.MappingProxyType(metadata)  # pyright: ignore[reportAttributeAccessIssue]  # a writable slot
            namespace[name] = field
            dropped += 1
    return namespace, dropped


def _wrap_build_class(installed: Rebase) -> Callable[[], None]:
    """Passes every class statement through `installed._rebase_class_statement`:
    the one point where bases and the metaclass are chosen, before Python computes
    the metaclass (a library's own subclass of Equinox's metaclass, as diffrax's
    `PIDController` has, must derive from AutoModule's too)."""
    original = builtins.__build_class__

    def __build_class__(func: Any, name: str, /, *bases: Any, **kwds: Any) -> Any:
        module = getattr(func, "__globals__", {}).get("__name__", "")
        new_bases, kwds = installed._rebase_class_statement(module, name, bases, kwds)
        return original(func, name, *new_bases, **kwds)

    builtins.__build_class__ = __build_class__

    def undo() -> None:
        builtins.__build_class__ = original

    return undo


def _is_within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


_active: Rebase | None = None


def rebase(packages: Iterable[str], *, drop_static_markers: bool = False) -> Rebase:
    """Makes the classes of `packages` that subclass `eqx.Module` directly be
    `AutoModule`s, for every class made from now on; call it before importing them.

    **Arguments:**

    - `packages`: package or module names, e.g. `["diffrax", "lineax", "tests"]`;
        their submodules are included.
    - `drop_static_markers`: also remove `static=True` from their `eqx.field`s.

    **Returns:** the installed `Rebase`: what it rebased, `check()`, `undo()`.

    **Raises:** `RebaseError` if a named package is imported already (its classes
    exist, so the rebase could not reach them) or another rebase is active.
    """
    global _active
    names = tuple(dict.fromkeys(p.strip() for p in packages if p.strip()))
    if not names:
        raise RebaseError("autostatic rebase: name at least one package.")
    if _active is not None:
        raise RebaseError(
            f"autostatic rebase: a rebase of {', '.join(_active.packages)} is active "
            "already; name every package in one rebase."
        )
    imported = sorted(m for m in sys.modules if any(_is_within(m, p) for p in names))
    if imported:
        raise RebaseError(
            f"autostatic rebase: {', '.join(imported[:3])} "
            f"{'is' if len(imported) == 1 else 'are'} imported already, so "
            "its classes are eqx.Modules and stay so. Install the rebase before the "
            "first import (pytest: -p autostatic.rebased --autostatic-rebase=...)."
        )
    installed = Rebase(names, drop_static_markers)
    installed._undo.append(_wrap_build_class(installed))
    if drop_static_markers:
        installed._undo.append(wrap_module_creation(installed._drop_markers))
    _active = installed
    return installed


def active_rebase() -> Rebase | None:
    return _active
