"""A small transformer as an AutoModule: blocks built with `self.blocks = []` and
`.append` in `__init__`, Equinox layers inside, a float dropout rate, trained a few
steps on a toy next-token task with plain `jax.jit`.

    python examples/transformer.py [--fast]
"""

import argparse

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

import autostatic as asx


class Block(asx.AutoModule):
    norm1: eqx.nn.LayerNorm
    attention: eqx.nn.MultiheadAttention
    norm2: eqx.nn.LayerNorm
    mlp: eqx.nn.MLP
    dropout: eqx.nn.Dropout

    def __init__(self, dim: int, heads: int, dropout_rate: float, key: jax.Array):
        k1, k2 = jax.random.split(key)
        self.norm1 = eqx.nn.LayerNorm(dim)
        self.attention = eqx.nn.MultiheadAttention(heads, dim, key=k1)
        self.norm2 = eqx.nn.LayerNorm(dim)
        self.mlp = eqx.nn.MLP(
            dim, dim, 4 * dim, depth=1, activation=jax.nn.gelu, key=k2
        )
        self.dropout = eqx.nn.Dropout(dropout_rate)

    def __call__(self, x: jax.Array, mask: jax.Array, key: jax.Array) -> jax.Array:
        k1, k2 = jax.random.split(key)
        h = jax.vmap(self.norm1)(x)
        x = x + self.dropout(self.attention(h, h, h, mask=mask), key=k1)
        h = jax.vmap(self.norm2)(x)
        return x + self.dropout(jax.vmap(self.mlp)(h), key=k2)


class Transformer(asx.AutoModule):
    embedding: eqx.nn.Embedding
    positions: jax.Array
    blocks: list
    head: eqx.nn.Linear
    context: int

    def __init__(self, vocab: int, dim: int, depth: int, context: int, key: jax.Array):
        keys = jax.random.split(key, depth + 3)
        self.embedding = eqx.nn.Embedding(vocab, dim, key=keys[0])
        self.positions = 0.02 * jax.random.normal(keys[1], (context, dim))
        self.blocks = []
        for k in keys[2:-1]:
            self.blocks.append(Block(dim, heads=4, dropout_rate=0.1, key=k))
        self.head = eqx.nn.Linear(dim, vocab, key=keys[-1])
        self.context = context

    def __call__(self, tokens: jax.Array, key: jax.Array) -> jax.Array:
        x = jax.vmap(self.embedding)(tokens) + self.positions[: tokens.shape[0]]
        mask = jnp.tril(jnp.ones((tokens.shape[0], tokens.shape[0]), bool))
        for block, k in zip(self.blocks, jax.random.split(key, len(self.blocks))):
            x = block(x, mask, k)
        return jax.vmap(self.head)(x)


def batch(key: jax.Array, size: int, context: int, vocab: int) -> jax.Array:
    # Counting sequences modulo vocab: the next token is always the previous one + 1.
    start = jax.random.randint(key, (size, 1), 0, vocab)
    return (start + jnp.arange(context + 1)) % vocab


def loss_fn(model: Transformer, seqs: jax.Array, key: jax.Array) -> jax.Array:
    keys = jax.random.split(key, seqs.shape[0])
    logits = jax.vmap(model)(seqs[:, :-1], keys)
    return optax.softmax_cross_entropy_with_integer_labels(logits, seqs[:, 1:]).mean()


optimiser = optax.adamw(3e-3)


@jax.jit
def step(model, opt_state, seqs, key):
    loss, grads = jax.value_and_grad(loss_fn)(model, seqs, key)
    updates, opt_state = optimiser.update(grads, opt_state, model)
    return optax.apply_updates(model, updates), opt_state, loss


def main(fast: bool = False) -> dict[str, float]:
    vocab, context = 16, 12
    depth = 1 if fast else 2
    model = Transformer(
        vocab, dim=32, depth=depth, context=context, key=jax.random.key(0)
    )
    # The dropout rate and flag are static: plain jax.jit accepts the model.
    print(asx.explain(model, path="dropout"))
    # optax's `Params` annotation lists arrays and containers; any pytree works.
    opt_state = optimiser.init(model)  # pyright: ignore[reportArgumentType]
    losses = []
    for i, key in enumerate(jax.random.split(jax.random.key(1), 20 if fast else 300)):
        data_key, dropout_key = jax.random.split(key)
        model, opt_state, loss = step(
            model, opt_state, batch(data_key, 32, context, vocab), dropout_key
        )
        losses.append(float(loss))
        if i % 10 == 0:
            print(f"step {i:3d}  loss {losses[-1]:.4f}")
    # jax's count of the step's compilations: a private method, so unannotated.
    traces = step._cache_size()  # pyright: ignore[reportAttributeAccessIssue]
    print(f"traces of the step function: {traces}")
    inference = asx.inference_mode(model)
    seqs = batch(jax.random.key(2), 4, context, vocab)
    predicted = jnp.argmax(
        jax.vmap(inference)(seqs[:, :-1], jax.random.split(jax.random.key(3), 4)), -1
    )
    accuracy = float(jnp.mean(predicted == seqs[:, 1:]))
    print(
        f"first loss {losses[0]:.3f}, last loss {losses[-1]:.3f}, next-token accuracy {accuracy:.2f}"
    )
    return {"first_loss": losses[0], "last_loss": losses[-1], "accuracy": accuracy}


def parse_args() -> argparse.Namespace:
    """`--help` prints the docstring above and exits before anything runs."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--fast",
        action="store_true",
        help="a short run (1 block, 20 steps), as the tests use",
    )
    return parser.parse_args()


if __name__ == "__main__":
    main(fast=parse_args().fast)
