"""A static value that can change in place (it has no hash: a deque, a bytearray,
an `array.array`, a list or dict subclass JAX takes for a leaf, a dataclass that is
not frozen) is held as it was at the flatten: changed after a trace, it is another
static value and `jax.jit` traces anew, where Equinox's `filter_jit` refuses it."""

import array
import collections
import dataclasses
import warnings
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest

import autostatic as asx


class Scaled(asx.AutoModule):
    scales: Any
    w: jax.Array

    def __call__(self) -> jax.Array:
        return self.w * sum(self.scales)


class Twin(eqx.Module):  # as Equinox users write it: no marker, `eqx.filter_jit`
    scales: Any
    w: jax.Array

    def __call__(self) -> jax.Array:
        return self.w * sum(self.scales)


class Numbers(list):
    pass


class Named(dict):
    def __iter__(self):  # `sum` over its values
        return iter(list(self.values()))


@dataclasses.dataclass
class Config:
    a: float

    def __iter__(self):
        return iter([self.a])


def _set_first(value: Any, new: float) -> None:
    if isinstance(value, Config):
        value.a = new
    elif isinstance(value, Named):
        value["a"] = new
    else:
        value[0] = int(new) if isinstance(value, bytearray) else new


MUTABLES = {
    "deque": lambda: collections.deque([1.0]),
    "bytearray": lambda: bytearray(b"\x01"),
    "array.array": lambda: array.array("d", [1.0]),
    "list subclass": lambda: Numbers([1.0]),
    "dict subclass": lambda: Named(a=1.0),
    "dataclass": lambda: Config(1.0),
}


@pytest.mark.parametrize("make", MUTABLES.values(), ids=MUTABLES.keys())
def test_a_static_value_changed_in_place_is_a_new_static_value(make):
    scales = make()
    model = Scaled(scales, jnp.ones(()))
    traces = []
    jitted = jax.jit(lambda m: traces.append(1) or m())
    assert float(jitted(model)) == 1.0
    _set_first(scales, 5.0)
    assert float(model()) == 5.0
    assert float(jitted(model)) == 5.0  # the stale trace gave 1.0
    assert len(traces) == 2
    _set_first(scales, 1.0)
    assert float(jitted(model)) == 1.0 and len(traces) == 2  # equal: the first trace


@pytest.mark.parametrize("make", MUTABLES.values(), ids=MUTABLES.keys())
def test_the_twin_refuses_a_static_value_without_a_hash(make):
    twin = Twin(make(), jnp.ones(()))
    with pytest.raises(ValueError, match="Non-hashable static arguments"):
        eqx.filter_jit(lambda m: m())(twin)


def test_a_value_read_back_from_a_treedef_is_its_own_copy():
    scales = collections.deque([1.0])
    model = Scaled(scales, jnp.ones(()))
    leaves, treedef = jax.tree_util.tree_flatten(model)
    first, second = (jax.tree_util.tree_unflatten(treedef, leaves) for _ in "ab")
    assert first.scales == scales and first.scales is not scales
    first.scales.append(2.0)
    assert second.scales == collections.deque([1.0])
    assert jax.tree_util.tree_structure(model) == treedef


def test_an_array_in_a_deque_is_an_array_hidden_in_a_static_value():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Scaled(collections.deque([jnp.ones(2)]), jnp.ones(()))
    assert any(
        "Scaled.scales holds an array in element 0" in str(w.message) for w in caught
    )
