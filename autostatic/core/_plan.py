"""Plans: which field of a node is a child, a static entry, or both, found once
per class and tuple of field value types (`Signature`) and per kinds of fields
(`Plan`). A plan holds no value: the aux data of a node is `(plan, *entries)`."""

import operator
import types
from collections.abc import Callable
from typing import Any, Final

import jax.tree_util as jtu

from . import _retrace
from ._fields import fields_of, FieldSpec
from ._leaves import (
    ARRAY,
    CARRIER,
    category,
    CONTAINER,
    LAYER,
    NDARRAY,
    NODE,
    NONE,
    NUMBER,
    SHAPE,
)
from ._split import CHILD, MIXED, RECORDS, STATIC, whole
from ._static import held_as_themselves, hold, natural, SameDtype, Snapshot

# How a field's value of one type becomes part of the node (`Signature.actions`).
TAKE: Final = 0  # the child, as it is
CARRY: Final = 1  # the child, a layer's carrier
KEEP: Final = 2  # a static entry, as it is
HOLD: Final = 3  # a static entry, as `hold` holds it
SPLIT: Final = 4  # split by `_split.split`: its kind follows from its value
WHOLE: Final = 5  # declared `eqx.field(static=True)`: a static entry, whole


class Plan:
    """Which field is a child, a static entry, or both (`_split`'s kinds), with the
    types of the static values that stand alone: `1`, `1.0` and `True` are equal
    under `==` but compile different programs, so their plans differ, and a plan is
    compared by identity (one object per class and key)."""

    __slots__ = (
        "cls",
        "kinds",
        "types",
        "exposed",
        "names",
        "child_keys",
        "entry_names",
        "numbers",
        "counted",
        "last_aux_id",
        "order",
        "partial",
        "__weakref__",
    )

    def __init__(self, spec: FieldSpec, kinds: tuple[int, ...], types: Any, exposed):
        self.cls = spec.owner
        self.kinds, self.types, self.exposed = kinds, types, exposed
        self.names = spec.names
        self.child_keys = tuple(
            key for key, kind in zip(spec.keys, kinds) if kind != STATIC
        )
        self.entry_names = tuple(n for n, k in zip(spec.names, kinds) if k != CHILD)
        # Whether a new static number in its aux is worth noting
        # (`_retrace`: not in a field declared static, whose values Equinox also
        # compiles anew), and the id of the last aux noted (nothing kept alive).
        static = [
            (n, d)
            for n, d, k in zip(spec.names, spec.declared_static, kinds)
            if k == STATIC
        ]
        self.numbers = tuple(
            n
            for t, (n, d) in zip(types, static)
            if t in _retrace.COUNTED_TYPES and not d
        )
        self.counted = bool(self.numbers)
        self.last_aux_id = 0
        self.partial = False
        # Where every static entry is its own value (no record, nothing held): the
        # field values in field order, picked out of `children + aux` in one C call.
        self.order = None
        if MIXED not in kinds and all(t in _RAW for t in types):
            n_children = sum(k == CHILD for k in kinds)
            at, c, e = [], 0, n_children + 1
            for kind in kinds:
                at.append(c if kind == CHILD else e)
                c, e = c + (kind == CHILD), e + (kind != CHILD)
            self.order = picker(at)

    def key(self) -> tuple[Any, ...]:
        return (self.kinds, self.types, self.exposed)

    def __eq__(self, other: object) -> bool:
        return self is other or (
            type(other) is Plan and self.cls is other.cls and self.key() == other.key()
        )

    def __hash__(self) -> int:
        return hash((self.cls, self.kinds))

    def __repr__(self) -> str:
        # JAX prints it in every error about differing pytree metadata, the one place
        # a user bumping a static counter learns what went wrong.
        name = self.cls.__qualname__
        if not self.entry_names:
            return name
        hint = ""
        if self.numbers:
            fields = ", ".join(f"{name}.{n}" for n in self.numbers)
            hint = (
                f"; {fields}: a Python number, static, so each value is another "
                'pytree; to make it a leaf, annotate it as an array (`Int[ArrayLike, ""]`'
                ", `Float[...]`) or as the module class it stands for, or keep it "
                "outside the model"
            )
        return f"{name}[static {', '.join(self.entry_names)}{hint}]"

    def __reduce__(self) -> tuple[Any, ...]:
        # As the live plan of the class: found again by its key, the types of the
        # `types` module by name.
        types = tuple(_NAMES_OF_TYPES.get(t, t) for t in self.types)
        return (_plan_again, (self.cls, self.kinds, types, self.exposed, self.partial))


# Types whose static values the aux holds as they are (never wrapped by `hold`), so
# that they are the attribute values themselves.
_RAW: Final = frozenset({int, bool, str, bytes, type(None)})


# A node's aux data: `(plan, *entries)`, one entry per field with static data. A
# flat tuple, compared in C on every jit cache lookup: the plan by identity, then each
# entry with `==`; it prints as `(Counted[static step; ...], 1)`, naming the fields.
Aux = tuple


def _plan_again(
    cls: type, kinds: Any, types: Any, exposed: bool, partial: bool
) -> "Plan":
    return plan_for(
        fields_of(cls), kinds, tuple(map(_type_of, types)), exposed, partial
    )


# The types of the `types` module (a function's, a builtin's, ...), which pickle
# cannot name: a plan holds them by name.
_UNNAMED_TYPES: Final = {
    f"types.{name}": value
    for name, value in vars(types).items()
    if isinstance(value, type) and not name.startswith("_")
}
_NAMES_OF_TYPES: Final = {value: name for name, value in _UNNAMED_TYPES.items()}


def _type_of(named: Any) -> Any:
    return _UNNAMED_TYPES.get(named, named) if type(named) is str else named


def entry_types(kinds: tuple[int, ...], entries: Any) -> tuple[Any, ...]:
    """The types a plan keys: of each entry's value where it stands alone."""
    out, j = [], 0
    for kind in kinds:
        if kind == STATIC:
            entry = entries[j]
            out.append(None if _is_record(entry) else _type_keyed(entry))
        if kind != CHILD:
            j += 1
    return tuple(out)


def _type_keyed(entry: Any) -> type:
    """The type a plan keys for a held entry: its value's (`1`, `1.0` and `True`
    differ), but one for every dtype specifier, as they are one value."""
    if type(entry) is SameDtype:
        return SameDtype
    if type(entry) is Snapshot:  # without copying it
        return entry.kind
    return type(natural(entry))


def _is_record(entry: Any) -> bool:
    return type(entry) in RECORDS


# Plans are cached per class (`FieldSpec.plans`); bounded, as a class can meet many
# types (a field given a new class each time): past this, the cache starts again.
_MOST_PLANS: Final = 256


def plan_for(
    spec: FieldSpec,
    kinds: tuple[int, ...],
    types: tuple[Any, ...],
    exposed: bool,
    partial: bool = False,
) -> Plan:
    """The plan of `spec`'s class for these kinds and entry types (`partial`: of an
    instance still in `__init__`, some fields unset)."""
    key = (kinds, types, exposed, partial)
    try:
        return spec.plans[key]
    except KeyError:
        _bound(spec.plans)
        plan = Plan(spec, kinds, types, exposed)
        if partial:
            plan.partial = True
            plan.order = None  # `_fill` leaves the unset fields out
        return spec.plans.setdefault(key, plan)


def _bound(cache: dict[Any, Any]) -> None:
    if len(cache) >= _MOST_PLANS:
        cache.clear()


class Signature:
    """What a class's instances whose field values have one tuple of types need:
    each field's action, and where every field is taken or kept as it is, the plan,
    the C calls that pick the children and entries, and the aux itself where there
    is no entry."""

    __slots__ = (
        "actions",
        "plan",
        "children",
        "entries",
        "aux",
        "resolved",
        "partial",
        "tried",
        "by_value",
    )

    def __init__(
        self,
        actions: tuple[int, ...],
        plan: Plan | None,
        simple: bool,
        partial: bool = False,
    ):
        self.actions, self.plan, self.partial = actions, plan, partial
        self.tried = False  # whether code was generated, or could not be, for it
        self.by_value = False  # the plan depends on the values, not just their types
        # Where a field is split: the plan of each kinds of fields met (the entry
        # types follow from the value types and the kinds).
        self.resolved: dict[tuple[int, ...], Plan] = {}
        self.children: Callable[[tuple[Any, ...]], tuple[Any, ...]] | None = None
        self.entries: Callable[[tuple[Any, ...]], tuple[Any, ...]] | None = None
        self.aux: Aux | None = None
        if simple:
            self.children = picker([i for i, a in enumerate(actions) if a == TAKE])
            kept = [i for i, a in enumerate(actions) if a == KEEP]
            self.entries = picker(kept)
            if not kept:
                self.aux = (plan,)


def picker(at: list[int]) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """The items of a tuple at `at`, as a tuple, in one C call."""
    if not at or at == list(range(at[0], at[-1] + 1)):
        return operator.itemgetter(slice(at[0], at[-1] + 1) if at else slice(0, 0))
    if len(at) == 1:
        return operator.itemgetter(slice(at[0], at[0] + 1))
    return operator.itemgetter(*at)


def _action(value: Any, declared_static: bool, array_field: bool) -> int:
    """What becomes of a field value of this type (see `TAKE` ...)."""
    cat = category(value)
    if declared_static:
        if cat == CONTAINER:
            return WHOLE
        return _static_action(value)
    if cat in (ARRAY, NONE, NODE):
        return TAKE
    if cat in (LAYER, CARRIER):
        return CARRY
    if cat in (NUMBER, SHAPE):
        if array_field:
            return TAKE
        return KEEP if type(value) in (int, bool) else HOLD
    if cat in (NDARRAY, CONTAINER):
        return SPLIT
    return _static_action(value)


def _static_action(value: Any) -> int:
    """KEEP for a static value of a type `hold` never wraps, HOLD for any other,
    decided by the type alone: a float is held exactly whenever it is a zero or a
    NaN, and a class whenever it is a numpy scalar type, whatever the value this
    type was first met with."""
    return KEEP if held_as_themselves((type(value),)) else HOLD


def new_signature(spec: FieldSpec, types: tuple[type, ...], values: Any) -> Signature:
    actions = tuple(
        map(_action, values, spec.declared_static, spec.array_fields),
    )
    plan = None
    if _Unset in types:  # flattened inside `__init__`: not cached
        return Signature(actions, None, False, partial=True)
    # A class held as a static value is keyed in the plan as a dtype or as a class,
    # by its value (`np.float32` or `int`): the plan is found at each flatten.
    by_value = any(a == HOLD and t is type for a, t in zip(actions, types))
    if SPLIT not in actions and not by_value:
        kinds = tuple(CHILD if a in (TAKE, CARRY) else STATIC for a in actions)
        entries = [entry_of(a, v) for a, v in zip(actions, values) if a >= KEEP]
        plan = plan_for(spec, kinds, entry_types(kinds, entries), False)
    signature = Signature(actions, plan, set(actions) <= {TAKE, KEEP})
    signature.by_value = by_value
    _bound(spec.signatures)
    return spec.signatures.setdefault(types, signature)


def entry_of(action: int, value: Any) -> Any:
    if action == KEEP:
        return value
    return hold(value) if action == HOLD else whole(value)


class _Unset:
    """The value of a field not yet set, flattened from inside `__init__`: an empty
    child, as Equinox's flatten gives one."""


UNSET: Final = _Unset()
jtu.register_pytree_node(_Unset, lambda _: ((), None), lambda _, __: UNSET)


_object_getattribute = object.__getattribute__


def values_while_built(spec: FieldSpec, obj: Any) -> tuple[Any, ...]:
    """The field values of an instance still in `__init__`, `UNSET` where unset."""
    attrs = _object_getattribute(obj, "__dict__")
    return tuple(attrs.get(name, UNSET) for name in spec.names)
