"""How a field's value is taken into its node: the one vocabulary of the rule
(here), the plans (`_plan`, per type of field value), the split (`_split`, per value)
and the code generated per class (`_generated`).

A field gives its node one **part** (`Plan.parts`): `CHILD`, its value as a pytree
child; `ENTRY`, a static entry in the aux; or `BOTH`, a child with holes and the
entry that fills them.

The **way** a field value is taken, found by the rule from its category (`_leaves`)
and the field's declaration (`way_of`), and for an item of a list or tuple, likewise
(`item_way`):

- `TAKE`: the child is the value, as it is (an array, a module, `None`);
- `CARRY`: the child is an `eqx.nn` layer's carrier (`_carriers`);
- `KEEP`: the entry is the value, as it is (an int, a string);
- `HOLD`: the entry is the value as `_static.hold` holds it (a float, a dtype);
- `WHOLE`: the field is declared `eqx.field(static=True)`: the entry is the value,
  whole;
- `SPLIT`: a container or a numpy array: its part follows from its value (`_split`).

The generated code takes some of these more narrowly, for the values a class's
instances hold (each checked there; any other value takes the rule's way):

- `HOLD_FLOAT`: `HOLD` of a float, held only where it is a zero or a NaN;
- `SEQUENCE`: `SPLIT` or `WHOLE` of a list or tuple of ints, bools and strings: the
  entry, a `StaticSeq`;
- `TREE`: `SPLIT` of lists, tuples and dicts of arrays, modules and `None`: the
  child, as it is;
- `LAYERS`: `SPLIT` of a list or tuple of `eqx.nn` layers: the child, of carriers;
- `ITEMS`: `SPLIT` of a list or tuple whose items are taken `TAKE`, `CARRY` or
  `KEEP` by place: both parts;
- `ROWS`: `SPLIT` of a list or tuple of records, tuples of one length split by
  column (`_split.records`): both parts.
"""

from typing import Any, Final

from ._leaves import (
    ARRAY,
    CARRIER,
    category,
    CONTAINER,
    is_fieldless_namedtuple,
    jax_holds,
    LAYER,
    NDARRAY,
    NODE,
    NONE,
    NUMBER,
    SHAPE,
)
from ._static import held_as_themselves

# Parts: ints, as pickled plans hold them.
CHILD: Final = 0
ENTRY: Final = 1
BOTH: Final = 2

TAKE: Final = "take"
CARRY: Final = "carry"
KEEP: Final = "keep"
HOLD: Final = "hold"
WHOLE: Final = "whole"
SPLIT: Final = "split"

HOLD_FLOAT: Final = "hold float"
SEQUENCE: Final = "sequence"
TREE: Final = "tree"
LAYERS: Final = "layers"
ITEMS: Final = "items"
ROWS: Final = "rows"

# The part each way gives, but `SPLIT`'s, which its value decides.
PART_OF: Final = {
    TAKE: CHILD,
    CARRY: CHILD,
    TREE: CHILD,
    LAYERS: CHILD,
    KEEP: ENTRY,
    HOLD: ENTRY,
    WHOLE: ENTRY,
    HOLD_FLOAT: ENTRY,
    SEQUENCE: ENTRY,
    ITEMS: BOTH,
    ROWS: BOTH,
}


def way_of(value: Any, declared_static: bool, array_field: bool) -> str:
    """The way a field takes values of `value`'s type: a numpy array's part follows
    from its dtype, which is per value (`SPLIT`); any other as `item_way` says."""
    if declared_static:
        return WHOLE if category(value) == CONTAINER else static_way(value)
    if category(value) == NDARRAY:
        return SPLIT
    return item_way(value, array_field)


def item_way(x: Any, array_field: bool) -> str:
    """The way `x`, a field's value or an item of its list or tuple, is taken: an
    array, a module, `None` or `MaskedNode()` as it is, a layer as its carrier, a number or
    `ShapeDtypeStruct` as an array in a field annotated to hold arrays, a container
    split, anything else static."""
    cat = category(x)
    if cat in (ARRAY, NODE, NONE) or (cat == NDARRAY and jax_holds(x.dtype)):
        return TAKE
    if cat in (LAYER, CARRIER):
        return CARRY
    if array_field and cat in (NUMBER, SHAPE):
        return TAKE
    if cat == CONTAINER:
        return TAKE if is_fieldless_namedtuple(x) else SPLIT
    return static_way(x)


def static_way(value: Any) -> str:
    """`KEEP` for a static value of a type `hold` never wraps, `HOLD` for any other,
    decided by the type alone: a float is held exactly whenever it is a zero or a
    NaN, and a class whenever it is a numpy scalar type, whatever the value this type
    was first met with."""
    return KEEP if held_as_themselves((type(value),)) else HOLD
