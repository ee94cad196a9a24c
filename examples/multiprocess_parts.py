"""The model and the steps of `multiprocess_training.py`, which every process runs
after `jax.distributed.initialize`, and which a single process imports to restore the
checkpoint onto its own devices."""

import io
import os
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import autostatic as asx

SIZES = (8, 16, 16, 4)


class Net(asx.AutoModule):
    layers: list  # of {"w", "b"} dicts: no static markers anywhere
    activation: Callable[[jax.Array], jax.Array]
    sizes: tuple

    def __init__(self, sizes: tuple[int, ...], key: jax.Array):
        keys = jax.random.split(key, len(sizes) - 1)
        self.layers = [
            {"w": jax.random.normal(k, (i, o)) / i**0.5, "b": jnp.zeros(o)}
            for k, i, o in zip(keys, sizes, sizes[1:])
        ]
        self.activation = jax.nn.tanh
        self.sizes = sizes

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers[:-1]:
            x = self.activation(x @ layer["w"] + layer["b"])
        return x @ self.layers[-1]["w"] + self.layers[-1]["b"]


def shardings(tree: Any, mesh: Mesh) -> Any:
    """Each weight split over "model" on its output dimension, each bias likewise."""
    return jax.tree.map(
        lambda x: NamedSharding(mesh, P(None, "model") if x.ndim == 2 else P("model")),
        tree,
    )


def global_arrays(tree: Any, mesh: Mesh) -> Any:
    """Arrays over every process's devices from a host copy each process holds (the
    same seed everywhere): each device takes its own block."""
    host = jax.tree.map(np.asarray, tree)
    return jax.tree.map(
        lambda x, s: jax.make_array_from_callback(x.shape, s, lambda i: x[i]),
        host,
        shardings(host, mesh),
    )


def template(mesh: Mesh) -> Net:
    """An abstract `Net` whose arrays carry `mesh`'s shardings: nothing allocated."""
    abstract = eqx.filter_eval_shape(Net, SIZES, jax.random.key(0))
    return jax.tree.map(
        lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
        abstract,
        shardings(abstract, mesh),
    )


def _batch(mesh: Mesh) -> tuple[jax.Array, jax.Array]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, SIZES[0])).astype(np.float32)
    y = np.sin(x[:, : SIZES[-1]])
    data = NamedSharding(mesh, P("data"))
    return tuple(
        jax.make_array_from_callback(a.shape, data, lambda i, a=a: a[i]) for a in (x, y)
    )  # pyright: ignore[reportReturnType]


def _trained(model: Net, mesh: Mesh, steps: int) -> tuple[Net, list[float]]:
    import optax

    optimiser = optax.adam(1e-2)
    x, y = _batch(mesh)

    @jax.jit  # plain jax.jit: the module is an argument like any pytree
    def step(model: Any, state: Any, x: jax.Array, y: jax.Array) -> Any:
        def loss(m: Net) -> jax.Array:
            return jnp.mean((jax.vmap(m)(x) - y) ** 2)

        value, grads = jax.value_and_grad(loss)(model)
        updates, state = optimiser.update(grads, state, model)
        return optax.apply_updates(model, updates), state, value

    state = jax.jit(optimiser.init)(model)
    losses = []
    for _ in range(steps):
        model, state, value = step(model, state, x, y)
        losses.append(float(value))  # replicated: every process holds it
    return model, losses


def report(folder: str, steps: int) -> dict[str, Any]:
    """Trains `steps` steps on a mesh of every process's devices ("data" across
    processes, "model" within), saves with orbax from every process, restores onto a
    mesh of all devices on "model"; process 0 also writes the trained values to
    `folder/expected.npz` for a restore elsewhere."""
    import orbax.checkpoint as ocp
    from jax.experimental import multihost_utils

    processes = jax.process_count()
    devices = np.array(jax.devices()).reshape(processes, -1)
    mesh = Mesh(devices, ("data", "model"))
    model = global_arrays(Net(SIZES, jax.random.key(0)), mesh)
    model, losses = _trained(model, mesh, steps)
    try:
        asx.save(io.BytesIO(), model)
        refused = ""
    except asx.CheckpointError as error:
        refused = str(error)
    path = os.path.join(os.path.abspath(folder), "net")
    with ocp.StandardCheckpointer() as checkpointer:  # every process writes its shards
        checkpointer.save(path, model)
    other = Mesh(np.array(jax.devices()).reshape(1, -1), ("data", "model"))
    with ocp.StandardCheckpointer() as checkpointer:
        restored = checkpointer.restore(path, template(other))
    trained = multihost_utils.process_allgather(
        eqx.filter(model, eqx.is_array), tiled=True
    )
    back = multihost_utils.process_allgather(
        eqx.filter(restored, eqx.is_array), tiled=True
    )
    leaves = jax.tree.leaves(trained)
    if jax.process_index() == 0:
        np.savez(os.path.join(folder, "expected.npz"), *leaves)
    return {
        "process": jax.process_index(),
        "processes": processes,
        "devices": jax.device_count(),
        "losses": losses,
        "save_refused": refused,
        "restored_equal": all(map(np.array_equal, leaves, jax.tree.leaves(back))),
        "restored_type": type(restored).__name__,
        "restored_spec": str(restored.layers[0]["w"].sharding.spec),
    }
