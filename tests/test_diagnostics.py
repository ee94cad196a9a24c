"""explain, retrace_reasons (checked against real trace counts), logged_jit."""

import logging

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given, HealthCheck, settings, strategies as st

import autostatic as asx
from autostatic import _static_checks

from .helpers import (
    AutoMixed,
    AutoMLP,
    Box,
    build,
    descs,
    needs_devices,
    TraceCounter,
)

KEY = jax.random.key(0)


def test_explain_lists_every_value_by_key_path():
    table = asx.explain(AutoMixed(KEY))
    rows = {row.path: row for row in table.rows}
    assert rows[".stuff[0].weight"].kind == "dynamic"
    assert rows[".stuff[0].weight"].detail == "float32[3,3]"
    assert rows[".stuff[1]"].kind == "static" and rows[".stuff[2]"].detail == "3"
    assert rows[".stuff[3]['tag']"].kind == "static"
    assert rows[".seq.layers[1].fn"].kind == "static"
    assert [r.path for r in table.rows if r.kind == "dynamic"] == [
        jax.tree_util.keystr(p)
        for p, _ in jax.tree_util.tree_flatten_with_path(AutoMixed(KEY))[0]
    ]
    text = str(table)
    assert text.splitlines()[0].split() == ["path", "kind", "type", "value"]
    assert ".stuff[3]['tag']" in text and "<table>" in table._repr_html_()


def test_explain_marks_non_array_leaves_of_plain_pytrees():
    rows = {
        r.path: r.kind for r in asx.explain({"m": AutoMLP(1, 2, KEY), "lr": 0.1}).rows
    }
    assert rows["['lr']"] == "leaf" and rows["['m'].scale"] == "static"
    assert len(str(asx.explain({"long": "x" * 500})).splitlines()[1]) < 120


def test_retrace_reasons_name_paths_and_values():
    a = AutoMLP(2, 3, KEY)
    assert asx.retrace_reasons(a, a) == []
    assert asx.retrace_reasons(a, jax.tree_util.tree_map(lambda x: x + 1, a)) == []
    (reason,) = asx.retrace_reasons(a, asx.tree_at(lambda m: m.scale, a, 2.0))
    assert (reason.kind, reason.path, reason.old, reason.new) == (
        "static",
        ".scale",
        1.0,
        2.0,
    )
    assert str(reason) == ".scale: static value changed from 1.0 to 2.0"
    (length,) = asx.retrace_reasons(a, AutoMLP(3, 3, KEY))
    assert str(length) == ".layers: length changed from 2 to 3"
    cast = jax.tree_util.tree_map(lambda x: x.astype(jnp.float16), a)
    assert {(r.kind, r.path) for r in asx.retrace_reasons(a, cast)} >= {
        ("dtype", ".layers[0].weight")
    }
    wider = asx.tree_at(lambda m: m.layers[1].bias, a, jnp.zeros(4))
    assert [str(r) for r in asx.retrace_reasons(a, wider)] == [
        ".layers[1].bias: shape changed from (3,) to (4,)"
    ]
    weak = asx.retrace_reasons((a, jnp.float32(1)), (a, jnp.asarray(1.0)))
    assert [r.kind for r in weak] == ["weak_type"]

    def with_fresh_lambda():
        return asx.tree_at(lambda m: m.layers[0].activation, a, lambda x: x)

    (fresh,) = asx.retrace_reasons(with_fresh_lambda(), with_fresh_lambda())
    assert fresh.path == ".layers[0].activation"
    assert "functions compare by identity" in str(fresh)


@needs_devices(2)
def test_retrace_reasons_for_sharding():
    x = jnp.ones(4)
    on0, on1 = jax.device_put(x, jax.devices()[0]), jax.device_put(x, jax.devices()[1])
    assert [r.kind for r in asx.retrace_reasons(on0, on1)] == ["sharding"]


def _mutations(desc, draw):
    kind = desc[0]
    if kind in ("jax", "numpy"):
        choice = draw(st.sampled_from(["value", "ndim", "kind", "literal"]))
        if choice == "value":
            return (kind, desc[1], desc[2] + 1)
        if choice == "ndim":
            return (kind, (desc[1] + 1) % 3, desc[2])
        if choice == "kind":
            return ("numpy" if kind == "jax" else "jax", desc[1], desc[2])
        return ("lit", desc[2])
    if kind == "lit":
        return (
            "lit",
            draw(st.sampled_from([desc[1], 7, "other", 0.5, None, jax.nn.relu])),
        )
    if kind in ("list", "tuple"):
        items = list(desc[1])
        if not items or draw(st.booleans()):
            return (kind, items + [("lit", 1)])
        i = draw(st.integers(0, len(items) - 1))
        items[i] = _mutations(items[i], draw)
        return (kind, items)
    if kind == "dict":
        items = dict(desc[1])
        if not items or draw(st.booleans()):
            items["new"] = ("lit", 1)
            return (kind, items)
        key = draw(st.sampled_from(sorted(items)))
        items[key] = _mutations(items[key], draw)
        return (kind, items)
    if draw(st.booleans()):
        return ("module", _mutations(desc[1], draw), desc[2])
    return ("module", desc[1], _mutations(desc[2], draw))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(descs, descs, st.data())
def test_no_reasons_exactly_when_jit_hits_its_cache(desc_a, desc_b, data):
    first = Box(build(desc_a, True), build(desc_b, True))
    if data.draw(st.booleans()):
        second = Box(build(desc_a, True), build(desc_b, True))  # rebuilt, equal
    else:
        edited = _mutations(("module", desc_a, desc_b), data.draw)
        second = Box(build(edited[1], True), build(edited[2], True))
    counter = TraceCounter(lambda m: 0)
    jitted = jax.jit(counter)
    jitted(first)
    jitted(second)
    reasons = asx.retrace_reasons(first, second)
    assert (counter.count == 2) == bool(reasons), (
        counter.count,
        [str(r) for r in reasons],
    )


def test_logged_jit_logs_each_retrace_by_argument_path(caplog):
    model = AutoMLP(2, 3, KEY)
    step = asx.logged_jit(lambda model, x: model(x))
    with caplog.at_level(logging.WARNING, logger="autostatic"):
        step(model, jnp.ones(3))
        step(jax.tree_util.tree_map(lambda x: x * 2, model), jnp.ones(3))
        assert caplog.records == []  # cache hit: nothing logged
        step(asx.tree_at(lambda m: m.scale, model, 0.5), jnp.ones(3, jnp.int32))
    (record,) = caplog.records
    assert "model.scale: static value changed from 1.0 to 0.5" in record.getMessage()
    assert "x: dtype changed from float32 to int32" in record.getMessage()
    assert [n for n, _ in step.retraces] == [2]


def test_logged_jit_warns_about_a_changing_float_once():
    _static_checks._warned.clear()
    model = AutoMLP(1, 3, KEY)
    step = asx.logged_jit(lambda model: model(jnp.ones(3)))
    with pytest.warns(
        UserWarning, match=r"model\.scale is a Python float .* store it as an array"
    ) as record:
        for scale in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0):
            step(asx.tree_at(lambda m: m.scale, model, scale))
    assert len([w for w in record if "model.scale" in str(w.message)]) == 1
    assert len(step.retraces) == 5


def test_diagnostics_handle_prng_keys_static_arguments_and_python_scalars(caplog):
    step = asx.logged_jit(lambda key, x: jax.random.normal(key, x.shape) + x)
    step(jax.random.key(0), jnp.ones(3))
    step(jax.random.key(1), jnp.ones(4))
    assert [str(r) for _, reasons in step.retraces for r in reasons] == [
        "x: shape changed from (3,) to (4,)"
    ]
    assert asx.retrace_reasons(jax.random.key(0), jax.random.key(1)) == []
    assert asx.retrace_reasons(1.0, jnp.asarray(2.0)) == []  # both traced as weak f32[]

    scaled = asx.logged_jit(lambda x, n: x * n, static_argnums=1)
    scaled(jnp.ones(2), 2)
    scaled(jnp.ones(2), 2)
    scaled(jnp.ones(2), 3)
    assert [[str(r) for r in reasons] for _, reasons in scaled.retraces] == [
        ["n: static value changed from 2 to 3"]
    ]
    named = asx.logged_jit(lambda x, scale: x * scale, static_argnames="scale")
    named(jnp.ones(2), scale=2.0)
    named(jnp.ones(2), scale=3.0)
    assert named.retraces[0][1][0].path == "scale"


def test_retrace_reasons_name_a_signed_zero_and_a_number_type():
    class Scaled(asx.AutoModule):
        w: jax.Array
        config: object

    def reasons(a, b):
        return asx.retrace_reasons(Scaled(jnp.ones(1), a), Scaled(jnp.ones(1), b))

    assert [(r.kind, r.path) for r in reasons(0.0, -0.0)] == [("static", ".config")]
    assert [(r.kind, r.path) for r in reasons((2,), (2.0,))] == [
        ("static", ".config[0]")
    ]
    assert reasons(float("nan"), float("nan")) == []
