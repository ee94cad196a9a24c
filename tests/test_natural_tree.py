"""The natural tree: every attribute value is the object an eqx.Module would hold, of
its type, with the treedef that value has standalone, however the model was made
(built, unflattened by a tree_map, returned by jax.jit), and two fields, two classes
or a field and a plain value of the same structure combine as with eqx.Module."""

import operator
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, HealthCheck, settings, strategies as st

import autostatic as asx

from .helpers import Box, build, container_descs, descs

KEY = jax.random.key(0)
_LAYERS = {
    "linear": lambda: eqx.nn.Linear(2, 2, key=KEY),
    "dropout": lambda: eqx.nn.Dropout(0.1),
    "mlp": lambda: eqx.nn.MLP(2, 2, 2, 1, key=KEY),
    "norm": lambda: eqx.nn.LayerNorm(2),
}
layer_descs = st.tuples(st.just("layer"), st.sampled_from(sorted(_LAYERS)))
nests = st.recursive(
    # `None` on its own too: an empty node among leaves moves every position after it.
    st.one_of(descs, layer_descs, st.just(("lit", None))),
    lambda children: st.one_of(*container_descs(children)),
    max_leaves=8,
)


def make(desc: tuple) -> object:
    kind = desc[0]
    if kind == "layer":
        return _LAYERS[desc[1]]()
    if kind == "list":
        return [make(d) for d in desc[1]]
    if kind == "tuple":
        return tuple(make(d) for d in desc[1])
    if kind == "dict":
        return {k: make(d) for k, d in desc[1].items()}
    return build(desc, True)


def _types(tree: object) -> list[object]:
    """The node and leaf types of `tree`, walking into modules (an array is "array":
    jax.jit gives jax arrays back for numpy ones, as for any pytree)."""
    is_module = lambda x: isinstance(x, eqx.Module)
    out = []
    for x in jax.tree_util.tree_leaves(tree, is_leaf=is_module):
        out.append("array" if eqx.is_array(x) else type(x))
        if is_module(x):
            out += _types([getattr(x, f) for f in x.__dataclass_fields__])
    return out


def _same_value(a: object, b: object) -> None:
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    assert _types(a) == _types(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        if eqx.is_array(x):
            np.testing.assert_array_equal(x, y)
        else:
            assert x is y or (type(x) is type(y) and x == y)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nests, nests)
def test_every_attribute_has_the_treedef_of_its_value_standalone(desc_a, desc_b):
    value, other = make(desc_a), make(desc_b)
    model = Box(value, other)
    assert model.value is value and model.other is other
    rebuilt = jax.tree_util.tree_map(lambda x: x, model)
    returned = jax.jit(lambda m: m)(model)
    for made in (rebuilt, returned):
        _same_value(made.value, value)
        _same_value(made.other, other)
    # Equal values in two models give equal treedefs.
    again = Box(make(desc_a), make(desc_b))
    assert jax.tree_util.tree_structure(again) == jax.tree_util.tree_structure(model)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nests, nests)
def test_a_live_filter_spec_changes_no_other_instance_s_flatten(desc_a, desc_b):
    # A filter spec kept for a training loop is a tree of templates; the model's own
    # instances, and new ones, flatten as they would with none alive.
    model = Box(make(desc_a), make(desc_b))
    before = jax.tree_util.tree_flatten(model)
    spec = jax.tree_util.tree_map(lambda _: False, model)
    assert jax.tree_util.tree_structure(spec) == before[1]
    assert not any(jax.tree_util.tree_leaves(spec))
    leaves, treedef = jax.tree_util.tree_flatten(model)
    assert treedef == before[1] and all(map(operator.is_, leaves, before[0]))
    again = Box(make(desc_a), make(desc_b))
    assert jax.tree_util.tree_structure(again) == before[1]
    del spec
    assert jax.tree_util.tree_structure(again) == before[1]


class Two(asx.AutoModule):
    a: list
    b: list
    d: dict


class EqxTwo(eqx.Module):
    a: list
    b: list
    d: dict


class Other(asx.AutoModule):
    c: list


def _two(cls):
    return cls(
        [jnp.ones(2), jnp.zeros(2)],
        [jnp.full(2, 2.0), jnp.full(2, 3.0)],
        {"w": jnp.ones(3), "b": jnp.zeros(3)},
    )


def test_two_fields_combine_as_with_eqx_module():
    for cls in (Two, EqxTwo):
        m = _two(cls)
        summed = jax.tree_util.tree_map(lambda x, y: x + y, m.a, m.b)
        np.testing.assert_allclose(summed[1], 3.0)
        picked = jax.jit(lambda p, m: jax.lax.cond(p, lambda: m.a, lambda: m.b))(
            False, m
        )
        np.testing.assert_allclose(picked[0], 2.0)

        def step(carry, _, m=m):
            return jax.tree_util.tree_map(lambda x, y: x + y, carry, m.b), None

        out, _ = jax.lax.scan(step, m.a, length=2)
        np.testing.assert_allclose(out[0], 5.0)
        plain = {"w": jnp.ones(3), "b": jnp.ones(3)}
        with_plain = jax.tree_util.tree_map(lambda x, y: x - y, m.d, plain)
        assert type(with_plain) is dict
        np.testing.assert_allclose(with_plain["b"], -1.0)


def test_two_classes_with_equal_values_have_equal_attribute_treedefs():
    m, o = _two(Two), Other([jnp.ones(2), jnp.zeros(2)])
    assert jax.tree_util.tree_structure(m.a) == jax.tree_util.tree_structure(o.c)
    after = jax.tree_util.tree_map(lambda x: x, (m, o))
    assert jax.tree_util.tree_structure(after[0].a) == (
        jax.tree_util.tree_structure(after[1].c)
    )


@pytest.mark.parametrize("base", [asx.AutoModule, eqx.Module])
def test_closure_converted_functions_of_one_program_give_one_treedef(base):
    # optimistix and lineax hold eqx.filter_closure_convert's result in their states
    # and compare trees built by separate traces of the same function.
    class Holder(base):
        fn: Any

    def make(scale):
        convert = eqx.filter_closure_convert(lambda x: jnp.sin(x) * scale, jnp.ones(2))
        return Holder(convert)

    # One program: the scale is a closed-over array, a const of the jaxpr.
    a, b = make(jnp.asarray(2.0)), make(jnp.asarray(3.0))
    assert a.fn.jaxpr is not b.fn.jaxpr
    assert jax.tree.structure(a) == jax.tree.structure(b)
    if base is asx.AutoModule:
        other = Holder(eqx.filter_closure_convert(lambda x: jnp.cos(x), jnp.ones(2)))
        assert jax.tree.structure(a) != jax.tree.structure(other)  # retraces
        np.testing.assert_allclose(
            jax.jit(lambda h: h.fn(jnp.ones(2)))(b), 3 * jnp.sin(1.0)
        )


def _with_jvp_rule(slope):
    @jax.custom_jvp
    def f(x):
        return jnp.sin(x)

    @f.defjvp
    def f_jvp(primals, tangents):
        return f(primals[0]), tangents[0] * slope

    return f


def _with_vjp_rule(slope):
    @jax.custom_vjp
    def f(x):
        return jnp.sin(x)

    f.defvjp(lambda x: (f(x), None), lambda _, g: (g * slope,))
    return f


def _with_callback(scale):
    def host(x):
        return np.asarray(x) * scale

    return lambda x: jax.pure_callback(
        host, jax.ShapeDtypeStruct(x.shape, x.dtype), x
    ).sum()


@pytest.mark.parametrize(
    "make, run",
    [
        (_with_jvp_rule, lambda h: jax.grad(lambda w: h.fn(w).sum())(h.w)),
        (_with_vjp_rule, lambda h: jax.grad(lambda w: h.fn(w).sum())(h.w)),
        (_with_callback, lambda h: h.fn(h.w)),
    ],
    ids=["custom_jvp rule", "custom_vjp rule", "callback"],
)
def test_programs_printed_alike_that_call_other_functions_differ(make, run):
    # Two programs that differ only in a function they call by reference print
    # alike; they are no one program: each gives its own results under jax.jit, as
    # under eqx.filter_jit with the eqx.Module (whose jaxpr is a leaf, by identity).
    class Holder(asx.AutoModule):
        fn: Any
        w: jax.Array

    class EqxHolder(eqx.Module):
        fn: Any
        w: jax.Array

    def held(cls, scale):
        return cls(eqx.filter_closure_convert(make(scale), jnp.ones(2)), jnp.ones(2))

    ours = [jax.jit(run)(held(Holder, s)) for s in (1.0, 7.0)]
    theirs = [eqx.filter_jit(run)(held(EqxHolder, s)) for s in (1.0, 7.0)]
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b)
    assert not np.allclose(ours[0], ours[1])
    one = make(1.0)
    again = [
        Holder(eqx.filter_closure_convert(one, jnp.ones(2)), jnp.ones(2))
        for _ in range(2)
    ]
    assert again[0].fn.jaxpr is not again[1].fn.jaxpr
    assert jax.tree.structure(again[0]) == jax.tree.structure(again[1])


@pytest.mark.parametrize(
    "value",
    [
        [None, jax.nn.relu, jnp.ones(2)],
        (jnp.ones(2), None, "name", None, eqx.nn.Linear(2, 2, key=KEY), 3),
        [None, [jnp.ones(1), None], jax.nn.relu],
        [None, jax.nn.relu],
        (3, None, "x"),
    ],
    ids=[
        "none-before-function",
        "tuple-with-layer",
        "nested-list-item",
        "static-list",
        "static-tuple",
    ],
)
def test_none_items_keep_their_places_in_a_mixed_list(value):
    # A `None` item is an empty node, not a leaf: the holes left for the static
    # items must still be put back at their own places.
    model = Box(value, 0)
    for made in (
        jax.tree_util.tree_map(lambda x: x, model),
        jax.jit(lambda m: m)(model),
    ):
        _same_value(made.value, value)
        assert [type(x) for x in made.value] == [type(x) for x in value]
