"""The Equinox-based libraries a rebased library is built on, from the installed
distributions' metadata.

A class of a rebased library deriving from a class of another Equinox-based library
(flowjax's on paramax's) stays an `eqx.Module` unless that library is rebased too,
and its models are mixed. So a rebase follows, by default, the requirements of each
named package's distribution to those that require Equinox themselves (directly or
through others), and takes their import packages as well. Requirements of optional
extras are not followed: what a library imports unconditionally is what its classes
can derive from.
"""

import importlib.metadata as metadata
import re

# Equinox itself (its classes are what a rebase replaces), and this library.
_NEVER_FOLLOWED = frozenset({"equinox", "autostatic"})
_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def equinox_dependencies(entries: tuple[str, ...]) -> dict[str, str]:
    """The import packages of the installed Equinox-based distributions the
    distributions of `entries` require, each with the entry it is followed from;
    entries themselves, and those providing no distribution (a tests directory,
    `__main__`), are left out."""
    packages_of: dict[str, list[str]] = {}
    distributions_of = metadata.packages_distributions()
    for package, distributions in distributions_of.items():
        for distribution in distributions:
            packages_of.setdefault(_normalised(distribution), []).append(package)
    on_equinox: dict[str, bool] = {}
    followed: dict[str, str] = {}
    for entry in entries:
        top = entry.split(".")[0]
        queue = [_normalised(d) for d in distributions_of.get(top, [])]
        seen = set(queue)
        while queue:
            for required in _requirements(queue.pop()):
                if required in seen or required in _NEVER_FOLLOWED:
                    continue
                seen.add(required)
                if _built_on_equinox(required, on_equinox, set()):
                    queue.append(required)
                    for package in packages_of.get(required, []):
                        if package not in entries and not package.startswith("_"):
                            followed.setdefault(package, entry)
    return followed


def _built_on_equinox(
    distribution: str, known: dict[str, bool], visiting: set[str]
) -> bool:
    """Whether `distribution` requires Equinox, directly or through others."""
    if distribution in known:
        return known[distribution]
    if distribution in visiting:  # a requirement cycle: decided where it started
        return False
    visiting.add(distribution)
    required = _requirements(distribution)
    known[distribution] = "equinox" in required or any(
        _built_on_equinox(r, known, visiting)
        for r in required
        if r not in _NEVER_FOLLOWED
    )
    return known[distribution]


def _requirements(distribution: str) -> list[str]:
    """The normalised names `distribution` requires outside optional extras; none
    if it is not installed."""
    try:
        requirements = metadata.requires(distribution) or []
    except metadata.PackageNotFoundError:
        return []
    names = []
    for requirement in requirements:
        _, _, marker = requirement.partition(";")
        match = _NAME.match(requirement)
        if match is not None and "extra" not in marker:
            names.append(_normalised(match[1]))
    return names


def _normalised(name: str) -> str:
    """A distribution's name as the packaging standards compare them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()
