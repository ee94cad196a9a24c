"""Semantics 1, 8, 10: written like eqx.Module, behaves like it, clear misuse errors."""

import abc
import copy
import dataclasses
import functools
import inspect
import pickle
import subprocess
import sys
from collections.abc import Callable
from typing import Any, ClassVar

import cloudpickle
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import autostatic as asx

from .helpers import AutoMixed, AutoMLP, EqxMLP, keystrs, TraceCounter

KEY = jax.random.key(0)


def test_is_an_eqx_module_and_dataclass_init():
    class Point(asx.AutoModule):
        x: jax.Array
        label: str = "p"

    p = Point(jnp.ones(2))
    assert isinstance(p, eqx.Module) and dataclasses.is_dataclass(p)
    assert p.label == "p" and keystrs(p) == [".x"]


def test_converter_runs_before_partition():
    class Scaled(asx.AutoModule):
        scale: jax.Array = eqx.field(converter=jnp.asarray)
        name: str = "s"

    s = Scaled(2.0)
    assert keystrs(s) == [".scale"]  # the converter made it an array, so it is dynamic
    g = jax.grad(lambda m: m.scale * 3.0)(s)
    assert g.scale == 3.0


def test_check_init_and_post_init():
    seen = []

    class Checked(asx.AutoModule):
        w: jax.Array
        n: int

        def __check_init__(self):
            seen.append(self.n)
            if self.n < 0:
                raise ValueError("n must be >= 0")

    Checked(jnp.ones(1), 2)
    with pytest.raises(ValueError, match="n must be"):
        Checked(jnp.ones(1), -1)
    assert seen == [2, -1]

    class Post(asx.AutoModule):
        w: jax.Array
        double: jax.Array = eqx.field(init=False)

        def __post_init__(self):
            self.double = 2 * self.w

    with pytest.warns(UserWarning, match="init=False"):  # Equinox's own warning
        p = Post(jnp.ones(2))
    assert keystrs(p) == [".w", ".double"]


def test_inheritance_abstract_methods_and_abstract_var():
    class Base(asx.AutoModule):
        width: eqx.AbstractVar[int]

        @abc.abstractmethod
        def __call__(self, x): ...

    class Child(Base):
        width: int
        w: jax.Array

        def __init__(self, width):
            self.width = width
            self.w = jnp.ones(width)

        def __call__(self, x):
            return self.w * x

    class GrandChild(Child):
        extra: str = "e"

    with pytest.raises(TypeError):
        Base()
    c = GrandChild(3)
    assert isinstance(c, Base) and keystrs(c) == [".w"] and c.extra == "e"
    assert jax.jit(lambda m, x: m(x))(c, 2.0).shape == (3,)


def test_parent_init_does_not_freeze_early():
    class Parent(asx.AutoModule):
        layers: list
        n: int

        def __init__(self, n):
            self.layers = []
            self.n = n

    class Child(Parent):
        def __init__(self):
            super().__init__(2)
            self.layers.append(jnp.ones(1))  # still under construction: allowed
            self.layers.append("tag")

    c = Child()
    assert keystrs(c) == [".layers[0]"] and c.layers[1] == "tag"


def test_eqx_layers_as_children_and_ecosystem_functions():
    model = AutoMixed(KEY)
    assert "AutoMixed(" in eqx.tree_pformat(model)
    params = eqx.filter(model, eqx.is_inexact_array)
    opt = optax.adam(1e-2)
    state = opt.init(params)

    def loss(m):
        return jnp.sum(m.stuff[0](jnp.ones(3))) + jnp.sum(m.seq(jnp.ones(3)))

    grads = jax.grad(loss)(model)
    updates, state = opt.update(grads, state, params)
    new = eqx.apply_updates(model, updates)
    assert type(new) is AutoMixed and new.stuff[1] is jax.nn.relu
    assert not np.allclose(new.stuff[0].weight, model.stuff[0].weight)
    moved = eqx.tree_at(lambda m: m.stuff[0].weight, model, jnp.zeros((3, 3)))
    assert jnp.all(moved.stuff[0].weight == 0) and moved.stuff[1] is jax.nn.relu


def _bump_bias(m: Any) -> Any:
    return eqx.tree_at(lambda m: m.layers[0].bias, m, m.layers[0].bias + 1)


def test_equality_is_eqx_module_s_tree_equal():
    # quax and others assert `out == expected` on modules a transform made.
    for mlp in (AutoMLP, EqxMLP):
        a, b = mlp(2, 3, KEY), mlp(2, 3, KEY)  # equal numbers, other arrays
        assert a is not b and bool(a == b) and not bool(a != b)
        assert not bool(a == _bump_bias(a)) and bool(a != _bump_bias(a))
        assert not bool(a == mlp(2, 3, KEY, scale=2.0))
        assert a != "a string" and not bool(a == mlp(3, 3, KEY))
    auto, eqx_twin = AutoMLP(2, 3, KEY), EqxMLP(2, 3, KEY)
    assert type(auto == AutoMLP(2, 3, KEY)) is type(eqx_twin == EqxMLP(2, 3, KEY))

    @jax.jit
    def compare(m, other):
        return m == other  # a traced bool, as an eqx.Module gives

    assert bool(compare(auto, AutoMLP(2, 3, KEY)))
    assert not bool(compare(auto, _bump_bias(auto)))
    assert bool(jax.jit(lambda m, o: m == o)(eqx_twin, EqxMLP(2, 3, KEY)))


def test_hash_by_static_values_and_array_identity():
    a = AutoMLP(2, 3, KEY)
    same_arrays = jax.tree_util.tree_map(lambda x: x, a)
    assert (a == same_arrays) is True and hash(a) == hash(same_arrays)
    assert {a: 1}[same_arrays] == 1  # hashable, although it holds arrays
    assert asx.tree_at(lambda m: m.scale, a, 2.0) != a

    @jax.jit
    def under_trace(m):
        # JAX's caches (`lax.switch`'s branches) hash a module, then compare it to
        # the one found: the same tracers give a Python True, never a traced bool.
        rebuilt = jax.tree_util.tree_map(lambda x: x, m)
        assert (m == rebuilt) is True and hash(m) == hash(rebuilt)
        return m.layers[0].bias

    under_trace(a)

    class Cfg(asx.AutoModule):
        n: int
        name: str

    assert Cfg(1, "a") == Cfg(1, "a") and hash(Cfg(1, "a")) == hash(Cfg(1, "a"))
    assert Cfg(1, "a") != Cfg(2, "a")


def test_repr_as_in_equinox():
    class Cfg(asx.AutoModule):
        n: int
        name: str

    class EqxCfg(eqx.Module):
        n: int
        name: str

    assert repr(Cfg(1, "a")).endswith("Cfg(n=1, name='a')")
    assert repr(Cfg(1, "a")).replace("Cfg(", "EqxCfg(") == repr(EqxCfg(1, "a"))
    assert eqx.tree_pformat(AutoMLP(1, 2, KEY)).replace("Auto", "Eqx").replace(
        "sizes=[2, 2]", "sizes=(2, 2)"
    ) == eqx.tree_pformat(EqxMLP(1, 2, KEY))


class Inner(asx.AutoModule):
    w: jax.Array
    sizes: list
    name: str


class Outer(asx.AutoModule):
    inners: list
    config: dict
    scale: float

    def __init__(self):
        self.inners = [Inner(jnp.ones(2), [2, 2], "a"), Inner(jnp.zeros(2), [1], "b")]
        self.config = {"depth": 2, "bias": jnp.arange(2.0)}
        self.scale = 0.5

    def __call__(self, x):
        for inner in self.inners:
            x = inner.w * x + self.config["bias"]
        return self.scale * x


@pytest.mark.parametrize(
    "roundtrip",
    [copy.copy, copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))],
    ids=["copy", "deepcopy", "pickle"],
)
def test_copy_deepcopy_pickle_keep_partition(roundtrip):
    model = Outer()
    other = roundtrip(model)
    assert type(other) is Outer
    assert jax.tree_util.tree_structure(other) == jax.tree_util.tree_structure(model)
    assert eqx.tree_equal(other, model)
    with pytest.raises(dataclasses.FrozenInstanceError):
        other.scale = 1.0
    f = jax.jit(lambda m, x: m(x))
    np.testing.assert_allclose(f(other, jnp.ones(2)), f(model, jnp.ones(2)))
    # The copy's containers are its own: changing one leaves the original alone.
    if roundtrip is not copy.copy:
        other.inners[0].sizes.append(1)
        assert model.inners[0].sizes == [2, 2]
        assert jax.tree_util.tree_structure(model) != jax.tree_util.tree_structure(
            other
        )


class Activated(asx.AutoModule):
    records: list
    mlp: eqx.nn.MLP  # its activation `jax.nn.relu`, static in its carrier


class ActivatedTwin(eqx.Module):
    records: list
    mlp: eqx.nn.MLP


def test_a_deep_copy_keeps_static_functions_and_the_treedef():
    # `copy.deepcopy(jax.nn.relu)` is a new `custom_jvp`, equal to no other: a
    # static one copied so would give the copy another treedef (`jax.tree.map` over
    # the model and its copy, an EMA, fails), as it does in the twin marking it
    # static; the unmarked twin, of function leaves, maps.
    key = jax.random.key(0)
    made = ([(jnp.ones(2), jax.nn.relu, 3)], eqx.nn.MLP(2, 2, 4, 1, key=key))
    model, twin = Activated(*made), ActivatedTwin(*made)
    for original in (model, twin):
        copied = copy.deepcopy(original)
        assert copied.records[0][0] is not original.records[0][0]
        jax.tree.map(
            lambda e, p: (e + p) / 2 if eqx.is_array(e) else e, copied, original
        )
    copied = copy.deepcopy(model)
    assert eqx.tree_equal(copied, model)
    assert copied.records[0][1] is jax.nn.relu and copied.mlp.activation is jax.nn.relu
    assert jax.tree_util.tree_structure(copied) == jax.tree_util.tree_structure(model)
    traced = []
    f = jax.jit(lambda m: traced.append(1) or m.records[0][0])
    f(model), f(copied)
    assert len(traced) == 1


class _Vocabulary:  # a user's object, compared by identity, changed in place
    def __init__(self) -> None:
        self.words = {"a": 1}


class Tokenised(asx.AutoModule):
    w: jax.Array
    vocabulary: _Vocabulary
    scaled: Any  # a partial of a JAX function object


class TokenisedTwin(eqx.Module):
    w: jax.Array
    vocabulary: _Vocabulary = eqx.field(static=True)
    scaled: Any = eqx.field(static=True)


@pytest.mark.parametrize("cls", [Tokenised, TokenisedTwin], ids=["auto", "eqx"])
def test_a_deep_copy_copies_a_user_s_static_object(cls):
    model = cls(jnp.ones(2), _Vocabulary(), functools.partial(jax.nn.relu))
    copied = copy.deepcopy(model)
    assert copied.vocabulary is not model.vocabulary
    copied.vocabulary.words["b"] = 2
    assert model.vocabulary.words == {"a": 1}
    if cls is Tokenised:  # the function inside the partial stays itself
        assert copied.scaled.func is jax.nn.relu


class WithCallables(asx.AutoModule):
    w: jax.Array
    activation: Any
    kind: type
    layers: list


def halve(x: jax.Array) -> jax.Array:
    return x / 2


def test_pickle_of_functions_and_classes_reuses_the_jit_cache():
    # The aux data holds the static values' types: `function` cannot be pickled.
    model = WithCallables(
        jnp.ones(2), halve, np.float32, [eqx.nn.Linear(2, 2, key=KEY), halve]
    )
    other = pickle.loads(pickle.dumps(model))
    assert other.activation is halve and other.kind is np.float32
    assert other.layers[1] is halve
    assert jax.tree_util.tree_structure(other) == jax.tree_util.tree_structure(model)
    counter = TraceCounter(lambda m, x: m.activation(m.layers[0](m.w * x)))
    f = jax.jit(counter)
    np.testing.assert_allclose(f(model, jnp.ones(2)), f(other, jnp.ones(2)))
    assert counter.count == 1


def test_a_class_pickled_by_value_keeps_working_in_its_process():
    # cloudpickle (Ray, dask, loky) pickles a class defined in a script, a notebook
    # or a function by value; loading it in the same process sets every attribute of
    # the live class again, its dataclass fields as copies.
    class Held(asx.AutoModule):
        w: jax.Array
        sizes: list

        def scaled(self, x: jax.Array) -> jax.Array:
            return self.w * x * self.sizes[1]

    model = Held(jnp.ones(2), [1, 2])
    treedef = jax.tree_util.tree_structure(model)
    loaded = cloudpickle.loads(cloudpickle.dumps(model))
    assert type(loaded) is Held and loaded.sizes == [1, 2]
    assert cloudpickle.loads(cloudpickle.dumps(model.scaled))(3.0).tolist() == [6, 6]
    assert loaded.scaled(1.0).tolist() == [2.0, 2.0]
    assert jax.tree_util.tree_map(lambda x: x + 1, model).sizes == [1, 2]
    new = Held(jnp.ones(2), [1, 2])
    assert jax.tree_util.tree_structure(new) == treedef
    assert jax.jit(lambda m: m.w * m.sizes[1])(new).tolist() == [2.0, 2.0]
    assert eqx.tree_at(lambda m: m.w, model, jnp.zeros(2)).sizes == [1, 2]


def test_immutable_after_init_with_clear_errors():
    model = AutoMLP(1, 2, KEY)
    with pytest.raises(
        dataclasses.FrozenInstanceError, match=r"AutoMLP\.scale.*tree_at"
    ):
        model.scale = 2.0
    with pytest.raises(dataclasses.FrozenInstanceError, match=r"AutoMLP\.scale"):
        del model.scale


def test_undeclared_attribute_error_names_class_and_attribute():
    class Forgot(asx.AutoModule):
        w: jax.Array

        def __init__(self):
            self.w = jnp.ones(1)
            self.hidden = 3

    with pytest.raises(
        AttributeError, match=r"Forgot\.hidden is not a declared field.*hidden: Any"
    ):
        Forgot()


def test_field_never_set_error_names_class_and_attribute():
    class Unset(asx.AutoModule):
        w: jax.Array
        n: int

        def __init__(self):
            self.w = jnp.ones(1)

    with pytest.raises(
        TypeError, match=r"^Field 'n' was not initialized\. .*Unset\.n was never set"
    ):
        Unset()


def test_flatten_inside_init_and_check_init():
    flat_counts = []

    class Selfish(asx.AutoModule):
        w: jax.Array
        n: int

        def __init__(self):
            self.w = jnp.ones(2)
            self.n = 2
            flat_counts.append(len(jax.tree_util.tree_leaves(self)))

        def __check_init__(self):
            flat_counts.append(len(jax.tree_util.tree_leaves(self)))

    s = Selfish()
    assert flat_counts == [1, 1] and keystrs(s) == [".w"]


def test_uncomparable_static_value_error_names_its_type_and_the_fix():
    class Weird:
        def __eq__(self, other):
            raise RuntimeError("no comparison")

        __hash__ = object.__hash__

    class Holder(asx.AutoModule):
        w: jax.Array
        weird: object

    f = jax.jit(lambda m: m.w + 1)
    f(Holder(jnp.ones(1), Weird()))
    with pytest.raises(Exception) as info:
        f(Holder(jnp.ones(1), Weird()))
    chain, err = [], info.value
    while err is not None:
        chain.append(str(err))
        err = err.__cause__ or err.__context__
    assert any(
        "of type Weird cannot be compared" in message and "boolean __eq__" in message
        for message in chain
    )


def test_containers_pickle_as_the_built_ins_they_are():
    model = Outer()
    assert model.inners[0].sizes == [2, 2] and model.config["depth"] == 2
    again = pickle.loads(pickle.dumps(model))
    assert type(again.config) is dict and again.config["depth"] == 2
    assert type(again.inners) is list and type(again.inners[0].sizes) is list


def test_reading_an_unset_field_in_init_raises_attribute_error():
    class Early(asx.AutoModule):
        w: jax.Array
        n: int = 3

        def __init__(self):
            assert self.n == 3  # the default, as with a dataclass
            with pytest.raises(AttributeError, match="'w'"):
                self.w
            self.w = jnp.ones(1)

    assert Early().n == 3


@pytest.mark.parametrize("base", [asx.AutoModule, eqx.Module])
def test_a_flatten_inside_init_sees_the_fields_set_so_far(base):
    # As in an eqx.Module: the arrays set so far are the leaves, the rest is not yet
    # there; the finished instance flattens as any other, every time.
    seen = []

    class Early(base):
        w: jax.Array
        n: int
        b: jax.Array

        def __init__(self):
            self.w = jnp.ones(2)
            seen.append(jax.tree_util.tree_leaves(self))
            self.n = 3
            self.b = jnp.zeros(1)

    models = [Early(), Early()]
    assert [len(leaves) for leaves in seen] == [1, 1] and seen[0][0] is models[0].w
    leaves = jax.tree_util.tree_leaves(models[1])
    assert [x.shape for x in leaves if eqx.is_array(x)] == [(2,), (1,)]
    structures = {jax.tree_util.tree_structure(m) for m in models}
    assert len(structures) == 1


def test_unflattened_instances_read_their_own_values_not_defaults():
    class WithDefault(asx.AutoModule):
        w: jax.Array
        label: str = "default"

    m = WithDefault(jnp.ones(1), "mine")
    again = jax.tree_util.tree_map(lambda x: x + 1, m)
    assert again.label == "mine" and again.w == 2
    assert WithDefault(jnp.ones(1)).label == "default"
    assert vars(WithDefault)["label"] == "default"  # as on an eqx.Module


def test_equinox_internals_are_checked_at_import(monkeypatch):
    from autostatic import _compat

    _compat._check_equinox()  # the installed version passes
    installed = eqx.__version__
    monkeypatch.setattr(eqx, "__version__", "0.14.1")
    with pytest.raises(
        ImportError, match=r"equinox 0.14.1 is outside the verified range.*pip install"
    ):
        _compat._check_equinox()
    monkeypatch.setattr(eqx, "__version__", installed)
    monkeypatch.delattr(_compat._eqx_module, "_currently_initialising")
    with pytest.raises(
        ImportError,
        match=r"cannot work with the installed equinox: equinox\._module\._module\._currently_initialising is missing",
    ):
        _compat._check_equinox()


def test_cached_property_on_a_lazily_unflattened_instance():
    import functools

    class WithCache(asx.AutoModule):
        w: jax.Array
        n: int

        @functools.cached_property
        def constant(self):
            return 42  # reads no field, so it lands in __dict__ before the fields

    m = jax.tree_util.tree_map(lambda x: x + 1, WithCache(jnp.ones(2), 3))
    assert m.constant == 42
    assert m.n == 3 and m.w.tolist() == [2.0, 2.0]


def test_fields_shadowing_base_class_attributes_read_the_instance_value():
    class Base(eqx.Module):  # a non-AutoModule base with a default: stays on Base
        k: int = 3

    class Mixed(Base, asx.AutoModule):
        w: jax.Array = None

    m = Mixed(k=5, w=jnp.ones(2))
    np.testing.assert_allclose(jax.jit(lambda m: m.k * m.w)(m), [5.0, 5.0])
    assert jax.tree_util.tree_map(lambda x: x, m).k == 5

    class Parent(asx.AutoModule):
        w: jax.Array

        def norm(self):
            return "method"

    class Child(Parent):
        norm: str = "default"

    child = jax.tree_util.tree_map(lambda x: x, Child(jnp.ones(1), "field"))
    assert child.norm == "field"


def _own_getattr_classes(base: type) -> tuple[type, type, type]:
    """On `base`: a held module, a wrapper that delegates unknown names to it, and a
    module whose `__getattr__` gives a friendlier error for a typo."""
    static = base is eqx.Module

    class Inner(base):
        w: jax.Array

    class Wrapper(base):
        inner: Inner
        scale: float = eqx.field(static=static, default=3.0)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    class Strict(base):
        w: jax.Array
        n: int = eqx.field(static=static, default=2)

        def __getattr__(self, name):
            raise AttributeError(f"{type(self).__name__} has no field {name!r}")

    return Inner, Wrapper, Strict


@pytest.mark.parametrize("transform", ["tree_map", "jit", "filter_jit"])
def test_a_class_with_its_own_getattr_reads_its_fields_after_unflatten(transform):
    # A first read of a lazily unflattened instance goes through `__getattr__`: a
    # class with its own is filled in at unflatten instead.
    def run(base):
        inner, wrapper, strict = _own_getattr_classes(base)
        models = (wrapper(inner(jnp.ones(2))), strict(jnp.ones(2)))
        if transform == "tree_map":
            m, s = jax.tree_util.tree_map(lambda x: x + 1, models)
        else:
            jit = jax.jit if transform == "jit" else eqx.filter_jit
            m, s = jit(lambda models: models)(models)
        with pytest.raises(AttributeError, match="'w_typo'"):
            m.w_typo  # the wrapper passes it on: Inner has no such field
        with pytest.raises(AttributeError, match="Strict has no field 'n_typo'"):
            s.n_typo
        return m.w * m.scale, s.w * s.n, m.inner.w

    for ours, ref in zip(run(asx.AutoModule), run(eqx.Module)):
        np.testing.assert_allclose(ours, ref)


def test_dir_of_an_unflattened_module_lists_its_fields():
    class M(asx.AutoModule):
        w: jax.Array
        n: int = 3

    m = jax.tree_util.tree_map(lambda x: x + 1, M(jnp.ones(2)))
    assert {"w", "n"} <= set(dir(m))
    assert dict(inspect.getmembers(m))["n"] == 3


def test_attribute_error_inside_a_property_is_not_masked():
    class P(asx.AutoModule):
        w: jax.Array

        @property
        def bad(self):
            return self.w.nonexistent

    with pytest.raises(AttributeError, match="nonexistent"):
        P(jnp.ones(1)).bad
    with pytest.raises(AttributeError, match="has no attribute 'missing'"):
        P(jnp.ones(1)).missing


# Bad __init__ patterns get Equinox's errors, not RecursionError.


def test_assigning_a_bound_method_of_self_is_equinox_s_error():
    class Holder(asx.AutoModule):
        w: jax.Array
        fn: Any

        def __init__(self):
            self.w = jnp.ones(2)
            self.fn = self.double

        def double(self, x):
            return 2 * x

    with pytest.raises(
        ValueError, match=r"Holder\.fn: Cannot assign methods in __init__"
    ):
        Holder()


def test_passing_a_bound_method_of_self_to_super_init_is_equinox_s_error():
    class Base(asx.AutoModule):
        transform: Any

        def __init__(self, transform):
            self.transform = transform

    class Child(Base):
        w: jax.Array

        def __init__(self):
            self.w = jnp.ones(2)
            super().__init__(self._transform)

        def _transform(self, x):
            return x

    with pytest.raises(ValueError, match=r"Child\.transform: Cannot assign methods"):
        Child()


def test_a_module_in_its_own_field_is_a_clear_error():
    class Selfish(asx.AutoModule):
        xs: list

        def __init__(self):
            self.xs = [jnp.ones(1), self]

    with pytest.raises(
        TypeError, match=r"Selfish\.xs holds the .*Selfish instance itself"
    ):
        Selfish()


class _AbstractSize(asx.AutoModule):
    @property
    @abc.abstractmethod
    def size(self) -> int: ...


class _EqxAbstractSize(eqx.Module):
    @property
    @abc.abstractmethod
    def size(self) -> int: ...


@pytest.mark.parametrize("custom_init", [False, True])
def test_a_field_default_overrides_an_abstract_property_as_in_equinox(custom_init):
    def make(base):
        class Sized(base):
            size: int = 3
            w: jax.Array = eqx.field(default_factory=lambda: jnp.ones(2))

            if custom_init:

                def __init__(self):
                    self.w = jnp.zeros(2)

        return Sized

    auto, ref = make(_AbstractSize)(), make(_EqxAbstractSize)()
    assert auto.size == ref.size == 3
    assert keystrs(auto) == [".w"]  # the int is static
    rebuilt = jax.tree_util.tree_map(lambda x: x + 1, auto)  # unflattened: eager
    assert rebuilt.size == 3
    assert jax.jit(lambda m: m.w * m.size)(auto).shape == (2,)
    if not custom_init:
        assert make(_AbstractSize)(size=5).size == 5


@pytest.mark.parametrize("name", ["_autostatic_fields"])
def test_reserved_names_are_refused_with_the_name(name):
    # eqx.Module takes either name as a field; here it would shadow the partition.
    with pytest.raises(TypeError, match=rf"Bad\.{name}: this name is reserved"):
        type(asx.AutoModule)(
            "Bad", (asx.AutoModule,), {"__annotations__": {name: int, "w": jax.Array}}
        )


@pytest.mark.parametrize("base", [asx.AutoModule, eqx.Module], ids=["auto", "eqx"])
def test_a_class_attribute_over_an_abstract_property_is_the_field_value(base):
    class AbstractBase(base):
        config: list = eqx.field(static=True)

        @property
        @abc.abstractmethod
        def config(self):  # noqa: F811  # the field's abstract accessor
            pass

    class Concrete(AbstractBase):
        config = ["a", "b"]  # noqa: RUF012  # overrides the base property, as in Equinox

        def __init__(self):
            pass

    model = Concrete()
    assert model.config == ["a", "b"]
    assert jax.jit(lambda m: jnp.asarray(len(m.config)))(model) == 2


def test_works_when_equinox_is_type_checked_by_an_import_hook():
    """Equinox's own test suite imports equinox through jaxtyping's import hook with
    beartype, which wraps its functions: the import-time checks look through the
    wrappers."""
    code = (
        "import beartype, jax, jax.numpy as jnp\n"
        "from jaxtyping import install_import_hook\n"
        "conf = 'beartype.beartype(conf=beartype.BeartypeConf("
        "strategy=beartype.BeartypeStrategy.On))'\n"
        "with install_import_hook('equinox', conf):\n"
        "    import equinox as eqx\n"
        "import autostatic as asx\n"
        "class M(asx.AutoModule):\n"
        "    w: object\n"
        "    f: object\n"
        "m = M(jnp.ones(2), jax.nn.relu)\n"
        "print(float(jax.jit(lambda m: m.f(m.w).sum())(m)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "2.0"


def _class_level(base: type) -> tuple[type, type]:
    class WithClassVar(base):
        w: jax.Array
        count: ClassVar[int] = 1

        def __init__(self):
            self.w = jnp.ones(1)
            self.count = 3

    class WithInitVar(base):
        w: jax.Array = eqx.field(init=False)
        scale: dataclasses.InitVar[float] = 1.0

        def __post_init__(self, scale):
            self.w = jnp.ones(1) * scale
            self.scale = scale

    return WithClassVar, WithInitVar


@pytest.mark.parametrize("base", [asx.AutoModule, eqx.Module], ids=["auto", "eqx"])
def test_a_class_variable_set_on_an_instance_is_refused(base):
    # Held by the instance, a flatten would drop it: eager and `jax.jit` would differ.
    with_class_var, with_init_var = _class_level(base)
    with pytest.raises(dataclasses.FrozenInstanceError):
        with_class_var()
    with pytest.raises(dataclasses.FrozenInstanceError):
        with_init_var(2.0)


def test_an_unset_field_s_error_says_where_to_set_it():
    class Late(asx.AutoModule):
        w: jax.Array
        late: int = eqx.field(init=False)

    class Made(asx.AutoModule):
        items: list = eqx.field(default_factory=list)

        def __init__(self):
            pass

    with pytest.raises(TypeError, match=r"Late\.late was never set: __post_init__"):
        Late(jnp.ones(1))
    with pytest.raises(TypeError, match="default_factory runs only in the dataclass"):
        Made()


def _rebuilt_function(x: Any) -> Any:
    return x


class _StateHooks:
    def __getstate__(self):
        state = dict(self.__dict__)
        del state["function"]  # a local function, which pickle cannot store
        return state

    def __setstate__(self, state):
        self.__dict__.update(state, function=_rebuilt_function)


class Stateful(_StateHooks, asx.AutoModule):
    w: jax.Array
    function: Callable


class StatefulTwin(_StateHooks, eqx.Module):
    w: jax.Array
    function: Callable = eqx.field(static=True)


@pytest.mark.parametrize("cls", [Stateful, StatefulTwin], ids=["auto", "eqx"])
def test_a_class_s_own_getstate_and_setstate_are_used(cls):
    model = cls(jnp.ones(2), lambda x: x)
    for copied in (
        pickle.loads(pickle.dumps(model)),
        copy.copy(model),
        copy.deepcopy(model),
    ):
        assert copied.function is _rebuilt_function
        np.testing.assert_array_equal(copied.w, model.w)
