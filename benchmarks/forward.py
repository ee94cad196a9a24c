"""The forward passes of the synthetic models (`models`), and the dispatch benchmark's
cheap function on each: written once, with attribute access, for every implementation
(the `dict` floor sees its arrays and config merged into an attribute view)."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .models import unbox


def mlp_apply(m: Any, x: jax.Array) -> jax.Array:
    """The MLP's forward pass."""
    for layer in m.layers:
        x = layer.activation(x @ layer.weight + layer.bias)
    return m.scale * x


def _layer_norm(ln: Any, x: jax.Array) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + ln.eps) * ln.gamma + ln.beta


def _attention(a: Any, x: jax.Array) -> jax.Array:
    b, s, d = x.shape
    h = a.num_heads

    def heads(w: jax.Array) -> jax.Array:
        return (x @ w).reshape(b, s, h, d // h)

    q, k, v = heads(a.wq), heads(a.wk), heads(a.wv)
    scores = jnp.einsum("bshd,bthd->bhst", q, k) / np.sqrt(d // h)
    out = jnp.einsum("bhst,bthd->bshd", jax.nn.softmax(scores, axis=-1), v)
    return out.reshape(b, s, d) @ a.wo


def _dropout(x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
    if key is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0)


def transformer_apply(m: Any, x: jax.Array, key: jax.Array | None = None) -> jax.Array:
    """The transformer's forward pass (with dropout where a key is given)."""
    keys = (
        [None] * len(m.blocks)
        if key is None
        else list(jax.random.split(key, len(m.blocks)))
    )
    for block, k in zip(m.blocks, keys):
        k1, k2 = (None, None) if k is None else tuple(jax.random.split(k))
        ff = block.ff
        x = x + _dropout(
            _attention(block.attn, _layer_norm(block.ln1, x)), block.dropout, k1
        )
        hidden = ff.activation(_layer_norm(block.ln2, x) @ ff.w1 + ff.b1)
        x = x + _dropout(hidden @ ff.w2 + ff.b2, block.dropout, k2)
    return _layer_norm(m.ln_f, x)


def mixed_apply(m: Any, x: jax.Array) -> jax.Array:
    """The `mixed` model's forward pass."""
    linear, act, k, d = m.parts
    y = unbox(act)(x @ linear.weight + linear.bias) * unbox(k)
    return y + d["w"] if unbox(d["tag"]) == "x" else y


# The cheap per-call function of the dispatch benchmark: reads one array.
def mlp_probe(m: Any) -> jax.Array:
    """The dispatch benchmark's cheap function on the MLP: one array + 1."""
    return m.layers[0].bias + 1


def transformer_probe(m: Any) -> jax.Array:
    """The dispatch benchmark's cheap function on the transformer."""
    return m.blocks[0].ln1.gamma + 1


def mixed_probe(m: Any) -> jax.Array:
    """The dispatch benchmark's cheap function on the `mixed` model."""
    return m.parts[0].bias + 1
