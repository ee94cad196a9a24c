"""explain, retrace_reasons (checked against real trace counts), logged_jit."""

import functools as ft
import logging
import re
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest
from hypothesis import given, HealthCheck, settings, strategies as st

import autostatic as asx
from autostatic.core import _checks as _static_checks

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
    assert text.splitlines()[1].split() == ["path", "kind", "type", "value"]
    assert ".stuff[3]['tag']" in text and "<table>" in table._repr_html_()


def test_explain_marks_non_array_leaves_of_plain_pytrees():
    rows = {
        r.path: r.kind for r in asx.explain({"m": AutoMLP(1, 2, KEY), "lr": 0.1}).rows
    }
    assert rows["['lr']"] == "leaf" and rows["['m'].scale"] == "static"
    assert len(str(asx.explain({"long": "x" * 500})).splitlines()[2]) < 120


class SmallCNN(asx.AutoModule):
    conv1: eqx.nn.Conv2d
    conv2: eqx.nn.Conv2d
    activation: Callable
    steps: jax.Array
    depth: int

    def __init__(self, key: jax.Array):
        k1, k2 = jax.random.split(key)
        self.conv1 = eqx.nn.Conv2d(1, 4, 3, key=k1)  # 36 + 4 parameters
        self.conv2 = eqx.nn.Conv2d(4, 8, 3, key=k2)  # 288 + 8 parameters
        self.activation = jax.nn.relu
        self.steps = jnp.zeros((), jnp.int32)
        self.depth = 2


def test_explain_summarises_the_whole_tree_first():
    table = asx.explain(SmallCNN(KEY))
    line = (
        "5 dynamic arrays (337 parameters, 1.35 kB: float32 and int32), "
        "2 static values, 0 non-array leaves"
    )
    assert str(table).splitlines()[0] == line
    assert table._repr_html_().startswith(f"<p>{line}</p><table>")
    summary = table.summary
    assert (summary.dynamic, summary.static, summary.leaves) == (5, 2, 0)
    assert (summary.parameters, summary.nbytes) == (337, 4 * 336 + 4)
    assert (summary.dtypes, summary.shown, summary.total) == (
        ("float32", "int32"),
        7,
        7,
    )
    one = asx.explain({"w": jnp.ones(3, jnp.float16), "lr": 0.1}).summary
    assert str(one) == (
        "1 dynamic array (3 parameters, 6 B: float16), 0 static values, "
        "1 non-array leaf"
    )
    assert str(asx.explain(None).summary) == (
        "0 dynamic arrays, 0 static values, 0 non-array leaves"
    )


def test_explain_filters_rows_by_kind_and_path():
    model = SmallCNN(KEY)

    def paths(**filters: Any) -> list[str]:
        return [r.path for r in asx.explain(model, **filters).rows]

    assert paths(kind="static") == [".activation", ".depth"]
    assert paths(kind={"static", "leaf"}) == [".activation", ".depth"]
    assert paths(path=".conv1") == [".conv1.weight", ".conv1.bias"]
    assert paths(path=re.compile(r"\.bias$")) == [".conv1.bias", ".conv2.bias"]
    assert paths(kind="dynamic", path="conv2") == [".conv2.weight", ".conv2.bias"]
    # A plain string is matched as text: brackets are not a character class.
    layers = asx.explain(AutoMLP(2, 2, KEY), path="layers[1]").rows
    assert [r.path for r in layers][:2] == [".layers[1].weight", ".layers[1].bias"]

    shown = asx.explain(model, kind="dynamic", path="conv")
    assert (
        str(shown).splitlines()[0].endswith("0 non-array leaves (showing 4 of 7 rows)")
    )
    assert (shown.summary.dynamic, shown.summary.shown) == (5, 4)
    assert str(asx.explain(model, path="nothing")).splitlines()[1:] == [
        "path  kind  type  value"
    ]


def test_explain_rejects_an_unknown_kind_or_path():
    message = (
        "explain(kind=...) takes 'dynamic', 'static' or 'leaf', or a collection of "
        "them; got 'parameters'"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        asx.explain(SmallCNN(KEY), kind="parameters")
    with pytest.raises(ValueError, match=r"got 'leaves'$"):
        asx.explain(SmallCNN(KEY), kind=["dynamic", "leaves"])
    with pytest.raises(TypeError, match="takes a str or a compiled regular"):
        asx.explain(SmallCNN(KEY), path=3)  # type: ignore[arg-type]


def _act(x: jax.Array) -> jax.Array:
    return x


@jax.custom_jvp
def _custom(x: jax.Array) -> jax.Array:
    return x


class _Unnamed:
    """A callable whose attribute lookups fail: named by its repr instead."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(name)

    def __call__(self) -> None:
        pass

    def __repr__(self) -> str:
        return "_Unnamed()"


def test_explain_names_functions_and_classes_as_they_are_imported():
    local = lambda x: x
    values = {
        "relu": jax.nn.relu,  # a custom_jvp defined in jax._src.nn.functions
        "gelu": jax.nn.gelu,  # a plain function defined there
        "tanh": jnp.tanh,  # a jitted function
        "jitted_relu": jax.jit(jax.nn.relu),
        "jitted_local": jax.jit(local),
        "linear": eqx.nn.Linear,  # defined in equinox.nn._linear
        "array": jax.Array,  # its qualname is jaxlib._jax.Array
        "len": len,
        "int": int,
        "act": _act,
        "custom": _custom,
        "local": local,
        "partial": ft.partial(jax.nn.gelu, approximate=False),
        "bound": ft.partial(jnp.add, jnp.ones(3)),
        "odd": _Unnamed(),
    }
    details = {r.path: r.detail for r in asx.explain(values).rows}
    here = f"{__name__}.test_explain_names_functions_and_classes_as_they_are_imported"
    assert details == {
        "['act']": f"{__name__}._act",
        "['array']": "jax.Array",
        "['bound']": "partial(jax.numpy.add, float32[3])",
        "['custom']": f"{__name__}._custom",
        "['gelu']": "jax.nn.gelu",
        "['int']": "int",
        "['jitted_local']": f"jit(<lambda> in {here})",
        "['jitted_relu']": "jit(jax.nn.relu)",
        "['len']": "len",
        "['linear']": "equinox.nn.Linear",
        "['local']": f"<lambda> in {here}",
        "['odd']": "_Unnamed()",
        "['partial']": "partial(jax.nn.gelu, approximate=False)",
        "['relu']": "jax.nn.relu",
        "['tanh']": "jax.numpy.tanh",
    }
    row = next(r for r in asx.explain(SmallCNN(KEY)).rows if r.path == ".activation")
    assert (row.kind, row.type, row.detail) == ("static", "custom_jvp", "jax.nn.relu")


def test_explain_names_the_state_index_of_each_state_entry():
    model, state = eqx.nn.make_with_state(eqx.nn.BatchNorm)(3, "batch", mode="batch")
    rows = asx.explain((model, state), path="[1]").rows
    # The key paths stay as JAX names them: `State` is registered without keys.
    assert [r.path for r in rows] == [
        "[1]" + jax.tree_util.keystr(p)
        for p, _ in jax.tree_util.tree_flatten_with_path(state)[0]
    ]
    assert [(r.path, r.detail) for r in rows] == [
        ("[1][<flat index 0>]", "~int32[]  (state of BatchNorm.batch_counter)"),
        (
            "[1][<flat index 1>][0]",
            "float32[3]  (state of BatchNorm.batch_state_index)",
        ),
        (
            "[1][<flat index 1>][1]",
            "float32[3]  (state of BatchNorm.batch_state_index)",
        ),
    ]
    # Built by hand, a State's markers are bare objects, which name nothing.
    by_hand = eqx.nn.State(eqx.nn.BatchNorm(3, "batch", mode="batch"))
    assert [r.detail for r in asx.explain(by_hand).rows] == [
        "~int32[]",
        "float32[3]",
        "float32[3]",
    ]


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
    for old, new in ((jnp.float32, jnp.float16), (int, float)):  # other values
        (kind,) = asx.retrace_reasons(
            asx.tree_at(lambda m: m.scale, a, old),
            asx.tree_at(lambda m: m.scale, a, new),
        )
        assert "identity" not in str(kind)


@needs_devices(2)
def test_retrace_reasons_for_sharding():
    x = jnp.ones(4)
    on0, on1 = jax.device_put(x, jax.devices()[0]), jax.device_put(x, jax.devices()[1])
    assert [r.kind for r in asx.retrace_reasons(on0, on1)] == ["sharding"]


def _mutations(desc: tuple[Any, ...], draw: Callable[..., Any]) -> tuple[Any, ...]:
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


def test_logged_jit_names_an_argument_passed_by_keyword_and_a_static_value():
    # `jax.jit` keys a call by how its arguments are passed: `f(x, y)`, then
    # `f(x, y=y)`, traces again with equal arguments.
    traces = []
    step = asx.logged_jit(lambda x, y: traces.append(1) or x + y)
    step(jnp.ones(2), jnp.ones(2))
    step(jnp.ones(2), y=jnp.ones(2))
    assert len(traces) == 2
    assert [[str(r) for r in reasons] for _, reasons in step.retraces] == [
        ["(passed by keyword): static value changed from () to ('y',)"]
    ]
    scaled = asx.logged_jit(lambda x, n=1: x * n, static_argnames="n")
    scaled(jnp.ones(2))
    scaled(jnp.ones(2), n=2)
    assert "n: added (2)" in [str(r) for r in scaled.retraces[0][1]]


class _Padded(asx.AutoModule):
    conv: eqx.nn.Conv1d


class _Counted(eqx.Module):
    w: jax.Array
    n: int = eqx.field(static=True)


def test_retrace_reasons_name_a_changed_field_equinox_marks_static():
    # A held layer's `padding` and an `eqx.Module`'s marked field are in Equinox's aux
    # data, where the walk sees no leaf: named by field, not as two treedefs.
    def padded(padding: int) -> _Padded:
        return _Padded(eqx.nn.Conv1d(1, 1, 3, padding=padding, key=KEY))

    assert [str(r) for r in asx.retrace_reasons(padded(0), padded(1))] == [
        ".conv.padding: static value changed from ((0, 0),) to ((1, 1),)"
    ]
    assert [
        str(r)
        for r in asx.retrace_reasons(_Counted(jnp.ones(1), 1), _Counted(jnp.ones(1), 2))
    ] == [".n: static value changed from 1 to 2"]
