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
import pathlib
import sys
import threading
import types
from collections.abc import Callable, Iterable
from typing import Any

import equinox as eqx

from .._compat import ModuleMeta, wrap_module_creation
from ..core._checks import send_problems_to
from ..core._module import AutoModule
from ._dependencies import equinox_dependencies


class RebaseError(RuntimeError):
    """A rebase that could not take effect."""


class Rebase:
    """An installed rebase: what it changed so far, per named package."""

    def __init__(
        self,
        packages: tuple[str, ...],
        drop_static_markers: bool,
        followed: dict[str, str] | None = None,
    ):
        # Equinox-based packages the named ones are built on, taken too
        # (`_dependencies`): {package: the entry it was followed from}.
        self.followed = dict(followed or {})
        packages = packages + tuple(p for p in self.followed if p not in packages)
        self.packages = packages
        # An entry naming a directory or file (`tests`, with or without an
        # `__init__.py`, whose modules pytest imports by their basenames) also takes
        # every module whose file lies under it.
        self.paths = {p: _existing_path(p) for p in packages}
        # Classes of the named packages deriving from an Equinox class of a package
        # not named (`flowjax` on `paramax`): left on `eqx.Module`, so the model is
        # mixed. `(class, base)` names.
        self.left_mixed: list[tuple[str, str]] = []
        # The first problem `check_field` found in each rebased class, said in the
        # summary instead of warned of (`_take_problem`).
        self.problems: dict[str, str] = {}
        self.drop_static_markers = drop_static_markers
        self.rebased: dict[str, list[str]] = {p: [] for p in packages}
        # Modules whose class statements an entry took: a script run by `runpy` is
        # never in `sys.modules` once it has run.
        self.seen: dict[str, set[str]] = {p: set() for p in packages}
        self.markers_dropped: dict[str, int] = dict.fromkeys(packages, 0)
        self._undo: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def package_of(self, module: str, file: str | None = None) -> str | None:
        """The entry that takes the module named `module` (defined in `file`)."""
        for package in self.packages:
            if _is_within(module, package) or _is_under(file, self.paths[package]):
                return package
        return None

    def imported(self, package: str) -> list[str]:
        """The modules of `sys.modules` that `package` takes, and those whose class
        statements it took."""
        path = self.paths[package]
        return sorted(
            {
                name
                for name, module in list(sys.modules.items())
                if _is_within(name, package)
                or (
                    path is not None
                    and _is_under(getattr(module, "__file__", None), path)
                )
            }
            | self.seen[package]
        )

    def _rebase_class_statement(
        self,
        module: str,
        file: str | None,
        name: str,
        bases: tuple[Any, ...],
        kwds: dict[str, Any],
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The bases and keywords of a class statement in `module`: `eqx.Module` as
        a base becomes `AutoModule`, and Equinox's metaclass (as a base of a library's
        own metaclass, or given as `metaclass=`) becomes AutoModule's."""
        package = self.package_of(module, file)
        if package is None:
            return bases, kwds
        with self._lock:
            self.seen[package].add(module)
        auto_meta = type(AutoModule)
        if eqx.Module in bases:
            bases = tuple(AutoModule if b is eqx.Module else b for b in bases)
            with self._lock:
                self.rebased[package].append(f"{module}.{name}")
        for base in bases:
            if self._left_on_equinox(base):
                with self._lock:
                    self.left_mixed.append((f"{module}.{name}", _qualname(base)))
        if ModuleMeta in bases:
            bases = tuple(auto_meta if b is ModuleMeta else b for b in bases)
        if kwds.get("metaclass") is ModuleMeta:
            kwds = {**kwds, "metaclass": auto_meta}
        return bases, kwds

    def _take_problem(self, cls: type, message: str) -> bool:
        """Keeps the first problem of each class of a named package, for the
        summary; a class of anyone else's is warned of as usual."""
        file = getattr(sys.modules.get(cls.__module__), "__file__", None)
        if self.package_of(cls.__module__, file) is None:
            return False
        with self._lock:
            if len(self.problems) < _MOST_PROBLEMS_KEPT:
                self.problems.setdefault(_qualname(cls), message)
        return True

    def _left_on_equinox(self, base: Any) -> bool:
        """`base` is an Equinox class of a package that is neither named nor
        Equinox's own: a subclass of it stays an `eqx.Module`."""
        if not (isinstance(base, type) and issubclass(base, eqx.Module)):
            return False
        if issubclass(base, AutoModule):
            return False
        top = base.__module__.split(".")[0]
        return top != "equinox" and self.package_of(base.__module__) is None

    def _drop_markers(
        self, bases: tuple[type, ...], namespace: dict[str, Any]
    ) -> dict[str, Any]:
        """The namespace of a new AutoModule class of a named package, without
        `static=True` in its fields."""
        module = str(namespace.get("__module__", ""))
        file = getattr(sys.modules.get(module), "__file__", None)
        package = self.package_of(module, file)
        if package is None or not any(issubclass(b, AutoModule) for b in bases):
            return namespace
        namespace, dropped = _without_static_markers(namespace)
        with self._lock:
            self.markers_dropped[package] += dropped
        return namespace

    def summary(self) -> str:
        parts = [
            f"{p}{f' (a dependency of {self.followed[p]})' if p in self.followed else ''}"
            f": {len(self.rebased[p])} direct eqx.Module subclasses rebased"
            + (
                f", {self.markers_dropped[p]} static markers dropped"
                if self.drop_static_markers
                else ""
            )
            for p in self.packages
        ]
        lines = ["autostatic rebase: " + "; ".join(parts)]
        if self.left_mixed:
            lines.append(str(self.mixed_warning()))
        if self.problems:
            lines.append(
                f"autostatic rebase: {len(self.problems)} rebased class(es) hold "
                "values AutoModule warns of (said here, once per class, not as "
                "warnings):"
            )
            lines += [f"  {message}" for message in self.problems.values()]
        return "\n".join(lines)

    def mixed_warning(self) -> str | None:
        """What to say of classes left on `eqx.Module` (`left_mixed`), if any."""
        if not self.left_mixed:
            return None
        shown = ", ".join(f"{c} (on {b})" for c, b in self.left_mixed[:3])
        more = len(self.left_mixed) - 3
        packages = sorted({b.split(".")[0] for _, b in self.left_mixed})
        return (
            f"autostatic rebase: {len(self.left_mixed)} class(es) derive from Equinox "
            f"classes of packages not rebased, so they stay eqx.Modules and their "
            f"models are mixed: {shown}{f', and {more} more' if more > 0 else ''}. "
            f"Add {', '.join(packages)} to the rebase."
        )

    def check(self, *, imported_only: bool = False) -> None:
        """Raises `RebaseError` if a named package was never imported (with
        `imported_only`, not checked), or if no class at all was rebased. A package
        imported after the rebase was installed had every class rebased that has
        `eqx.Module` as a direct base: it may legitimately have none (a test package
        using the library's classes)."""
        for package in self.packages:
            if package in self.followed:  # imported or not, as the library needs
                continue
            if not imported_only and not self.imported(package):
                # A script run by runpy counts once it makes a class: one that makes
                # none cannot be told from one never run.
                never = (
                    "was never imported or makes no class"
                    if self.paths[package] is not None
                    else "was never imported"
                )
                raise RebaseError(
                    f"autostatic rebase: {package!r} {never}, so nothing in it was "
                    "rebased. Name a package or module, or a directory or file of "
                    "modules (such as the tests' directory)."
                )
        if not any(self.rebased.values()) and (
            not imported_only or any(self.imported(p) for p in self.packages)
        ):
            raise RebaseError(
                f"autostatic rebase: no class of {', '.join(map(repr, self.packages))} "
                "was rebased: none of them defines a class with eqx.Module as a "
                "direct base."
                + (f"\n{self.mixed_warning()}" if self.left_mixed else "")
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
        globals_ = getattr(func, "__globals__", {})
        module, file = globals_.get("__name__", ""), globals_.get("__file__")
        new_bases, kwds = installed._rebase_class_statement(
            module, file, name, bases, kwds
        )
        return original(func, name, *new_bases, **kwds)

    builtins.__build_class__ = __build_class__

    def undo() -> None:
        builtins.__build_class__ = original

    return undo


def _is_within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _existing_path(entry: str) -> pathlib.Path | None:
    path = pathlib.Path(entry)
    return path.resolve() if path.exists() else None


def _is_under(file: str | None, path: pathlib.Path | None) -> bool:
    if file is None or path is None:
        return False
    resolved = pathlib.Path(file).resolve()
    return resolved == path or path in resolved.parents


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


_active: Rebase | None = None
# Problems kept for a summary, at most: one per class.
_MOST_PROBLEMS_KEPT = 100


def _refuse_imported(installed: Rebase, names: tuple[str, ...]) -> None:
    """Raises if a named package is imported already (its classes exist). `__main__`
    (a script or notebook rebasing the classes it defines from here on) always is."""
    imported = sorted(
        {m for p in names if p != "__main__" for m in installed.imported(p)}
    )
    if imported:
        raise RebaseError(
            f"autostatic rebase: {', '.join(imported[:3])} "
            f"{'is' if len(imported) == 1 else 'are'} imported already, so "
            "its classes are eqx.Modules and stay so. Install the rebase before the "
            "first import (pytest: -p autostatic.rebased --autostatic-rebase=...)."
        )


def rebase(
    packages: Iterable[str],
    *,
    drop_static_markers: bool = False,
    follow_dependencies: bool = True,
) -> Rebase:
    """Makes the classes of `packages` that subclass `eqx.Module` directly be
    `AutoModule`s, for every class made from now on; call it before importing them.

    **Arguments:**

    - `packages`: package or module names, e.g. `["diffrax", "lineax"]`, their
        submodules included; an entry that names an existing directory or file
        (`"tests"`, relative to the working directory) also takes every module
        defined in a file under it, with or without an `__init__.py`. `"__main__"`
        takes the classes a script or notebook defines after this call.
    - `drop_static_markers`: also remove `static=True` from their `eqx.field`s.
    - `follow_dependencies`: also rebase the installed Equinox-based libraries the
        named packages' distributions require (paramax for flowjax; lineax and
        optimistix for diffrax), so that no class of theirs is left deriving from
        an `eqx.Module` of another library. One imported already is left as it is.

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
    followed = equinox_dependencies(names) if follow_dependencies else {}
    installed = Rebase(
        names,
        drop_static_markers,
        {p: e for p, e in followed.items() if p not in sys.modules},
    )
    _refuse_imported(installed, names)
    installed._undo.append(_wrap_build_class(installed))
    send_problems_to(installed._take_problem)
    installed._undo.append(lambda: send_problems_to(None))
    if drop_static_markers:
        installed._undo.append(wrap_module_creation(installed._drop_markers))
    _active = installed
    return installed


def active_rebase() -> Rebase | None:
    return _active
