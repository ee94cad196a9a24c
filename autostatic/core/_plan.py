"""Plans: the way each field of a node is taken, found once per class and tuple of
field value types (`Signature`), and the part each gives its node (`Plan`), in the
vocabulary of `_ways`. A plan holds no value: the aux data of a node is
`(plan, *entries)`."""

import operator
from collections.abc import Callable
from typing import Any, Final

import jax.tree_util as jtu

from ._fields import fields_of, FieldSpec
from ._split import COUNTED_NUMBERS, RECORDS, whole
from ._static import (
    hold,
    named_types,
    natural,
    RAW_ENTRY_TYPES,
    SameDtype,
    Snapshot,
    types_named,
)
from ._ways import (
    BOTH,
    CHILD,
    ENTRY,
    HOLD,
    KEEP,
    PART_OF,
    SPLIT,
    TAKE,
    way_of,
)


class Plan:
    """The part each field gives its node (`_ways`: child, entry or both), with the
    types of the static values that stand alone: `1`, `1.0` and `True` are equal
    under `==` but compile different programs, so their plans differ, and a plan is
    compared by identity (one object per class and key)."""

    __slots__ = (
        "cls",
        "parts",
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

    def __init__(self, spec: FieldSpec, parts: tuple[int, ...], types: Any, exposed):
        self.cls = spec.owner
        self.parts, self.types, self.exposed = parts, types, exposed
        self.names = spec.names
        self.child_keys = tuple(
            key for key, part in zip(spec.keys, parts) if part != ENTRY
        )
        self.entry_names = tuple(n for n, p in zip(spec.names, parts) if p != CHILD)
        # Whether a new static number in its aux is worth noting
        # (`_retrace`: not in a field declared static, whose values Equinox also
        # compiles anew), and the id of the last aux noted (nothing kept alive).
        static = [
            (n, d)
            for n, d, p in zip(spec.names, spec.declared_static, parts)
            if p == ENTRY
        ]
        self.numbers = tuple(
            n for t, (n, d) in zip(types, static) if t in COUNTED_NUMBERS and not d
        )
        self.counted = bool(self.numbers)
        self.last_aux_id = 0
        self.partial = False
        # Where every static entry is its own value (no record, nothing held): the
        # field values in field order, picked out of `children + aux` in one C call.
        self.order = None
        if BOTH not in parts and RAW_ENTRY_TYPES.issuperset(types):
            n_children = sum(p == CHILD for p in parts)
            at, c, e = [], 0, n_children + 1
            for part in parts:
                at.append(c if part == CHILD else e)
                c, e = c + (part == CHILD), e + (part != CHILD)
            self.order = picker(at)

    def key(self) -> tuple[Any, ...]:
        return (self.parts, self.types, self.exposed)

    def __eq__(self, other: object) -> bool:
        return self is other or (
            type(other) is Plan and self.cls is other.cls and self.key() == other.key()
        )

    def __hash__(self) -> int:
        return hash((self.cls, self.parts))

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
        types = named_types(self.types)
        return (_plan_again, (self.cls, self.parts, types, self.exposed, self.partial))


# A node's aux data: `(plan, *entries)`, one entry per field with static data. A
# flat tuple, compared in C on every jit cache lookup: the plan by identity, then each
# entry with `==`; it prints as `(Counted[static step; ...], 1)`, naming the fields.
Aux = tuple


def _plan_again(
    cls: type, parts: Any, types: Any, exposed: bool, partial: bool
) -> "Plan":
    return plan_for(fields_of(cls), parts, types_named(types), exposed, partial)


def entry_types(parts: tuple[int, ...], entries: Any) -> tuple[Any, ...]:
    """The types a plan keys: of each entry's value where it stands alone."""
    out, j = [], 0
    for part in parts:
        if part == ENTRY:
            entry = entries[j]
            out.append(None if _is_record(entry) else _type_keyed(entry))
        if part != CHILD:
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
    parts: tuple[int, ...],
    types: tuple[Any, ...],
    exposed: bool,
    partial: bool = False,
) -> Plan:
    """The plan of `spec`'s class for these parts and entry types (`partial`: of an
    instance still in `__init__`, some fields unset)."""
    key = (parts, types, exposed, partial)
    try:
        return spec.plans[key]
    except KeyError:
        _bound(spec.plans)
        plan = Plan(spec, parts, types, exposed)
        if partial:
            plan.partial = True
            plan.order = None  # `_fill` leaves the unset fields out
        return spec.plans.setdefault(key, plan)


def _bound(cache: dict[Any, Any]) -> None:
    if len(cache) >= _MOST_PLANS:
        cache.clear()


class Signature:
    """What a class's instances whose field values have one tuple of types need:
    the way each field is taken, and where every field is taken or kept as it is, the plan,
    the C calls that pick the children and entries, and the aux itself where there
    is no entry."""

    __slots__ = (
        "ways",
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
        ways: tuple[str, ...],
        plan: Plan | None,
        simple: bool,
        partial: bool = False,
    ):
        self.ways, self.plan, self.partial = ways, plan, partial
        self.tried = 0  # how often code was generated, or could not be, for it
        self.by_value = False  # the plan depends on the values, not just their types
        # Where a field is split: the plan of each tuple of parts met (the entry
        # types follow from the value types and the parts).
        self.resolved: dict[tuple[int, ...], Plan] = {}
        self.children: Callable[[tuple[Any, ...]], tuple[Any, ...]] | None = None
        self.entries: Callable[[tuple[Any, ...]], tuple[Any, ...]] | None = None
        self.aux: Aux | None = None
        if simple:
            self.children = picker([i for i, w in enumerate(ways) if w == TAKE])
            kept = [i for i, w in enumerate(ways) if w == KEEP]
            self.entries = picker(kept)
            if not kept:
                self.aux = (plan,)


def picker(at: list[int]) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """The items of a tuple at `at`, as a tuple, in one C call."""
    if not at or at == list(range(at[0], at[-1] + 1)):  # one item included
        return operator.itemgetter(slice(at[0], at[-1] + 1) if at else slice(0, 0))
    return operator.itemgetter(*at)


def new_signature(spec: FieldSpec, types: tuple[type, ...], values: Any) -> Signature:
    ways = tuple(map(way_of, values, spec.declared_static, spec.array_fields))
    plan = None
    if _Unset in types:  # flattened inside `__init__`: not cached
        return Signature(ways, None, False, partial=True)
    # A class held as a static value is keyed in the plan as a dtype or as a class,
    # by its value (`np.float32` or `int`): the plan is found at each flatten.
    by_value = any(w == HOLD and t is type for w, t in zip(ways, types))
    if SPLIT not in ways and not by_value:
        parts = tuple(map(PART_OF.__getitem__, ways))
        entries = [entry_of(w, v) for w, v in zip(ways, values) if PART_OF[w] == ENTRY]
        plan = plan_for(spec, parts, entry_types(parts, entries), False)
    signature = Signature(ways, plan, set(ways) <= {TAKE, KEEP})
    signature.by_value = by_value
    _bound(spec.signatures)
    return spec.signatures.setdefault(types, signature)


def entry_of(way: str, value: Any) -> Any:
    """The static entry of a field value taken `KEEP`, `HOLD` or `WHOLE`."""
    if way == KEEP:
        return value
    return hold(value) if way == HOLD else whole(value)


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
