"""Checkpoints keyed by natural key paths.

1. Save an AutoModule, load it back *to the host* (numpy, nothing on any device) from an
   `eqx.filter_eval_shape` template, then to the device.
2. Migrate from eqx.Module: a checkpoint written by `autostatic.save` for the eqx.Module
   version of a model loads into the AutoModule version (same key paths), and a file
   written by `eqx.tree_serialise_leaves` loads with `autostatic.load_eqx`.

    python examples/checkpoint_to_host.py
"""

import argparse
import os
import tempfile

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import autostatic as asx


class Net(asx.AutoModule):
    layers: list
    dropout: eqx.nn.Dropout
    width: int

    def __init__(self, width: int, key: jax.Array):
        k1, k2 = jax.random.split(key)
        self.layers = [
            eqx.nn.Linear(width, width, key=k1),
            eqx.nn.Linear(width, 1, key=k2),
        ]
        self.dropout = eqx.nn.Dropout(0.1)
        self.width = width


class EqxNet(eqx.Module):  # the same model, as it was written before migrating
    layers: list
    dropout: eqx.nn.Dropout
    width: int

    def __init__(self, width: int, key: jax.Array):
        k1, k2 = jax.random.split(key)
        self.layers = [
            eqx.nn.Linear(width, width, key=k1),
            eqx.nn.Linear(width, 1, key=k2),
        ]
        self.dropout = eqx.nn.Dropout(0.1)
        self.width = width


def main(fast: bool = False) -> dict[str, bool]:
    del fast
    with tempfile.TemporaryDirectory() as folder:
        return _run(folder)


def _run(folder: str) -> dict[str, bool]:
    path = os.path.join(folder, "net.safetensors")
    model = Net(8, jax.random.key(0))
    asx.save(path, model)

    template = eqx.filter_eval_shape(Net, 8, jax.random.key(0))  # ShapeDtypeStructs
    on_host = asx.load(path, template, host=True)
    leaf_types = {type(x).__name__ for x in jax.tree_util.tree_leaves(on_host)}
    print("host load leaf types:", leaf_types)
    on_device = asx.load(path, template)
    print(
        "device load leaf types:",
        {type(x).__name__ for x in jax.tree_util.tree_leaves(on_device)},
    )
    same = all(
        np.array_equal(a, b)
        for a, b in zip(
            jax.tree_util.tree_leaves(on_host), jax.tree_util.tree_leaves(model)
        )
    )

    # Migrating: an eqx.Module checkpoint, keyed by the same paths.
    old = EqxNet(8, jax.random.key(1))
    asx.save(path, eqx.filter(old, eqx.is_array))
    migrated = asx.load(path, template)
    print(
        "migrated weight equal:",
        bool(jnp.all(migrated.layers[0].weight == old.layers[0].weight)),
    )

    # ... and a file written by Equinox itself (positional, Python scalars included).
    eqx_path = os.path.join(folder, "net.eqx")
    eqx.tree_serialise_leaves(eqx_path, old)
    from_eqx = asx.load_eqx(eqx_path, template)
    print(
        "load_eqx weight equal:",
        bool(jnp.all(from_eqx.layers[1].weight == old.layers[1].weight)),
    )
    try:  # a template whose static value differs from the stored one is refused
        asx.load_eqx(eqx_path, asx.tree_at(lambda m: m.dropout.p, template, 0.5))
    except asx.CheckpointError as err:
        # The whole message: the lines after its first name each problem.
        print("mismatch refused:", err)
    return {"host_numpy": leaf_types == {"ndarray"}, "roundtrip": same}


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
