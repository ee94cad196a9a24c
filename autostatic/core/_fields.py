"""What an AutoModule class (or a carrier of an `eqx.nn` layer) declares, and the slots
its instances carry.

Fixed when the class is created (`prepare_class`): the field names in order, which
are declared `eqx.field(static=True)`, the dataclass defaults (moved off the class,
so that a lazily unflattened instance's `__getattr__` fills fields in), and the
splits cached per tuple of field types. Each instance has the slot of `Partitioned`
(its `Flat`, written and read by `_layout`), and a carrier also that of
`CarrierBase` (the layer it stands for, `_carriers`); the functions below are their
only accessors.
"""

import dataclasses
import inspect
import operator
from collections.abc import Callable
from typing import Any, Final, NamedTuple

_SPEC: Final = "_autostatic_fields"  # the class attribute holding a `FieldSpec`
_SLOT: Final = "_autostatic_flat"  # the instance slot holding a `_layout.Flat`
CARRIER_OF: Final = (
    "_autostatic_carrier_of"  # class attribute of a carrier: its layer class
)
_LAYER_SLOT: Final = "_autostatic_layer"  # a carrier's slot holding its layer


class FieldSpec(NamedTuple):
    """What the class declares about its fields, fixed when the class is created."""

    names: tuple[str, ...]
    declared_static: tuple[bool, ...]  # `eqx.field(static=True)`
    defaults: dict[str, Any]  # dataclass defaults, moved off the class
    # A carrier of an Equinox layer (`_carriers`), not an AutoModule.
    carrier: bool
    # Per tuple of field value types: the split of instances whose fields are all
    # plain (numbers, strings, None, jax arrays, lone layers), decided by one
    # generated call (`_partition`); None where a type is not plain. (A
    # `_layout.PlainSplit`: the node format builds on this module, not the reverse.)
    plain_splits: dict[tuple[type, ...], Any]
    # The field values of an instance's `__dict__`, in field order, as one tuple
    # (`KeyError` if one is unset).
    read: Callable[[dict[str, Any]], tuple[Any, ...]]
    # The class it describes.
    owner: type

    def __reduce__(self) -> tuple[Any, ...]:
        # As the live class's own: cloudpickle pickles a class defined in a script
        # or notebook by value, and loading it in the same process sets every
        # attribute of the live class again. A copy would detach the class from the
        # layouts its instances and treedefs hold.
        return (fields_of, (self.owner,))


def check_reserved_names(class_name: str, namespace: dict[str, Any]) -> None:
    """Refuses a class body that names what an AutoModule keeps on its class and
    instances (the field spec, the partition slot): either would be shadowed."""
    names = {*namespace, *namespace.get("__annotations__", {})}
    for name in sorted(names & {_SPEC, _SLOT}):
        raise TypeError(
            f"{class_name}.{name}: this name is reserved by autostatic (it holds the "
            "partition of every AutoModule); rename the attribute."
        )


def fields_of(cls: type) -> FieldSpec:
    return getattr(cls, _SPEC)


def is_automodule_class(cls: type) -> bool:
    """An AutoModule class (not a carrier of an Equinox layer)."""
    spec = getattr(cls, _SPEC, None)
    return spec is not None and not spec.carrier


def has_partition(x: Any) -> bool:
    """An AutoModule or a carrier of an Equinox layer: a node whose partition is
    ours."""
    return hasattr(type(x), _SPEC)


def is_partitioned_class(cls: type) -> bool:
    """The class of AutoModules or of carriers: nodes whose partition is ours."""
    return hasattr(cls, _SPEC)


def _field_reader(names: tuple[str, ...]) -> Callable[[dict[str, Any]], tuple]:
    if len(names) >= 2:
        return operator.itemgetter(*names)  # one C call; a tuple for two or more
    if names:
        (name,) = names
        return lambda attrs: (attrs[name],)
    return lambda attrs: ()


def prepare_class(cls: type, *, carrier: bool = False) -> None:
    """Records the fields of a new AutoModule class and moves its dataclass defaults
    off the class: a lazily unflattened instance fills its attributes in through
    `__getattr__`, which a class attribute of the same name would shadow."""
    fields = dataclasses.fields(cls)  # pyright: ignore[reportArgumentType]  # a dataclass by now
    for name in moved_defaults(cls):
        delattr(cls, name)
    spec = FieldSpec(
        names=tuple(f.name for f in fields),
        declared_static=tuple(bool(f.metadata.get("static", False)) for f in fields),
        defaults={
            f.name: f.default for f in fields if f.default is not dataclasses.MISSING
        },
        carrier=carrier,
        plain_splits={},
        read=_field_reader(tuple(f.name for f in fields)),
        owner=cls,
    )
    setattr(cls, _SPEC, spec)


def moved_defaults(cls: type) -> set[str]:
    """The fields whose dataclass default sits on `cls` itself; `prepare_class` moves
    them off the class, so that they cannot shadow unfilled fields. A default that
    overrides a base's attribute of that name (`size: int = 3` over an abstract
    property) stays, as in Equinox: moving it would bring the base's back, and such
    a class fills attributes in at unflatten (`needs_eager`)."""
    inherited = {name for base in cls.__mro__[1:] for name in vars(base)}
    return {
        f.name
        for f in dataclasses.fields(cls)  # pyright: ignore[reportArgumentType]  # a dataclass by now
        if f.default is not dataclasses.MISSING
        and f.name in vars(cls)
        and vars(cls)[f.name] is f.default
        and f.name not in inherited
    }


# The `__getattr__` that fills a lazily unflattened instance in (AutoModule's own).
_filling_getattr: list[Callable[..., Any]] = []


def fills_in(getattr_: Callable[..., Any]) -> Callable[..., Any]:
    """Marks `getattr_` as the `__getattr__` that fills a lazily unflattened
    instance in: a class whose `__getattr__` is another one is filled in at
    unflatten (`needs_eager`)."""
    _filling_getattr.append(getattr_)
    return getattr_


def needs_eager(cls: type) -> bool:
    """Whether a lazily unflattened instance of `cls` could not be filled in on first
    read: a field name still resolves on the class once its own defaults have moved
    (a non-AutoModule base's default, a parent's method of that name), shadowing the
    empty `__dict__`; or the class has a `__getattr__` of its own (a wrapper that
    delegates, a friendlier error), which a first read would reach instead of the
    fill."""
    if inspect.getattr_static(cls, "__getattr__", None) not in _filling_getattr:
        return True
    moved = moved_defaults(cls)
    fields = dataclasses.fields(cls)  # pyright: ignore[reportArgumentType]  # a dataclass by now
    return any(
        f.name in vars(klass)
        for klass in cls.__mro__
        for f in fields
        if not (klass is cls and f.name in moved)
    )


class Partitioned:
    """The base that gives AutoModule instances the slot holding the partition."""

    __slots__ = (_SLOT,)


class CarrierBase(Partitioned):
    """The slot that a carrier adds to its layer class: the layer it stands for."""

    __slots__ = (_LAYER_SLOT,)


# The slots' accessors, C calls (`AttributeError` for a slot never set).
get_flat: Callable[[Any], Any] = Partitioned._autostatic_flat.__get__  # pyright: ignore[reportAttributeAccessIssue]  # a slot's member descriptor
set_flat: Callable[[Any, Any], None] = Partitioned._autostatic_flat.__set__  # pyright: ignore[reportAttributeAccessIssue]  # a slot's member descriptor
get_layer: Callable[[Any], Any] = CarrierBase._autostatic_layer.__get__  # pyright: ignore[reportAttributeAccessIssue]  # a slot's member descriptor
set_layer: Callable[[Any, Any], None] = CarrierBase._autostatic_layer.__set__  # pyright: ignore[reportAttributeAccessIssue]  # a slot's member descriptor


def carrier_stores(carrier: str, flat: str, layer: str) -> tuple[str, str]:
    """The statements (source, for generated code) that set the two slots of a new
    carrier named `carrier` to the expressions `flat` and `layer`. Attribute stores:
    a carrier class keeps object's `__setattr__` (`_carriers`), so CPython
    specialises each to a direct slot write, where `set_flat` and `set_layer` are
    method-wrapper calls of ~35 ns each, on every held layer's unflatten."""
    return f"{carrier}.{_SLOT} = {flat}", f"{carrier}.{_LAYER_SLOT} = {layer}"
