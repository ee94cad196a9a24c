"""Frozen containers print like the built-ins (issue 12, item 9): `repr`, IPython,
`eqx.tree_pformat` and treescope show an AutoModule's lists, dicts and sets exactly as
they show the plain containers of the `eqx.Module` twin."""

from collections import defaultdict, OrderedDict

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest

import autostatic as asx
from autostatic._containers import (
    FrozenDefaultDict,
    FrozenDict,
    FrozenList,
    FrozenOrderedDict,
    FrozenSet,
)


def make_model(base):
    class Model(base):
        layers: list
        table: dict
        tags: set
        empty: set
        ordered: OrderedDict
        counts: defaultdict
        pair: tuple

    return Model


def fields():
    weights = jnp.arange(3.0)
    return dict(
        layers=[1, weights, {"w": weights + 1, "act": jax.nn.relu, "ids": {3, 1}}],
        table={"b": [1, 2], "a": "x", "long": list(range(30))},
        tags={"x", "y"},
        empty=set(),
        ordered=OrderedDict([("z", 1), ("a", [jnp.ones(2)]), ("m", OrderedDict())]),
        counts=defaultdict(int, {"k": 1, "j": defaultdict(list)}),
        pair=([1], {"q": {2}}),
    )


@pytest.fixture(scope="module")
def twins():
    """The same values in an AutoModule (frozen) and in an eqx.Module (plain)."""
    values = fields()
    auto = make_model(asx.AutoModule)(**values)
    plain = make_model(eqx.Module)(**values)
    # The mixed list carries its static items itself (a FrozenList subclass).
    assert (
        isinstance(auto.layers, FrozenList) and type(auto.counts) is FrozenDefaultDict
    )
    assert type(auto.layers[2]["ids"]) is FrozenSet
    assert type(plain.layers) is list
    return auto, plain


@pytest.mark.parametrize(
    "frozen, plain",
    [
        (FrozenList([1, "a", None]), [1, "a", None]),
        (FrozenList(), []),
        (FrozenDict({"b": 1, "a": [2]}), {"b": 1, "a": [2]}),
        (FrozenSet({1, 2}), {1, 2}),
        (FrozenSet(), set()),
        (FrozenOrderedDict([("z", 1), ("a", 2)]), OrderedDict([("z", 1), ("a", 2)])),
        (FrozenOrderedDict(), OrderedDict()),
        (FrozenDefaultDict(int, {"k": 1}), defaultdict(int, {"k": 1})),
        (FrozenDefaultDict(None), defaultdict(None)),
    ],
)
def test_repr_and_str_are_the_builtins(frozen, plain):
    assert repr(frozen) == repr(plain)
    assert str(frozen) == str(plain)
    assert "Frozen" not in repr(frozen)


def test_model_attributes_print_as_builtins(twins):
    auto, plain = twins
    for name in fields():
        assert repr(getattr(auto, name)) == repr(getattr(plain, name)), name
    assert repr(auto.ordered).startswith("OrderedDict(")
    assert repr(auto.counts).startswith("defaultdict(<class 'int'>")


@pytest.mark.parametrize("options", [{}, {"short_arrays": False}, {"width": 40}])
def test_tree_pformat_is_the_eqx_module_twins(twins, options):
    auto, plain = twins
    text = eqx.tree_pformat(auto, **options)
    assert text == eqx.tree_pformat(plain, **options)
    assert "Frozen" not in text


def test_ipython_pretty_is_the_builtins(twins):
    pretty = pytest.importorskip("IPython.lib.pretty")
    auto, plain = twins
    for name in fields():
        assert pretty.pretty(getattr(auto, name), max_width=30) == pretty.pretty(
            getattr(plain, name), max_width=30
        ), name


def test_treescope_renders_the_eqx_module_twin(twins):
    treescope = pytest.importorskip("treescope")
    auto, plain = twins
    for options in ({}, {"roundtrip_mode": True}):
        text = treescope.render_to_text(auto, **options)
        assert text == treescope.render_to_text(plain, **options)
        assert "Frozen" not in text
    for name in fields():
        value = getattr(auto, name)
        assert treescope.render_to_text(value) == treescope.render_to_text(
            getattr(plain, name)
        ), name
    html = treescope.render_to_html(auto)
    assert "Frozen" not in html
