"""Data- and model-parallel training of an AutoModule on a mesh of 8 devices with
`NamedSharding`: multi-device scale is JAX's own sharding, unchanged. On a CPU-only
machine the 8 devices are simulated:

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python examples/sharded_training.py
"""

import argparse
import itertools
import os
from collections.abc import Callable

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import autostatic as asx


class MLP(asx.AutoModule):
    hidden: list
    out: dict
    activation: Callable[[jax.Array], jax.Array]

    def __init__(self, sizes: list[int], key: jax.Array):
        keys = jax.random.split(key, len(sizes))
        self.hidden = []
        for k, (n_in, n_out) in zip(keys, itertools.pairwise(sizes[:-1])):
            self.hidden.append(
                {
                    "w": jax.random.normal(k, (n_in, n_out)) / n_in**0.5,
                    "b": jnp.zeros(n_out),
                }
            )
        self.out = {
            "w": jax.random.normal(keys[-1], (sizes[-2], sizes[-1])) / sizes[-2] ** 0.5
        }
        self.activation = jax.nn.relu

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.hidden:
            x = self.activation(x @ layer["w"] + layer["b"])
        return x @ self.out["w"]


def shard_model(model: MLP, mesh: Mesh) -> MLP:
    """Megatron-style: hidden weights split over "model" on their output dimension."""

    def spec(path, leaf):
        name = jax.tree_util.keystr(path)
        if name.startswith(".hidden") and leaf.ndim == 2:
            return NamedSharding(mesh, P(None, "model"))
        if name.startswith(".hidden"):
            return NamedSharding(mesh, P("model"))
        return NamedSharding(mesh, P("model"))  # as XLA writes it back: no retrace

    shardings = jax.tree_util.tree_map_with_path(spec, model)  # a module-shaped tree
    return jax.device_put(model, shardings)


optimiser = optax.adam(1e-2)


@jax.jit
def step(model, opt_state, x, y):
    loss, grads = jax.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
    updates, opt_state = optimiser.update(grads, opt_state, model)
    return optax.apply_updates(model, updates), opt_state, loss


def main(fast: bool = False) -> dict[str, float | str]:
    devices = jax.devices()
    if len(devices) < 8:
        raise SystemExit(
            "needs 8 devices: set XLA_FLAGS=--xla_force_host_platform_device_count=8"
        )
    mesh = Mesh(np.array(devices[:8]).reshape(2, 4), ("data", "model"))
    model = shard_model(MLP([16, 64, 64, 1], jax.random.key(0)), mesh)
    # The optimiser state is placed like the model (its moments are model-shaped) and
    # replicated elsewhere, as the step will return it: one compilation only.
    shardings = jax.tree_util.tree_map(lambda a: a.sharding, model)
    placement = optax.tree_map_params(
        optimiser,
        lambda _, sharding: sharding,
        jax.eval_shape(optimiser.init, model),
        shardings,
        transform_non_params=lambda _: NamedSharding(mesh, P()),
    )
    opt_state = jax.jit(optimiser.init, out_shardings=placement)(model)
    data = NamedSharding(mesh, P("data"))
    key = jax.random.key(1)
    losses = []
    for _ in range(10 if fast else 200):
        key, k = jax.random.split(key)
        x = jax.random.normal(k, (64, 16))
        y = jnp.sin(x.sum(axis=1, keepdims=True))
        model, opt_state, loss = step(
            model, opt_state, jax.device_put(x, data), jax.device_put(y, data)
        )
        losses.append(float(loss))
    print(
        "weight sharding:",
        model.hidden[0]["w"].sharding.spec,
        "on",
        model.hidden[0]["w"].sharding.mesh.shape,
    )
    # jax's count of the step's compilations: a private method, so unannotated.
    traces = step._cache_size()  # pyright: ignore[reportAttributeAccessIssue]
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}; traces: {traces}")
    return {
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "spec": str(model.hidden[0]["w"].sharding.spec),
    }


def parse_args() -> argparse.Namespace:
    """`--help` prints the docstring above and exits before anything runs."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--fast", action="store_true", help="a short run (10 steps), as the tests use"
    )
    return parser.parse_args()


if __name__ == "__main__":
    main(fast=parse_args().fast)
