"""Sharded checkpoints with orbax-checkpoint, the path beyond one machine: every host
writes and reads only its own shards.

1. An AutoModule sharded on a 2x4 mesh is saved with `ocp.StandardCheckpointer` and
   restored into an `eqx.filter_eval_shape` template whose `ShapeDtypeStruct`s carry
   the shardings: every array is read straight onto its devices.
2. A template of another width is checked against the checkpoint's metadata first, so
   one error names every mismatching key before anything is read.
3. Migrating from eqx.Module: an orbax checkpoint of the eqx.Module version (saved, as
   orbax needs, as `eqx.filter(model, eqx.is_array)`) restores into the AutoModule
   template as is: orbax matches key paths, and they are the same.

Needs `pip install orbax-checkpoint`. On a CPU-only machine the 8 devices are simulated:

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python examples/orbax_checkpoint.py
"""

import argparse
import os
import tempfile
from collections.abc import Callable
from typing import Any, TYPE_CHECKING

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import equinox as eqx
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import autostatic as asx

if TYPE_CHECKING:  # imported where used, so that --help needs no orbax
    import orbax.checkpoint as ocp


class Net(asx.AutoModule):
    layers: list  # [Linear, relu, Linear]: no static markers anywhere
    activation: Callable
    width: int

    def __init__(self, width: int, key: jax.Array):
        k1, k2 = jax.random.split(key)
        self.layers = [
            eqx.nn.Linear(4, width, key=k1),
            jax.nn.relu,
            eqx.nn.Linear(width, width, key=k2),
        ]
        self.activation = jax.nn.tanh
        self.width = width

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers:
            x = layer(x)
        return self.activation(x)


class EqxNet(eqx.Module):  # the same model, as it was written before migrating
    layers: list
    activation: Callable = eqx.field(static=True)
    width: int = eqx.field(static=True)

    def __init__(self, width: int, key: jax.Array):
        k1, k2 = jax.random.split(key)
        self.layers = [
            eqx.nn.Linear(4, width, key=k1),
            jax.nn.relu,
            eqx.nn.Linear(width, width, key=k2),
        ]
        self.activation = jax.nn.tanh
        self.width = width

    __call__ = Net.__call__


def shardings(tree, mesh: Mesh):
    """Weights split over both mesh axes, biases over "model"."""
    return jax.tree.map(
        lambda x: NamedSharding(
            mesh, P("data", "model") if x.ndim == 2 else P("model")
        ),
        tree,
    )


def template(width: int, mesh: Mesh) -> Net:
    abstract = eqx.filter_eval_shape(Net, width, jax.random.key(0))  # no allocation
    return jax.tree.map(
        lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
        abstract,
        shardings(abstract, mesh),
    )


def mismatches(checkpointer: "ocp.StandardCheckpointer", path: str, like) -> list[str]:
    """Key paths whose shape or dtype differ, or that one side lacks, read from the
    checkpoint's metadata (orbax itself stops at the first shard that does not fit)."""
    metadata = checkpointer.metadata(path).item_metadata
    if metadata is None:
        raise ValueError(f"{path} has no item metadata to compare with")
    # Dicts keyed by path tuples, ('layers', '0', 'weight'), alike on both sides;
    # orbax annotates them as any pytree.
    import orbax.checkpoint as ocp

    stored: dict[tuple[str, ...], Any] = ocp.tree.to_flat_dict(metadata.tree)
    wanted: dict[tuple[str, ...], Any] = ocp.tree.to_flat_dict(like)
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


def main(fast: bool = False) -> dict:
    del fast  # small either way
    with tempfile.TemporaryDirectory() as folder:
        return _run(folder)


def _run(folder: str) -> dict:
    import orbax.checkpoint as ocp

    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))
    model = Net(8, jax.random.key(0))
    model = jax.device_put(model, shardings(model, mesh))
    path = os.path.join(folder, "net")  # orbax wants an absolute path

    with ocp.StandardCheckpointer() as checkpointer:  # leaving it waits for the commit
        checkpointer.save(path, model)  # async: save returns before the write ends

    like = template(8, mesh)
    with ocp.StandardCheckpointer() as checkpointer:
        problems = mismatches(checkpointer, path, template(16, mesh))
        print("a width-16 template does not fit:", *problems, sep="\n  ")
        assert not mismatches(checkpointer, path, like)
        restored = checkpointer.restore(path, like)
    equal = all(
        np.array_equal(a, b)
        for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(model))
    )
    same_shardings = all(
        a.sharding == b.sharding
        for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(like))
    )
    print("restored equal:", equal, "| shardings from the template:", same_shardings)
    print("first weight:", restored.layers[0].weight.sharding.spec)

    # Migrating: the eqx.Module version's orbax checkpoint has the same key paths.
    old = EqxNet(8, jax.random.key(1))
    params = eqx.filter(old, eqx.is_array)  # orbax refuses the relu leaf
    old_path = os.path.join(folder, "eqx_net")
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(old_path, jax.device_put(params, shardings(params, mesh)))
    with ocp.StandardCheckpointer() as checkpointer:
        migrated = checkpointer.restore(old_path, like)
    migrated_equal = bool(eqx.tree_equal(migrated, Net(8, jax.random.key(1))))
    print("migrated from eqx.Module:", type(migrated).__name__, migrated_equal)

    forward = jax.jit(lambda m, x: m(x))  # plain jax.jit takes the restored modules
    x = jax.numpy.ones(4)
    same_output = bool(np.allclose(forward(migrated, x), old(x), rtol=1e-6))
    return {
        "restored_equal": equal,
        "shardings_match": same_shardings,
        "mismatched_keys": len(problems),
        "migrated_equal": migrated_equal and same_output,
    }


def parse_args() -> argparse.Namespace:
    """`--help` prints the docstring above and exits before anything runs."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--fast",
        action="store_true",
        help="no effect here: this example is already small",
    )
    return parser.parse_args()


if __name__ == "__main__":
    main(fast=parse_args().fast)
