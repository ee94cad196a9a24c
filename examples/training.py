"""Training an AutoModule: an optax loop under plain `jax.jit`, a model with BatchNorm
state, and a checkpoint of `(model, opt_state, key)` that resumes training bit for bit.
`docs/training.md` shows this file's code.

    python examples/training.py [--fast]
"""

import argparse
import tempfile
from typing import Any

# The imports docs/training.md shows, kept apart from those of the command line.
# isort: split
# --8<-- [start:imports]
import os
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

import autostatic as asx

# --8<-- [end:imports]


# --8<-- [start:model]
class MLP(asx.AutoModule):
    layers: list  # of eqx.nn.Linear
    activation: Callable  # static by itself: no eqx.field(static=True)

    def __init__(self, sizes: list[int], key: jax.Array):
        keys = jax.random.split(key, len(sizes) - 1)
        self.layers = [
            eqx.nn.Linear(n_in, n_out, key=k)
            for k, n_in, n_out in zip(keys, sizes, sizes[1:])
        ]
        self.activation = jax.nn.tanh

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers[:-1]:
            x = self.activation(layer(x))
        return self.layers[-1](x)


# --8<-- [end:model]


# --8<-- [start:step]
optimiser = optax.adam(1e-2)


def loss_fn(model: MLP, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


@jax.jit
def step(model, opt_state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(model, x, y)
    updates, opt_state = optimiser.update(grads, opt_state, model)
    return optax.apply_updates(model, updates), opt_state, loss


def batch(key: jax.Array, size: int = 64) -> tuple[jax.Array, jax.Array]:
    x = jax.random.uniform(key, (size, 1), minval=-3, maxval=3)
    return x, jnp.sin(x)


def train(model, opt_state, key, steps: int):
    """`steps` steps, each on a fresh batch drawn from `key`; returns the new state
    of training, `(model, opt_state, key)`, and the losses."""
    losses = []
    for _ in range(steps):
        key, data_key = jax.random.split(key)
        model, opt_state, loss = step(model, opt_state, *batch(data_key))
        losses.append(float(loss))
    return model, opt_state, key, losses


# --8<-- [end:step]


# --8<-- [start:start]
def start(seed: int) -> tuple[MLP, optax.OptState, jax.Array]:
    model_key, train_key = jax.random.split(jax.random.key(seed))
    model = MLP([1, 32, 32, 1], model_key)
    # The activation is static aux data, not a leaf: optax sees only the arrays.
    # (optax's `Params` annotation names arrays and containers; any pytree works.)
    opt_state = optimiser.init(model)  # pyright: ignore[reportArgumentType]
    return model, opt_state, train_key


# --8<-- [end:start]


def optax_loop(fast: bool) -> dict[str, float]:
    # --8<-- [start:loop]
    model, opt_state, key = start(seed=0)
    model, opt_state, key, losses = train(model, opt_state, key, 60 if fast else 600)
    for i in range(0, len(losses), len(losses) // 6):
        print(f"step {i:3d}  loss {losses[i]:.4f}")
    # --8<-- [end:loop]
    print(f"last loss {losses[-1]:.4f}")
    return {"first_loss": losses[0], "last_loss": losses[-1]}


# --8<-- [start:stateful_model]
class NormedMLP(asx.AutoModule):
    linear1: eqx.nn.Linear
    norm: eqx.nn.BatchNorm
    linear2: eqx.nn.Linear
    activation: Callable

    def __init__(self, key: jax.Array):
        k1, k2 = jax.random.split(key)
        self.linear1 = eqx.nn.Linear(1, 32, key=k1)
        # Batch statistics over the vmapped axis named "batch".
        self.norm = eqx.nn.BatchNorm(32, axis_name="batch", mode="batch")
        self.linear2 = eqx.nn.Linear(32, 1, key=k2)
        self.activation = jax.nn.relu

    def __call__(self, x: jax.Array, state: eqx.nn.State):
        x, state = self.norm(self.linear1(x), state)
        return self.linear2(self.activation(x)), state


def stateful_loss(model, state, x, y):
    # One state for the whole batch: in and out unbatched (None).
    batched = jax.vmap(model, axis_name="batch", in_axes=(0, None), out_axes=(0, None))
    prediction, state = batched(x, state)
    return jnp.mean((prediction - y) ** 2), state


@jax.jit
def stateful_step(model, state, opt_state, x, y):
    grad_fn = jax.value_and_grad(stateful_loss, has_aux=True)
    (loss, state), grads = grad_fn(model, state, x, y)
    updates, opt_state = optimiser.update(grads, opt_state, model)
    return optax.apply_updates(model, updates), state, opt_state, loss


@jax.jit
def predict(model, state, x):
    # In inference mode BatchNorm uses the running statistics: no axis name needed.
    return jax.vmap(model, in_axes=(0, None), out_axes=(0, None))(x, state)[0]


# --8<-- [end:stateful_model]


def stateful(fast: bool) -> dict[str, Any]:
    # --8<-- [start:stateful_loop]
    model, state = eqx.nn.make_with_state(NormedMLP)(jax.random.key(0))
    opt_state = optimiser.init(model)  # pyright: ignore[reportArgumentType]
    losses = []
    for data_key in jax.random.split(jax.random.key(1), 60 if fast else 600):
        x, y = batch(data_key)
        model, state, opt_state, loss = stateful_step(model, state, opt_state, x, y)
        losses.append(float(loss))

    inference = eqx.nn.inference_mode(model)
    x, y = batch(jax.random.key(2), size=256)
    test_loss = jnp.mean((predict(inference, state, x) - y) ** 2)
    # Running statistics, not the batch's: one example alone predicts the same
    # (up to rounding).
    alone = predict(inference, state, x[:1])
    gap = jnp.max(jnp.abs(alone - predict(inference, state, x)[:1]))
    print(f"losses: first {losses[0]:.4f}, last {losses[-1]:.4f}, test {test_loss:.4f}")
    print(f"one example alone differs by {gap:.1e}")
    # --8<-- [end:stateful_loop]
    return {
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "test_loss": float(test_loss),
        "alone_gap": float(gap),
        "inference": inference.norm.inference,
    }


# --8<-- [start:checkpoint]
def saveable(model, opt_state, key):
    # A typed PRNG key has no portable bytes: a checkpoint holds its raw data.
    return model, opt_state, jax.random.key_data(key)


def save_checkpoint(path: str, model, opt_state, key: jax.Array) -> None:
    asx.save(path, saveable(model, opt_state, key))


def load_checkpoint(path: str):
    # The structure, shapes and static values of a fresh start, allocating nothing.
    template = eqx.filter_eval_shape(lambda: saveable(*start(seed=0)))
    model, opt_state, key_data = asx.load(path, template)
    return model, opt_state, jax.random.wrap_key_data(key_data)


def same(a, b) -> bool:
    """Equal structure and static values, and every leaf bitwise equal."""
    leaves_a, treedef_a = jax.tree.flatten(a)
    leaves_b, treedef_b = jax.tree.flatten(b)
    return treedef_a == treedef_b and all(
        jnp.array_equal(x, y) for x, y in zip(leaves_a, leaves_b)
    )


# --8<-- [end:checkpoint]


def resume(fast: bool, folder: str) -> dict[str, bool]:
    n, m = (10, 10) if fast else (200, 200)
    # --8<-- [start:resume]
    path = os.path.join(folder, "checkpoint.safetensors")
    model, opt_state, key, first = train(*start(seed=0), steps=n)
    save_checkpoint(path, model, opt_state, key)
    del model, opt_state, key  # as if the process had stopped here

    model, opt_state, key = load_checkpoint(path)
    model, opt_state, key, later = train(model, opt_state, key, steps=m)

    *uninterrupted, losses = train(*start(seed=0), steps=n + m)
    same_state = same(saveable(model, opt_state, key), saveable(*uninterrupted))
    print(f"resumed equals uninterrupted, bit for bit: {same_state}")
    print(f"same losses: {first + later == losses}")
    # --8<-- [end:resume]
    return {"same_state": same_state, "same_losses": first + later == losses}


def main(fast: bool = False) -> dict[str, Any]:
    print("-- an optax loop under plain jax.jit")
    out: dict[str, Any] = {"optax": optax_loop(fast)}
    print("-- a model with BatchNorm state")
    out["stateful"] = stateful(fast)
    print("-- checkpoint and resume")
    with tempfile.TemporaryDirectory() as folder:
        out["resume"] = resume(fast, folder)
    # jax's count of the step's compilations (a private method, so unannotated): the
    # fresh, trained and loaded models all share one.
    out["step_traces"] = step._cache_size()  # pyright: ignore[reportAttributeAccessIssue]
    print(f"traces of the step function: {out['step_traces']}")
    return out


def parse_args() -> argparse.Namespace:
    """`--help` prints the docstring above and exits before anything runs."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--fast",
        action="store_true",
        help="a short run (60 steps per model, resume after 10 of 20), as the tests use",
    )
    return parser.parse_args()


if __name__ == "__main__":
    main(fast=parse_args().fast)
