"""Objects remembered by identity while they live: what a check once found fine.

A check of a static value (a function hides no array; a callable wraps none) is
repeated for every module built around the same value (`jax.nn.relu` in every block).
Remembered by identity, not equality (an object equal to a clean one may hide an
array, and a user's `__eq__` may raise), and weakly: a remembered object that dies
leaves the set, so a new object at its address is checked anew.
"""

import contextlib
import weakref
from typing import Any


class WeakIdentitySet:
    """A set of objects by identity, holding none of them alive. An object that
    cannot be weakly referenced is never remembered."""

    __slots__ = ("_refs", "__weakref__")

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref[Any]] = {}

    def __contains__(self, value: Any) -> bool:
        ref = self._refs.get(id(value))
        return ref is not None and ref() is value

    def add(self, value: Any) -> None:
        key = id(value)
        refs = self._refs
        with contextlib.suppress(TypeError):  # not weakly referenceable: not kept
            refs[key] = weakref.ref(value, lambda _: refs.pop(key, None))
