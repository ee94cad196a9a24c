"""Writes `design_exploration.ipynb` from the cells below and executes it in place, so
the committed notebook carries its outputs. Run after changing a cell:

    python examples/make_notebook.py
"""

from pathlib import Path

import nbclient
import nbformat

HERE = Path(__file__).parent

CELLS = [
    (
        "md",
        """# Design exploration: why AutoModule decides static data the way it does

This notebook walks through the questions behind `autostatic.AutoModule` with live code:
what `eqx.Module` does with non-array fields, the list-append problem, why the partition
is frozen at the end of `__init__`, natural key paths, and the measured costs (read from
the committed benchmark results).""",
    ),
    (
        "code",
        """import jax, jax.numpy as jnp, equinox as eqx
import autostatic as asx

class EqxLayer(eqx.Module):          # what users usually write
    weight: jax.Array
    activation: object

layer = EqxLayer(jnp.ones((2, 2)), jax.nn.relu)
try:
    jax.jit(lambda m, x: m.activation(m.weight @ x))(layer, jnp.ones(2))
except TypeError as err:
    print("plain jax.jit:", str(err).splitlines()[0][:100])""",
    ),
    (
        "md",
        """With `eqx.Module`, the activation is a pytree leaf, so plain `jax.jit` rejects it: you
either mark it `eqx.field(static=True)` or call through `eqx.filter_jit`, which
partitions the arguments on every call (and blocks until the result is ready).""",
    ),
    (
        "code",
        """class AutoLayer(asx.AutoModule):     # the same, decided automatically
    weight: jax.Array
    activation: object

auto = AutoLayer(jnp.ones((2, 2)), jax.nn.relu)
print(jax.jit(lambda m, x: m.activation(m.weight @ x))(auto, jnp.ones(2)))
print(asx.explain(auto))""",
    ),
    (
        "md",
        """## The list-append problem, and when to decide

Deciding per attribute *at assignment* (as flax.nnx does) sees `self.layers = []` while
the list is still empty. Deciding *at flatten time* (inox's abandoned `Auto`) breaks any
`tree_map` whose leaves are not arrays. AutoModule decides once, when the most-derived
`__init__` has finished:""",
    ),
    (
        "code",
        """class Stack(asx.AutoModule):
    layers: list
    names: list

    def __init__(self, n, key):
        self.layers, self.names = [], []
        for i, k in enumerate(jax.random.split(key, n)):
            self.layers.append(eqx.nn.Linear(2, 2, key=k))
            self.names.append(f"layer{i}")

stack = Stack(3, jax.random.key(0))
print([jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(stack)[0]])
try:
    stack.layers.append(stack.layers[0])
except TypeError as err:
    print(str(err)[:90], "...")""",
    ),
    (
        "code",
        """# Frozen, not re-decided: a tree of in_axes ints keeps the structure, so vmap accepts it.
in_axes = jax.tree_util.tree_map(lambda _: 0, stack)
batched = jax.tree_util.tree_map(lambda x: jnp.stack([x, x]), stack)
out = jax.vmap(lambda s, x: s.layers[0](x), in_axes=(in_axes, None))(batched, jnp.ones(2))
print(out.shape, "| leaves of the in_axes tree:", len(jax.tree_util.tree_leaves(in_axes)))""",
    ),
    (
        "md",
        """## Natural key paths, per-leaf split

A mixed container keeps its arrays as leaves at their natural paths; the rest is static,
and attribute access still returns the real values.""",
    ),
    (
        "code",
        """class Mixed(asx.AutoModule):
    parts: list

mixed = Mixed([eqx.nn.Linear(2, 2, key=jax.random.key(1)), jax.nn.relu, 3, {"w": jnp.ones(2), "tag": "x"}])
print(asx.explain(mixed))
print(mixed.parts[1] is jax.nn.relu)""",
    ),
    (
        "md",
        """## What it costs: the benchmark comparison

Read from `benchmarks/results/cpu/results.json`, committed by `python -m benchmarks --quick --write-results`.""",
    ),
    ("code", "PLOT_CELL"),
]


def build() -> nbformat.NotebookNode:
    notebook = nbformat.v4.new_notebook()
    plot = (HERE / "notebook_plot_cell.py").read_text()
    for kind, source in CELLS:
        if kind == "md":
            notebook.cells.append(nbformat.v4.new_markdown_cell(source))
        else:
            notebook.cells.append(
                nbformat.v4.new_code_cell(plot if source == "PLOT_CELL" else source)
            )
    notebook.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    return notebook


def execute(
    notebook: nbformat.NotebookNode, timeout: int = 600
) -> nbformat.NotebookNode:
    client = nbclient.NotebookClient(
        notebook,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(HERE)}},
    )
    client.execute()
    return notebook


if __name__ == "__main__":
    path = HERE / "design_exploration.ipynb"
    nbformat.write(execute(build()), path)
    print("wrote", path)
