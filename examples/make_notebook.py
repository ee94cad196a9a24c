"""Writes `design_exploration.ipynb` from the cells below and executes it in place, so
the committed notebook carries its outputs. Run after changing a cell, or after
`python -m benchmarks --quick --write-results` rewrote the committed results:

    python examples/make_notebook.py

Its benchmark cells read `benchmarks/results/cpu/results.json`. For development, point
`AUTOSTATIC_RESULTS` at another results file and write elsewhere:

    AUTOSTATIC_RESULTS=/tmp/run/results.json python examples/make_notebook.py --out /tmp/nb.ipynb
"""

import argparse
import os
from pathlib import Path

import nbclient
import nbformat

HERE = Path(__file__).parent
RESULTS_ENV = "AUTOSTATIC_RESULTS"  # as in notebook_plot_cell.py

CELLS = [
    (
        "md",
        """# Design exploration: why AutoModule decides static data the way it does

This notebook walks through the questions behind `autostatic.AutoModule` with live code:
what `eqx.Module` does with non-array fields, the fair twin (an `eqx.Module` with
`eqx.field(static=True)` on its non-array fields, under plain `jax.jit`), the
list-append problem, why the partition is frozen at the end of `__init__`, natural key
paths, where a Python float costs retraces, and then the measured costs on both sides:
against the fair twin and against `eqx.filter_jit`, on the `eqx.nn` models people
write, and where AutoModule is slower. Every timing comes from one committed benchmark
run (its provenance is printed below); the live cells only count traces and show
structure.""",
    ),
    (
        "code",
        """import re
import jax, jax.numpy as jnp, equinox as eqx
import autostatic as asx

def why(err):  # JAX's message, one line, without the function's address
    line = str(err).splitlines()[0]
    found = re.search(r"of type <class '(?:\\w+\\.)*(\\w+)'>.* at path (\\S+)\\.$", line)
    return f"{type(err).__name__}: non-array leaf ({found[1]}) at {found[2]}" if found else line[:100]

class EqxLayer(eqx.Module):          # what users usually write
    weight: jax.Array
    activation: object

apply = lambda m, x: m.activation(m.weight @ x)
layer = EqxLayer(jnp.ones((2, 2)), jax.nn.relu)
try:
    jax.jit(apply)(layer, jnp.ones(2))
except TypeError as err:
    print("plain jax.jit:", why(err))""",
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
print(jax.jit(apply)(auto, jnp.ones(2)))
print(asx.explain(auto))""",
    ),
    (
        "md",
        """## The fair twin

The like-for-like baseline for AutoModule is not `eqx.filter_jit` but the *fair twin*:
the same `eqx.Module` with `eqx.field(static=True)` on every field of ours that holds no
array, called with plain `jax.jit` and the same step code. It has the same leaves as the
AutoModule. Its limit: Equinox's own layers stay as Equinox declares them, so a model
holding an `eqx.nn.MLP` (whose activation is a non-static field) cannot be passed to
plain `jax.jit`, and the benchmarks mark those cells "fails". For dispatch they then
time Equinox's own route to plain `jax.jit` instead: `eqx.partition` once, `jax.jit`
over the arrays with the static half closed over (marked † in the tables).""",
    ),
    (
        "code",
        """class TwinLayer(eqx.Module):         # the fair twin: non-array fields marked static
    weight: jax.Array
    activation: object = eqx.field(static=True)

twin = TwinLayer(jnp.ones((2, 2)), jax.nn.relu)
print("fair twin under jax.jit:        ", jax.jit(apply)(twin, jnp.ones(2)))
print("eqx.Module under eqx.filter_jit:", eqx.filter_jit(apply)(layer, jnp.ones(2)))
shapes = lambda tree: [x.shape for x in jax.tree_util.tree_leaves(tree)]
print("fair twin has the AutoModule's leaves:", shapes(twin) == shapes(auto))

class TwinBlock(eqx.Module):         # a fair twin holding Equinox's own MLP
    mlp: eqx.nn.MLP

class AutoBlock(asx.AutoModule):
    mlp: eqx.nn.MLP

mlp = eqx.nn.MLP(2, 2, 4, 1, key=jax.random.key(0))
try:
    jax.jit(lambda m, x: m.mlp(x))(TwinBlock(mlp), jnp.ones(2))
except TypeError as err:
    print("fair twin holding an eqx.nn.MLP, jax.jit:", why(err))
out = jax.jit(lambda m, x: m.mlp(x))(AutoBlock(mlp), jnp.ones(2))
print("AutoModule holding an eqx.nn.MLP, jax.jit: output shape", out.shape)""",
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
        """## Where the design costs: a changing Python float retraces

A Python float attribute is static in an AutoModule (as in the fair twin), so every new
value compiles again. An unmarked `eqx.Module` under plain `jax.jit` passes the float as
a traced scalar instead; `eqx.filter_jit` treats it as static too. The fix is to store a
value that changes as an array. Trace counts, for the values 1.0, 2.0, 1.0, 2.0, 3.0:""",
    ),
    (
        "code",
        """def traces(jit, make, values=(1.0, 2.0, 1.0, 2.0, 3.0)):
    seen = []
    f = jit(lambda m, x: (seen.append(1), m.scale * x)[1])
    for v in values:
        f(make(v), jnp.ones(2))
    return len(seen)

class AutoScaled(asx.AutoModule):
    scale: float

class TwinScaled(eqx.Module):
    scale: float = eqx.field(static=True)

class EqxScaled(eqx.Module):
    scale: float

class AutoArrayScaled(asx.AutoModule):
    scale: jax.Array = eqx.field(converter=jnp.asarray)

for name, jit, cls in [
    ("AutoModule, jax.jit", jax.jit, AutoScaled),
    ("fair twin, jax.jit", jax.jit, TwinScaled),
    ("eqx.Module, eqx.filter_jit", eqx.filter_jit, EqxScaled),
    ("eqx.Module (float is a leaf), jax.jit", jax.jit, EqxScaled),
    ("AutoModule, scale stored as an array", jax.jit, AutoArrayScaled),
]:
    print(f"{name:40} traces: {traces(jit, cls)}")""",
    ),
    (
        "md",
        """# What it costs: the benchmark results

All numbers below are read from one results file: by default the committed
`benchmarks/results/cpu/results.json`, written only by
`python -m benchmarks --quick --write-results` (the environment variable
`AUTOSTATIC_RESULTS` points elsewhere for development only). The next cell holds the
helpers (`examples/notebook_plot_cell.py`), then loads the file and prints which run it
is. Ratios are AutoModule's time divided by the baseline's, paired per benchmark round,
with the interquartile range: below 1 AutoModule is faster.""",
    ),
    ("code", "PLOT_CELL"),
    (
        "code",
        """results, source = load_results()
print(source)
print(provenance(results))""",
    ),
    (
        "md",
        """## Both baselines side by side

AutoModule against the fair twin and against `eqx.filter_jit`: headline operations per
model (on the `eqx.nn` models when the run has them, else on the MLP floor), and the
training step (forward + grad + optax adam). On the left, the MLP floor (dict-of-layers
MLPs) by depth, solid against the fair twin, dashed against `eqx.filter_jit`.""",
    ),
    (
        "code",
        """display(Markdown(fair_twin_table(results)))
fig = plot_fair_twin(results)
plt.show()""",
    ),
    (
        "md",
        """## The eqx.nn models

Four models built from `eqx.nn` layers (`benchmarks/real_models.py`): 256
`eqx.nn.Linear` in a list beside an activation, a 12-block transformer
(`MultiheadAttention`, `LayerNorm`, `MLP`, `Dropout`), the mixed-container stack (lists
mixing layers, functions, ints, strings and floats) and AutoModules nested 4 deep. One
bar per model and operation; the upper panel against the fair twin, the lower against
`eqx.filter_jit`; error bars span the interquartile range; "fails / n/a" marks a cell the
baseline cannot run.""",
    ),
    (
        "code",
        """fig = plot_real_models(results)
plt.show()""",
    ),
    (
        "md",
        """## Where AutoModule loses

Every comparison above and on the MLP floor whose median ratio is above 1, slowest
first, with whether the whole interquartile range lies above 1 (a clear loss rather
than noise), then the trace counts of the retracing benchmark.""",
    ),
    (
        "code",
        """display(Markdown(losses_text(results)))
fig = plot_losses(results)
plt.show()
display(Markdown(retracing_text(results)))""",
    ),
    (
        "md",
        """## The MLP floor in absolute time

Median µs of flatten, unflatten and a jitted call's dispatch against the depth of a
dict-of-layers MLP, for every implementation (`dict` is the floor: the same arrays in
plain dicts).""",
    ),
    (
        "code",
        """fig = plot_mlp_overhead(results)
plt.show()""",
    ),
    (
        "md",
        """## Targets of this run

MET / MISSED against fixed thresholds, as `python -m benchmarks` judged them.""",
    ),
    ("code", "display(Markdown(targets_text(results)))"),
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


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(
        description="Writes and executes examples/design_exploration.ipynb."
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="write the executed notebook here instead of the committed "
        "examples/design_exploration.ipynb (required with $AUTOSTATIC_RESULTS)",
    )
    args = parser.parse_args(argv)
    committed = HERE / "design_exploration.ipynb"
    path = args.out or committed
    if os.environ.get(RESULTS_ENV) and path.resolve() == committed.resolve():
        parser.error(
            f"${RESULTS_ENV} is set: the committed notebook is built from the committed "
            "results only; pass --out PATH for a development build"
        )
    override = os.environ.get(RESULTS_ENV)
    if override:  # the kernel runs in examples/: relative to where we were called
        os.environ[RESULTS_ENV] = str(Path(override).resolve())
    nbformat.write(execute(build()), path)
    print("wrote", path)
    return path


if __name__ == "__main__":
    main()
