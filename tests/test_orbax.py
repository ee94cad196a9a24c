"""Sharded checkpoints with orbax-checkpoint: an AutoModule sharded
on a 2x4 mesh saves with `ocp.StandardCheckpointer` and restores into an
`eqx.filter_eval_shape` template carrying the shardings; an orbax checkpoint of the
eqx.Module twin restores into the same template; mismatches raise.

orbax keys a checkpoint by the tree's key paths (`('layers', '0', 'weight')`), and
restores by matching the template's key paths against the stored ones, not by
position. Static values have no key on either side; a static leaf inside a container
(the relu of `[Linear, relu, Linear]`) is an empty node in the AutoModule and `None`
in `eqx.filter(model, eqx.is_array)`, and both are stored as the same empty entry."""

import os
import re
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import autostatic as asx

from .helpers import needs_devices, TraceCounter

ocp = pytest.importorskip("orbax.checkpoint")


class Model(asx.AutoModule):
    layers: list  # [Linear, relu, Linear]: arrays are children, relu is static
    activation: Callable
    width: int
    sizes: list

    def __init__(self, width: int, key: jax.Array):
        k1, k2 = jax.random.split(key)
        self.layers = [
            eqx.nn.Linear(4, width, key=k1),
            jax.nn.relu,
            eqx.nn.Linear(width, width, key=k2),
        ]
        self.activation = jax.nn.tanh
        self.width = width
        self.sizes = [4, width, width]

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers:
            x = layer(x)
        return self.activation(x)


class EqxModel(eqx.Module):  # the same model, as written before migrating
    layers: list  # relu is a (non-array) leaf here: orbax gets eqx.filter(...)
    activation: Callable = eqx.field(static=True)
    width: int = eqx.field(static=True)
    sizes: tuple = eqx.field(static=True, converter=tuple)

    __init__ = Model.__init__
    __call__ = Model.__call__


WEIGHT, BIAS = P("data", "model"), P("model")


def shardings(tree, weight: P = WEIGHT, bias: P = BIAS):
    """NamedShardings on a 2x4 mesh, shaped like `tree` (array leaves only)."""
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))
    return jax.tree.map(
        lambda x: NamedSharding(mesh, weight if x.ndim == 2 else bias), tree
    )


def template(width: int, **specs) -> Model:
    abstract = eqx.filter_eval_shape(Model, width, jax.random.key(0))
    return jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
        abstract,
        shardings(abstract, **specs),
    )


def sharded_model(width: int = 8, seed: int = 0) -> Model:
    model = Model(width, jax.random.key(seed))
    return jax.device_put(model, shardings(model))


def save(path: Path, tree) -> None:
    with ocp.StandardCheckpointer() as checkpointer:  # close() waits for the commit
        checkpointer.save(path, tree)


def restore(path: Path, like):
    with ocp.StandardCheckpointer() as checkpointer:
        return checkpointer.restore(path, like)


def mismatches(path: Path, like) -> list[str]:
    """Key paths whose shape or dtype differ, or that one side lacks, from the
    checkpoint's metadata: nothing is read, so one error can name every key."""
    with ocp.StandardCheckpointer() as checkpointer:
        stored = ocp.tree.to_flat_dict(checkpointer.metadata(path).item_metadata.tree)
    wanted = ocp.tree.to_flat_dict(like)  # same keys as orbax: ('layers', '0', 'bias')
    problems = []
    for key in sorted(stored.keys() | wanted.keys()):
        have, want = stored.get(key), wanted.get(key)
        if have is None or want is None:
            side = "the checkpoint" if have is None else "the template"
            problems.append(f"{'.'.join(key)}: not in {side}")
        elif (have.shape, have.dtype) != (want.shape, want.dtype):
            problems.append(
                f"{'.'.join(key)}: stored {have.dtype}{list(have.shape)}, "
                f"template {want.dtype}{list(want.shape)}"
            )
    return problems


@pytest.fixture(autouse=True)
def no_leaked_threads():
    """orbax saves from background threads; closing the checkpointer ends them."""
    before = set(threading.enumerate())
    yield
    new = [t for t in threading.enumerate() if t not in before]
    for thread in new:
        thread.join(timeout=2)
    assert [t.name for t in new if t.is_alive()] == []


@needs_devices(8)
def test_sharded_save_restore_into_template(tmp_path):
    model = sharded_model()
    save(tmp_path / "ckpt", model)
    like = template(8)
    assert all(
        isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree_util.tree_leaves(like)
    )
    restored = restore(tmp_path / "ckpt", like)

    assert type(restored) is Model
    assert jax.tree.structure(restored) == jax.tree.structure(model)
    flat = jax.tree_util.tree_flatten_with_path(restored)[0]
    assert [jax.tree_util.keystr(p) for p, _ in flat] == [
        ".layers[0].weight",
        ".layers[0].bias",
        ".layers[2].weight",
        ".layers[2].bias",
    ]
    for got, want, shape in zip(
        jax.tree_util.tree_leaves(restored),
        jax.tree_util.tree_leaves(model),
        jax.tree_util.tree_leaves(like),
    ):
        assert isinstance(got, jax.Array)
        np.testing.assert_array_equal(got, want)
        assert got.sharding == shape.sharding == want.sharding
    assert restored.layers[1] is jax.nn.relu
    assert restored.activation is jax.nn.tanh
    assert (restored.width, restored.sizes) == (8, [4, 8, 8])

    # Plain jax.jit: the same results, and the restored model reuses the trace.
    counter = TraceCounter(lambda m, x: m(x))
    forward = jax.jit(counter)
    x = jnp.linspace(-1.0, 1.0, 4)
    np.testing.assert_array_equal(forward(restored, x), forward(model, x))
    assert counter.count == 1

    # Restoring into other shardings reshards: the template decides.
    replicated = restore(tmp_path / "ckpt", template(8, weight=P(), bias=P()))
    for got, want in zip(
        jax.tree_util.tree_leaves(replicated), jax.tree_util.tree_leaves(model)
    ):
        np.testing.assert_array_equal(got, want)
        assert got.sharding.spec == P() and got.sharding.is_fully_replicated


@needs_devices(8)
def test_migrate_eqx_module_checkpoint(tmp_path):
    old = EqxModel(8, jax.random.key(1))
    # orbax refuses the relu leaf of the eqx.Module; its users save the arrays.
    with pytest.raises(ValueError, match="Unsupported type"):
        save(tmp_path / "raw", old)
    params = eqx.filter(old, eqx.is_array)
    save(tmp_path / "eqx", jax.device_put(params, shardings(params)))

    migrated = restore(tmp_path / "eqx", template(8))
    assert type(migrated) is Model
    assert eqx.tree_equal(migrated, Model(8, jax.random.key(1)))
    assert not eqx.tree_equal(migrated, Model(8, jax.random.key(0)))
    for got, want in zip(
        jax.tree_util.tree_leaves(migrated), jax.tree_util.tree_leaves(template(8))
    ):
        assert got.sharding == want.sharding
    x = jnp.ones(4)
    np.testing.assert_allclose(migrated(x), old(x), rtol=1e-6)


class Scaled(asx.AutoModule):
    weight: jax.Array
    scale: float
    bias: jax.Array

    def __init__(self, key: jax.Array, scale: float = 2.0):
        self.weight = jax.random.normal(key, (4, 8))
        self.scale = scale
        self.bias = jnp.arange(8.0)


class EqxScaled(eqx.Module):  # `scale` not marked static; another field order
    bias: jax.Array
    scale: float
    weight: jax.Array

    __init__ = Scaled.__init__


class Wider(asx.AutoModule):
    weight: jax.Array
    bias: jax.Array
    extra: jax.Array

    def __init__(self, key: jax.Array):
        self.weight = jax.random.normal(key, (4, 8))
        self.bias = jnp.arange(8.0)
        self.extra = jnp.zeros(3)


def test_migrate_unmarked_scalar_by_key_path(tmp_path):
    """A non-array field the eqx.Module did not mark static is a key of its orbax
    checkpoint but static aux data in the AutoModule: orbax refuses the differing
    trees, and `partial_restore=True` restores the arrays by key path (not position),
    leaving a template leaf the checkpoint lacks as it was."""
    old = EqxScaled(jax.random.key(2))
    save(tmp_path / "eqx", old)  # stores `scale` as a scalar under ('scale',)
    like = eqx.filter_eval_shape(Scaled, jax.random.key(0))
    with pytest.raises(ValueError, match="tree structures do not match"):
        restore(tmp_path / "eqx", like)
    assert mismatches(tmp_path / "eqx", like) == ["scale: not in the template"]

    def by_key_path(like):
        with ocp.PyTreeCheckpointer() as checkpointer:
            restored = checkpointer.restore(
                tmp_path / "eqx",
                args=ocp.args.PyTreeRestore(
                    item=like,
                    restore_args=ocp.checkpoint_utils.construct_restore_args(like),
                    partial_restore=True,
                ),
            )
        missing = [
            jax.tree_util.keystr(p)
            for p, x in jax.tree_util.tree_flatten_with_path(restored)[0]
            if isinstance(x, jax.ShapeDtypeStruct)
        ]
        return restored, missing

    migrated, missing = by_key_path(like)
    assert missing == []
    assert eqx.tree_equal(migrated, Scaled(jax.random.key(2)))
    assert migrated.scale == 2.0  # from the template: the stored one is not read

    _, missing = by_key_path(eqx.filter_eval_shape(Wider, jax.random.key(0)))
    assert missing == [".extra"]


@needs_devices(8)
def test_mismatch_raises(tmp_path):
    save(tmp_path / "ckpt", sharded_model(width=8))
    # Checked against the metadata first: every key, nothing read.
    assert mismatches(tmp_path / "ckpt", template(16)) == [
        "layers.0.bias: stored float32[8], template float32[16]",
        "layers.0.weight: stored float32[8, 4], template float32[16, 4]",
        "layers.2.bias: stored float32[8], template float32[16]",
        "layers.2.weight: stored float32[8, 8], template float32[16, 16]",
    ]
    assert mismatches(tmp_path / "ckpt", template(8)) == []

    class Shorter(asx.AutoModule):
        layers: list

        def __init__(self, key: jax.Array):
            self.layers = [eqx.nn.Linear(4, 8, key=key)]

    # A different tree is refused by orbax before anything is read.
    with pytest.raises(ValueError, match="tree structures do not match"):
        restore(tmp_path / "ckpt", eqx.filter_eval_shape(Shorter, jax.random.key(0)))


# orbax 0.12.8 checks shapes shard by shard while reading: the first mismatching shard
# raises, and reads still in flight then hit the closed event loop ("Event loop is
# closed", "coroutine ... was never awaited", "Exception ignored"), reported at random
# later times. Run in a subprocess so that noise stays out of this test session.
_ORBAX_SHAPE_MISMATCH = textwrap.dedent(
    """
    import sys
    import equinox as eqx, jax, orbax.checkpoint as ocp
    import autostatic as asx

    class Net(asx.AutoModule):
        layer: eqx.nn.Linear

        def __init__(self, width, key):
            self.layer = eqx.nn.Linear(width, width, key=key)

    path = sys.argv[1]
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(path, Net(8, jax.random.key(0)))
    with ocp.StandardCheckpointer() as checkpointer:
        try:
            checkpointer.restore(path, eqx.filter_eval_shape(Net, 16, jax.random.key(0)))
        except Exception as err:
            print("RAISED", type(err).__name__, str(err).split(".")[0], flush=True)
    """
)


def test_orbax_shape_mismatch_raises_value_error(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", _ORBAX_SHAPE_MISMATCH, str(tmp_path / "ckpt")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        cwd=Path(__file__).parents[1],
    )
    raised = [line for line in out.stdout.splitlines() if line.startswith("RAISED")]
    assert len(raised) == 1, out.stderr[-2000:]
    assert raised[0] in {
        "RAISED ValueError Requested shape: (16, 16) is not compatible with the "
        "stored shape: (8, 8)",
        "RAISED ValueError Requested shape: (16,) is not compatible with the "
        "stored shape: (8,)",
    }


@needs_devices(8)
def test_readme_orbax_snippet_runs(tmp_path, monkeypatch):
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    section = readme.split("## Sharded and multi-host checkpoints (orbax)")[1]
    snippet = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    monkeypatch.chdir(tmp_path)
    model = sharded_model()  # saved as P("data", "model"), restored as P(None, "model")
    mesh = jax.tree.leaves(model)[0].sharding.mesh
    namespace = {"os": os, "eqx": eqx, "jax": jax, "Net": Model, "mesh": mesh}
    namespace["model"] = model
    exec(compile(snippet, "README.md", "exec"), namespace)
    restored = namespace["model"]
    assert type(restored) is Model and restored is not model
    assert (tmp_path / "checkpoints" / "step_1000").is_dir()
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(model)):
        np.testing.assert_array_equal(got, want)
        want_spec = P(None, "model") if got.ndim == 2 else P("model")
        assert got.sharding == NamedSharding(mesh, want_spec)
