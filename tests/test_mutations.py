"""One invariant, tested differentially: after any sequence of in-place changes to
any container at any depth (inside nested modules, inside containers, before and
after `jax.jit` returned the model), flatten, `jax.jit`, `jax.grad`, unflatten,
`eqx.partition`/`combine`, `eqx.tree_serialise_leaves` and `autostatic.save`/`load`
see exactly what an `eqx.Module` holding the same values sees
(`tests/mutation_fuzz.py`)."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest
from hypothesis import given, HealthCheck, settings, strategies as st

import autostatic as asx

from .mutation_fuzz import ASub, ATop, Beside, ESub, ETop, Nothing, run_example, same


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
@given(st.data())
def test_in_place_changes_are_seen_as_an_eqx_module_sees_them(data: Any) -> None:
    run_example(data)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
@given(st.data())
def test_in_place_changes_with_a_second_thread_running_examples_beside(data: Any):
    # The classes' plans, signatures and generated code are shared by both threads.
    beside = _BESIDE[0] or Beside(seed=1)
    _BESIDE[0] = beside
    run_example(data)
    if beside.failure is not None:
        beside.stop()


_BESIDE: list[Beside | None] = [None]


@pytest.fixture(autouse=True, scope="module")
def _stop_the_second_thread():
    yield
    if _BESIDE[0] is not None:
        _BESIDE[0].stop()


@pytest.mark.parametrize("after", ["a flatten", "a jit step"])
def test_an_array_added_to_a_module_in_a_list_beside_a_mixed_tuple_is_seen(after):
    arr, w, x = jnp.ones(2), jnp.full((2,), 2.0), jnp.full((2,), 30.0)
    model = ATop([ASub({"w": w, "frozen": False}, None), (-2, arr)], None)
    twin = ETop([ESub({"w": w, "frozen": False}, None), (-2, arr)], None)
    if after == "a flatten":
        jax.tree_util.tree_flatten(model)
    else:
        model = jax.jit(lambda m: m)(model)
        twin = eqx.filter_jit(lambda m: m)(twin)
    model.a[0].params["extra"] = x
    twin.a[0].params["extra"] = x
    total = jax.jit(
        lambda m: sum(
            v.sum() for v in m.a[0].params.values() if isinstance(v, jax.Array)
        )
    )
    assert float(total(model)) == 64.0
    assert [
        jax.tree_util.keystr(p)
        for p, _ in jax.tree_util.tree_flatten_with_path(model)[0]
    ] == [".a[0].params['extra']", ".a[0].params['w']", ".a[1][1]"]
    same(model, twin)


class Block(asx.AutoModule):
    cfg: dict


class Net(asx.AutoModule):
    parts: list


def test_a_config_module_without_arrays_beside_a_static_leaf_sees_its_change():
    net = Net([Block({"scale": 1.0}), 3])
    run = jax.jit(lambda n, x: n.parts[0].cfg["scale"] * x)
    assert float(run(net, jnp.ones(()))) == 1.0
    net = jax.jit(lambda n: n)(net)
    net.parts[0].cfg["scale"] = 10.0
    assert float(run(net, jnp.ones(()))) == 10.0
    again = jax.tree_util.tree_unflatten(*reversed(jax.tree_util.tree_flatten(net)))
    assert again.parts[0].cfg["scale"] == 10.0


def _array_paths(tree: Any) -> list[str]:
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return [jax.tree_util.keystr(p) for p, x in flat if eqx.is_array(x)]


def test_a_list_changed_after_tree_at_gave_its_model_its_first_array_is_seen():
    # A tree without leaves may be a tree of labels mapped from a model; the
    # modules `eqx.tree_at` leaves unchanged in it are still read from their values.
    model = ATop((2, 3), ASub([1, ()], 0))
    twin = ETop((2, 3), ESub([1, ()], 0))
    new = jnp.ones(2)
    model = eqx.tree_at(lambda t: t.a[1], model, new)
    twin = eqx.tree_at(lambda t: t.a[1], twin, new)
    for tree, sub in ((model, ASub), (twin, ESub)):
        tree.b.params[1] = sub(jnp.zeros(2), 1)
    assert _array_paths(model) == _array_paths(twin) == [".a[1]", ".b.params[1].params"]
    same(model, twin)


def test_a_function_put_over_a_submodule_of_a_model_without_arrays_is_static():
    model = eqx.tree_at(lambda t: t.b, ATop(1, ASub(2, 3)), jax.nn.relu)
    assert jax.tree_util.tree_leaves(model) == []
    assert float(jax.jit(lambda m, x: m.b(x))(model, -jnp.ones(()))) == 0.0


def test_none_put_over_a_static_leaf_of_a_model_holding_no_array_stays():
    # The model's only children are nodes without leaves (optax's `MaskedNode()`, an
    # empty tuple): its tree has no leaves, as a tree of labels mapped to `None`s.
    trees = []
    for top in (ATop, ETop):
        model = top(({"z": (), "w": (2, 3), "x": jax.nn.relu}, [Nothing()]), {})
        model = eqx.tree_at(lambda t: t.a[0]["w"][1], model, None)
        trees.append(jax.tree_util.tree_map(lambda x: x, model))
    same(*trees)
    assert trees[0].a[0]["w"] == (2, None)
