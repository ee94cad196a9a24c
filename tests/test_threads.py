"""A model whose dict another thread changes in place, each change leaving it
consistent, is flattened, jitted and saved as it stood at one moment: never an
error, never a value under another key's name, as for the `eqx.Module` twin."""

import io
import sys
import threading
import time
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest

import autostatic as asx

KEYS = 12


class Holder(asx.AutoModule):
    params: dict
    activation: Any


class Twin(eqx.Module):
    params: dict
    activation: Any = eqx.field(static=True)


def _value(key: str) -> jax.Array:
    return jnp.full((2,), float(key[1:]))


def _params(with_static: bool) -> dict[str, Any]:
    params: dict[str, Any] = {f"k{i}": _value(f"k{i}") for i in range(KEYS)}
    if with_static:
        params["tag"] = "a static leaf"
    return params


def _change(params: dict[str, Any], stop: threading.Event) -> None:
    """Changes `params` in place until `stop`: values replaced, and one more key put
    in and taken out (so that its keys, listed, may be gone when read), each change
    keeping every key's value the array its name says."""
    extra = f"k{KEYS}"
    i = 0
    while not stop.is_set():
        key = f"k{i % KEYS}"
        params[key] = _value(key)
        if i % 2:
            params[extra] = _value(extra)
        else:
            params.pop(extra, None)
        i += 1


def _checked(model: Any, jitted: Any) -> None:
    """What each use of the model sees: every array under its own key."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(model)[0]:
        key = path[1].key
        if key != "tag":
            assert float(leaf[0]) == float(key[1:]), (path, leaf)
    out = jitted(model)
    for key, value in out.params.items():
        if key != "tag":
            assert float(value[0]) == float(key[1:]), (key, value)
    if isinstance(model, asx.AutoModule):
        asx.save(io.BytesIO(), model)
        asx.explain(model)


@pytest.mark.parametrize("with_static", [False, True], ids=["arrays", "mixed"])
@pytest.mark.parametrize("base", [Holder, Twin], ids=["AutoModule", "eqx.Module"])
def test_a_dict_changed_by_another_thread_is_seen_as_at_one_moment(base, with_static):
    params = _params(with_static)
    model = base(params, jax.nn.relu)
    # The twin's dict holding a string beside its arrays takes Equinox's filter.
    plain = base is Holder or not with_static
    jitted = jax.jit(lambda m: m) if plain else eqx.filter_jit(lambda m: m)
    # Both key sets traced first: JAX flattens a model twice when it traces, and
    # another thread changing it in between fails JAX's own check, for any pytree.
    _checked(model, jitted)
    params[f"k{KEYS}"] = _value(f"k{KEYS}")
    _checked(model, jitted)
    stop = threading.Event()
    changer = threading.Thread(target=_change, args=(params, stop))
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # another thread may run between any two bytecodes
    changer.start()
    try:
        for _ in range(300):
            _checked(model, jitted)
    finally:
        stop.set()
        changer.join()
        sys.setswitchinterval(interval)


class Mixed(asx.AutoModule):
    items: list
    table: dict


def test_types_forgotten_by_another_thread_mid_split_leave_arrays_children(
    monkeypatch: pytest.MonkeyPatch,
):
    """The sets of types met are cleared when they grow past their bound, maybe by
    another thread while this one splits a mixed container: a type found met and
    then missed among the dynamic ones would make an array static. Here the clear
    falls exactly there, once."""
    from autostatic.core import _leaves, _split

    array = jnp.ones(2)
    model = Mixed([array, 1, "s", (array, 2.5)], {"p": array, "q": 3})
    jax.tree_util.tree_leaves(model)  # every type met
    dynamic_types, cleared = _split.dynamic_types, []

    def forgetting(array_field: bool) -> set[type]:
        if not cleared:
            cleared.append(True)
            _leaves._forget_types()  # as another thread's new types would
        return dynamic_types(array_field)

    monkeypatch.setattr(_split, "dynamic_types", forgetting)
    paths = [
        jax.tree_util.keystr(p)
        for p, _ in jax.tree_util.tree_flatten_with_path(model)[0]
    ]
    assert cleared
    assert paths == [".items[0]", ".items[3][0]", ".table['p']"]


def test_code_for_a_new_class_is_generated_one_thread_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
):
    """Two threads meeting a new class's first instances at once, one holding an
    int where the other holds an array: each generates code for its field types,
    in turn, so neither runs with the other's names (which broke the class for
    good), and both flatten as the twin's."""
    from autostatic.core import _node

    generated_ways, inside, overlapped = _node._generated_ways, [0], []

    def slow(*args: Any) -> Any:
        inside[0] += 1
        overlapped.append(inside[0] > 1)
        time.sleep(0.05)  # the other thread arrives meanwhile
        inside[0] -= 1
        return generated_ways(*args)

    monkeypatch.setattr(_node, "_generated_ways", slow)

    class Fresh(asx.AutoModule):
        x: Any
        y: Any

    ints, arrays = Fresh(1, "a"), Fresh(jnp.ones(2), "a")
    start = threading.Barrier(2)

    def first_flattens(model: Fresh) -> None:
        start.wait()
        jax.tree_util.tree_leaves(model)

    threads = [
        threading.Thread(target=first_flattens, args=(m,)) for m in (ints, arrays)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert overlapped and not any(overlapped)
    assert len(jax.tree_util.tree_leaves(Fresh(2, "b"))) == 0
    assert len(jax.tree_util.tree_leaves(Fresh(jnp.ones(3), "b"))) == 1
