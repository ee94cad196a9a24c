"""Equinox's BERT example, ported by the base swap alone, reading a checkpoint its
stock classes wrote (static markers and all).

    python -m ecosystem.bert --git-dir PATH

The notebook downloads a tokenizer, a dataset and `bert_checkpoint.eqx` (kept in Git
LFS), none of which this machine reaches; its classes and config need none of them.
They are defined twice from the notebook's own cells (at the installed Equinox's
tag): stock, and rebased onto AutoModule with the static markers dropped. The stock
classifier writes a checkpoint with `eqx.tree_serialise_leaves`; Equinox's
`eqx.tree_deserialise_leaves` reads it into the ported one; both give their logits
on the same random tokens (stock under `eqx.filter_jit`, ported under `jax.jit`) and
one training step's loss and gradients. `from __future__ import annotations` heads
the cells: at v0.13.8 they annotate `key: jax.random.PRNGKey | None`, which Python
cannot evaluate with jax 0.10 (`PRNGKey` is a function), stock or not.
"""

import argparse
import importlib.metadata
import json
import subprocess
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import autostatic

_HEADER = """\
from __future__ import annotations
import functools
from collections.abc import Mapping
import einops
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, Float, Int
"""


def _cells(git_dir: str) -> str:
    """The notebook's class definitions and config, as one source."""
    tag = f"v{importlib.metadata.version('equinox')}"
    shown = subprocess.run(
        ["git", f"--git-dir={git_dir}", "show", f"{tag}:docs/examples/bert.ipynb"],
        capture_output=True,
        check=True,
    )
    cells = json.loads(shown.stdout)["cells"]
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    kept = [c for c in code if c.lstrip().startswith(("class ", "# Tiny-BERT"))]
    return _HEADER + "\n\n".join(kept)


def _module(name: str, source: str) -> Any:
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(source, f"<bert.ipynb as {name}>", "exec"), module.__dict__)
    return module


def _loss(model: Any, tokens: Any, labels: jax.Array, key: jax.Array) -> jax.Array:
    keys = jax.random.split(key, tokens["token_ids"].shape[0])
    logits = jax.vmap(model, in_axes=(0, None, 0))(tokens, True, keys)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def _logits(model: Any, tokens: Any) -> jax.Array:
    return jax.vmap(model, in_axes=(0, None, None))(tokens, False, None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ecosystem.bert")
    parser.add_argument("--git-dir", required=True, help="Equinox's git directory")
    args = parser.parse_args(argv)
    source = _cells(args.git_dir)
    stock = _module("bert_stock", source)
    rebase = autostatic.rebase(["bert_port"], drop_static_markers=True)
    port = _module("bert_port", source)
    print(rebase.summary())
    key = jax.random.key(0)
    original = stock.BertClassifier(stock.bert_config, num_classes=2, key=key)
    like = port.BertClassifier(port.bert_config, num_classes=2, key=jax.random.key(1))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "bert_checkpoint.eqx"
        eqx.tree_serialise_leaves(path, original)
        ported = eqx.tree_deserialise_leaves(path, like)
    rng = np.random.default_rng(0)
    tokens = {
        "token_ids": jnp.asarray(rng.integers(0, 30522, (4, 128))),
        "segment_ids": jnp.zeros((4, 128), jnp.int32),
    }
    labels = jnp.array([0, 1, 1, 0])
    stock_arrays = [x for x in jax.tree.leaves(original) if eqx.is_array(x)]
    read = jax.tree.leaves(ported)
    same = len(stock_arrays) == len(read) and all(
        map(np.array_equal, stock_arrays, read)
    )
    want = eqx.filter_jit(_logits)(original, tokens)
    got = jax.jit(_logits)(ported, tokens)
    loss0, grads0 = eqx.filter_jit(eqx.filter_value_and_grad(_loss))(
        original, tokens, labels, key
    )
    loss1, grads1 = jax.jit(jax.value_and_grad(_loss))(ported, tokens, labels, key)
    g0 = [x for x in jax.tree.leaves(grads0) if eqx.is_array(x)]
    g1 = jax.tree.leaves(grads1)
    grads_same = len(g0) == len(g1) and all(map(np.array_equal, g0, g1))
    print(f"checkpoint read: {len(read)} arrays, equal to the stock model's: {same}")
    print(f"logits: largest difference {float(jnp.abs(want - got).max())}")
    print(
        f"training step: loss {float(loss0)} stock, {float(loss1)} ported; "
        f"gradients equal: {grads_same}"
    )
    return 0 if same and bool(jnp.all(want == got)) and grads_same else 1


if __name__ == "__main__":
    raise SystemExit(main())
