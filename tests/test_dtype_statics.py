"""Static dtype specifiers: `np.dtype("float32")`, `np.float32` and `jnp.float32` name
one dtype, `==` between them is true and JAX traces them alike, so they are one static
value, as in an `eqx.Module` marking the field static."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import autostatic as asx

from .helpers import TraceCounter

SPECIFIERS = {
    "float32": (np.dtype("float32"), np.float32, jnp.float32),
    "int32": (np.dtype("int32"), np.int32, jnp.int32),
    "bfloat16": (np.dtype(ml_dtypes.bfloat16), ml_dtypes.bfloat16, jnp.bfloat16),
    "bool": (np.dtype(bool), np.bool_, jnp.bool_),
}
PAIRS = [
    (a, b)
    for specs in SPECIFIERS.values()
    for a in specs
    for b in (*specs, jnp.float16, np.dtype("int8"))
]


class Cast(asx.AutoModule):
    w: jax.Array
    dtype: Any
    more: list

    def __call__(self) -> jax.Array:
        return self.w.astype(self.dtype)


class Twin(eqx.Module):
    w: jax.Array
    dtype: Any = eqx.field(static=True)
    more: list = eqx.field(static=True)


def _pair(make: type, a: Any, b: Any) -> tuple[Any, Any]:
    return make(jnp.ones(2), a, [a, 3]), make(jnp.ones(2), b, [b, 3])


@pytest.mark.parametrize("a, b", PAIRS, ids=repr)
def test_dtype_specifiers_compare_as_in_the_eqx_module_twin(a, b):
    auto, twin = _pair(Cast, a, b), _pair(Twin, a, b)
    same = jax.tree.structure(twin[0]) == jax.tree.structure(twin[1])
    assert (jax.tree.structure(auto[0]) == jax.tree.structure(auto[1])) is same
    assert bool(eqx.tree_equal(*auto)) is bool(eqx.tree_equal(*twin)) is same
    assert auto[0].dtype is a and auto[1].more[0] is b  # read back as assigned


def test_one_trace_for_every_specifier_of_a_dtype():
    counter = TraceCounter(lambda m: m())
    f = jax.jit(counter)
    for spec in SPECIFIERS["bfloat16"]:
        assert f(Cast(jnp.ones(2), spec, [])).dtype == jnp.bfloat16
    assert counter.count == 1
    assert f(Cast(jnp.ones(2), jnp.float16, [])).dtype == jnp.float16
    assert counter.count == 2


def test_numbers_equal_under_eq_still_differ():
    # The guarantee the type rule exists for: `2` and `2.0` compile different programs.
    one, one_f = Cast(jnp.ones(2), 2, []), Cast(jnp.ones(2), 2.0, [])
    assert jax.tree.structure(one) != jax.tree.structure(one_f)
