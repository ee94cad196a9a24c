"""What a class declares about its fields (an AutoModule class, or an `eqx.nn` layer
class held in one), fixed when it is first needed: `FieldSpec`."""

import dataclasses
import operator
import weakref
from collections.abc import Callable
from typing import Any, Final

import jax.tree_util as jtu

from ._annotations import array_fields, number_fields, python_fields
from ._carriers import is_carried_class

_SPEC: Final = "_autostatic_fields"  # the class attribute holding its `FieldSpec`


class FieldSpec:
    """The fields of a class, in declaration order: their names, which are declared
    `eqx.field(static=True)`, which are annotated to hold arrays, their key paths,
    and how to read all of their values out of an instance's `__dict__` at once.
    `signatures` and `plans` hold what `_plan` found for the class: per tuple of
    field value types, and per kinds of fields."""

    __slots__ = (
        "owner",
        "names",
        "declared_static",
        "keys",
        "read",
        "signatures",
        "plans",
        "_array_fields",
        "_number_fields",
        "_python_fields",
        "flatten",
        "general_flatten",
        "generated",
        "general_carrier",
    )

    def __init__(self, owner: type):
        fields = dataclasses.fields(owner)  # pyright: ignore[reportArgumentType]  # a dataclass
        self.owner = owner
        self.names = tuple(f.name for f in fields)
        self.declared_static = tuple(bool(f.metadata.get("static")) for f in fields)
        self.keys = tuple(FieldKey(n) for n in self.names)
        self.read = _reader(self.names)
        self.signatures: dict[tuple[type, ...], Any] = {}
        self.plans: dict[Any, Any] = {}
        self._array_fields: tuple[bool, ...] | None = None
        self._number_fields: tuple[bool, ...] | None = None
        self._python_fields: tuple[str | None, ...] | None = None
        # The class's flatten now, and the one that takes any instance: set by
        # `_plan.install_flatten`.
        self.flatten: Callable[[Any], Any] = _no_flatten
        self.general_flatten: Callable[[Any], Any] = _no_flatten
        # The globals of each flatten generated for field types met, in the order
        # tried: a miss calls the next one's (`general`), the last the general one.
        self.generated: list[dict[str, Any]] = []
        # For a layer class held in AutoModules: what makes a carrier of any layer.
        self.general_carrier: Callable[[Any], Any] = _no_flatten

    @property
    def array_fields(self) -> tuple[bool, ...]:
        """Per field, whether its annotation admits an array: resolved when the first
        instance is decided, so that names defined after the class resolve. None of
        a carried `eqx.nn` layer's: Equinox's layers hold their parameters as arrays,
        and a number in one is a constant (a pool's `init`, `-inf`: a leaf, `jax.grad`
        would differentiate it and `jax.vmap` batch it)."""
        found = self._array_fields
        if found is None:
            if is_carried_class(self.owner):
                found = (False,) * len(self.names)
            else:
                found = array_fields(self.owner, self.names)
            self._array_fields = found
        return found

    @property
    def number_fields(self) -> tuple[bool, ...]:
        """Per field, whether its annotation admits only Python numbers (resolved
        as `array_fields` is)."""
        found = self._number_fields
        if found is None:
            found = self._number_fields = number_fields(self.owner, self.names)
        return found

    @property
    def python_fields(self) -> tuple[str | None, ...]:
        """Per field, its annotation where it admits only Python values (numbers,
        strings, containers of them), else None (resolved as `array_fields` is)."""
        found = self._python_fields
        if found is None:
            found = self._python_fields = python_fields(self.owner, self.names)
        return found

    def __reduce__(self) -> tuple[Any, ...]:
        # As the live class's own: cloudpickle pickles a class defined in a script or
        # notebook by value, and loading it in the same process sets every attribute
        # of the live class again.
        return (fields_of, (self.owner,))


class FieldKey(jtu.GetAttrKey):
    """The key of a field's child in a key path: a `GetAttrKey`, equal to Equinox's
    and printed as it, with the `key` JAX's report of a prefix tree that does not
    match reads of every key (there, a `GetAttrKey` raises AttributeError, and a
    static field of an AutoModule makes that report)."""

    __slots__ = ()

    @property
    def key(self) -> str:
        return self.name


def _no_flatten(obj: Any) -> Any:
    raise AssertionError("a FieldSpec's flatten is installed before its first use")


def _reader(names: tuple[str, ...]) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    """The values of `names` in a dict, as one tuple (`KeyError` if one is unset)."""
    if len(names) >= 2:
        return operator.itemgetter(*names)  # one C call
    if names:
        (name,) = names
        return lambda attrs: (attrs[name],)
    return lambda attrs: ()


def check_reserved_names(class_name: str, namespace: dict[str, Any]) -> None:
    """Refuses a class body that names what autostatic keeps on the class."""
    names = {*namespace, *namespace.get("__annotations__", {})}
    for name in sorted(names & {_SPEC}):
        raise TypeError(
            f"{class_name}.{name}: this name is reserved by autostatic; rename the "
            "attribute."
        )


# The specs of classes made elsewhere (`eqx.nn` layers), which carry none of ours.
_foreign: "weakref.WeakKeyDictionary[type, FieldSpec]" = weakref.WeakKeyDictionary()


def prepare_class(cls: type) -> None:
    """Records the fields of a new AutoModule class (in the spec its flatten
    functions, made while Equinox creates the class, already hold)."""
    setattr(cls, _SPEC, fields_of(cls))


def fields_of(cls: type) -> FieldSpec:
    """The `FieldSpec` of an AutoModule class, or of any other dataclass (made once)."""
    spec = vars(cls).get(_SPEC)
    if spec is not None:
        return spec
    try:
        return _foreign[cls]
    except KeyError:
        return _foreign.setdefault(cls, FieldSpec(cls))
