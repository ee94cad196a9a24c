"""Writes `design_exploration.ipynb` from the cells below and executes it in place, so
the committed notebook carries its outputs. Run after changing a cell or
`notebook_helpers.py`, or after `python -m benchmarks --quick --write-results` rewrote
the committed results:

    python examples/make_notebook.py

The notebook runs with `examples/` as its working folder (here and in Jupyter), so its
first cell imports `notebook_helpers` from beside it. Its benchmark cells read
`benchmarks/results/cpu/results.json`. For development, point `AUTOSTATIC_RESULTS` at
another results file and write elsewhere:

    AUTOSTATIC_RESULTS=/tmp/run/results.json python examples/make_notebook.py --out /tmp/nb.ipynb
"""

import argparse
import os
from pathlib import Path

import nbclient
import nbformat

HERE = Path(__file__).parent
RESULTS_ENV = "AUTOSTATIC_RESULTS"  # as in notebook_helpers.py (not imported: heavy)

CELLS = [
    (
        "md",
        """# Design exploration: how AutoModule decides what is static

`autostatic.AutoModule` is an `eqx.Module` that decides by itself what is static: per
leaf, arrays are dynamic and everything else is static, decided from what the
attributes hold at every flatten. This notebook shows, with live code:

1. the problem: what `eqx.Module` does with non-array fields, and the *fair twin*;
2. the chosen design: decide at every flatten, per leaf, with trees mapped from a
   model keeping its structure;
3. the rejected alternatives (decide at assignment, at every flatten for every tree,
   by type hints, per attribute), each re-created in a few lines and shown failing;
4. a cost of the design: a Python float that changes retraces;
5. the measured costs against both baselines, from the committed benchmark run;
6. a conclusion written from those numbers.

The live cells show structure, trace counts and real errors; every timing comes from
the committed results file. The tables, plots and the `attempt` helper (run a call,
print `ok` or the exception's type and first line) live in `notebook_helpers.py`,
beside this notebook.""",
    ),
    (
        "code",
        """import dataclasses
import typing

import equinox as eqx
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
from IPython.display import Markdown, display

import autostatic as asx
import notebook_helpers as nh  # examples/notebook_helpers.py: tables, plots, attempt""",
    ),
    (
        "md",
        """## 1. The problem: non-array fields

With `eqx.Module`, a function-valued field is a pytree leaf, so plain `jax.jit` rejects
it: you either mark it `eqx.field(static=True)` or call through `eqx.filter_jit`, which
partitions the arguments on every call.""",
    ),
    (
        "code",
        """class EqxLayer(eqx.Module):  # what users usually write
    weight: jax.Array
    activation: object


apply = lambda m, x: m.activation(m.weight @ x)
layer = EqxLayer(jnp.ones((2, 2)), jax.nn.relu)
nh.attempt("eqx.Module, plain jax.jit", lambda: jax.jit(apply)(layer, jnp.ones(2)))""",
    ),
    (
        "md",
        """The same class as an `AutoModule`: the activation is static, decided from its value.""",
    ),
    (
        "code",
        """class AutoLayer(asx.AutoModule):  # the same, decided automatically
    weight: jax.Array
    activation: object


auto = AutoLayer(jnp.ones((2, 2)), jax.nn.relu)
print(jax.jit(apply)(auto, jnp.ones(2)))
print(asx.explain(auto))""",
    ),
    (
        "md",
        """### The fair twin

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
        """class TwinLayer(eqx.Module):  # the fair twin: non-array fields marked static
    weight: jax.Array
    activation: object = eqx.field(static=True)


twin = TwinLayer(jnp.ones((2, 2)), jax.nn.relu)
print("fair twin under jax.jit:        ", jax.jit(apply)(twin, jnp.ones(2)))
print("eqx.Module under eqx.filter_jit:", eqx.filter_jit(apply)(layer, jnp.ones(2)))
shapes = lambda tree: [x.shape for x in jax.tree.leaves(tree)]
print("fair twin has the AutoModule's leaves:", shapes(twin) == shapes(auto))


class TwinBlock(eqx.Module):  # a fair twin holding Equinox's own MLP
    mlp: eqx.nn.MLP


class AutoBlock(asx.AutoModule):
    mlp: eqx.nn.MLP


mlp = eqx.nn.MLP(2, 2, 4, 1, key=jax.random.key(0))
call_mlp = jax.jit(lambda m, x: m.mlp(x))
for name, block in [("fair twin", TwinBlock), ("AutoModule", AutoBlock)]:
    label = f"{name} holding an eqx.nn.MLP, jax.jit, output shape"
    nh.attempt(label, lambda: call_mlp(block(mlp), jnp.ones(2)).shape)""",
    ),
    (
        "md",
        """## 2. The chosen design: decide at every flatten, per leaf

AutoModule stores nothing about the split: each flatten sorts the leaves the fields hold
at that moment, by a plan found once per class and tuple of field types. So containers
can be built freely inside `__init__` and changed in place afterwards, and the next
flatten sees them as an `eqx.Module`'s would. Assigning an attribute after `__init__`
raises, as with `eqx.Module`.""",
    ),
    (
        "code",
        """class Stack(asx.AutoModule):
    layers: list
    names: list

    def __init__(self, n, key):
        self.layers, self.names = [], []  # filled below; a flatten reads them as they are
        for i, k in enumerate(jax.random.split(key, n)):
            self.layers.append(eqx.nn.Linear(2, 2, key=k))
            self.names.append(f"layer{i}")


stack = Stack(3, jax.random.key(0))
print([jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(stack)[0]])
nh.attempt("assignment after __init__", lambda: setattr(stack, "layers", []))
stack.layers.append(eqx.nn.Linear(2, 2, key=jax.random.key(3)))
print("leaves after an append in place:", len(jax.tree.leaves(stack)))""",
    ),
    (
        "code",
        """# A tree unflattened from leaves that are not arrays (a template) flattens as it
# was unflattened: a tree of in_axes ints has the model's structure, so vmap accepts it.
in_axes = jax.tree.map(lambda _: 0, stack)
batched = jax.tree.map(lambda x: jnp.stack([x, x]), stack)
out = jax.vmap(lambda s, x: s.layers[0](x), in_axes=(in_axes, None))(batched, jnp.ones(2))
print(out.shape, "| leaves of the in_axes tree:", len(jax.tree.leaves(in_axes)))""",
    ),
    (
        "md",
        """Per leaf: a mixed container keeps its arrays as leaves at their natural paths; the
rest is static, and attribute access still returns the real values.""",
    ),
    (
        "code",
        """class Mixed(asx.AutoModule):
    parts: list


linear = eqx.nn.Linear(2, 2, key=jax.random.key(1))
mixed = Mixed([linear, "relu", 3, {"w": jnp.ones(2), "tag": "x"}])
print(asx.explain(mixed))
print(mixed.parts[0] is linear, type(mixed.parts) is list)""",
    ),
    (
        "md",
        """## 3. The rejected alternatives, live

Each alternative below is re-created as a tiny pytree class that applies its rule and
nothing else, beside an AutoModule with the same fields; the errors are the ones JAX
raises (type and first line, through `nh.attempt`). The four toys share the plumbing
in the next cell: the attributes the rule calls dynamic are children, the others go
into the aux data as `(name, value)` pairs, and unflatten keeps that split.""",
    ),
    (
        "code",
        """class Toy:  # subclasses set the rule: which attribute names are dynamic
    def dynamic_names(self):
        return self.dynamic

    def tree_flatten(self):
        dynamic = self.dynamic_names()
        names = sorted(k for k in vars(self) if k != "dynamic")
        children = tuple(n for n in names if n in dynamic)
        static = tuple((n, getattr(self, n)) for n in names if n not in dynamic)
        return [getattr(self, n) for n in children], (children, static)

    @classmethod
    def tree_unflatten(cls, aux, children):
        obj = object.__new__(cls)
        obj.__dict__.update(zip(aux[0], children), dynamic=set(aux[0]))
        obj.__dict__.update(aux[1])
        return obj""",
    ),
    (
        "md",
        """### Decide at assignment (flax.nnx's rule)

Each `setattr` decides from the value assigned. `self.layers = []` is decided while the
list is empty, so static, and the array appended afterwards lives inside a static
attribute (flax.nnx detects this case, raises "Found unexpected data ... in static
attribute" and asks for `nnx.List`; the toy applies the rule alone). The toy has no
leaves: `jax.grad` hands back the weights themselves where their gradient belongs, and
`jax.jit`, which bakes them into the compiled function, cannot compare them with a
second model's. AutoModule runs the same `__init__` and decides when it has finished.""",
    ),
    (
        "code",
        """@jax.tree_util.register_pytree_node_class
class AtAssignment(Toy):  # rule: dynamic iff the value holds an array when assigned
    def __init__(self, weight):
        self.dynamic = set()
        self.layers = []  # decided here: an empty list holds no array, so static
        self.layers.append(weight)  # a mutation, not an assignment: never re-decided

    def __setattr__(self, name, value):
        if name != "dynamic" and any(map(eqx.is_array, jax.tree.leaves(value))):
            self.dynamic.add(name)
        object.__setattr__(self, name, value)


class AutoStack(asx.AutoModule):  # the same __init__
    layers: list

    def __init__(self, weight):
        self.layers = []
        self.layers.append(weight)


loss = lambda m: jnp.sum(m.layers[0] ** 2)  # its gradient: 2 * weight = [6. 8.]
for name, cls in [("decide at assignment", AtAssignment), ("AutoModule", AutoStack)]:
    model = cls(jnp.array([3.0, 4.0]))
    grad = jax.grad(loss)(model).layers[0]
    print(f"{name}: {len(jax.tree.leaves(model))} leaves, gradient of layers[0] {grad}")
    step = jax.jit(loss)
    step(model)
    nh.attempt(f"{name}: the same jit, a second model", lambda: step(cls(jnp.array([5.0, 6.0]))))""",
    ),
    (
        "md",
        """### Decide at every flatten, for every tree (inox's `Auto`, abandoned in inox 0.4)

Deciding from the current values on every flatten of every tree makes the structure
depend on the leaves: any `tree_map` whose leaves are not arrays (a tree of `0`s for
`vmap`'s `in_axes`, the `ShapeDtypeStruct`s of `jax.eval_shape`, the boolean mask
`eqx.partition` builds) flattens to another treedef, and every API that matches two
trees fails. AutoModule decides at every flatten only for a real model; an instance
unflattened from other leaves (a template) keeps the structure it was unflattened
with. What reading every field on every flatten costs is in the flatten and dispatch
rows of section 5.""",
    ),
    (
        "code",
        """@jax.tree_util.register_pytree_node_class
class AtFlatten(Toy):  # rule: every flatten decides again; dynamic iff an array now
    def __init__(self, w, act):
        self.w, self.act = w, act

    def dynamic_names(self):
        return {n for n, v in vars(self).items() if eqx.is_array(v)}


class AutoAct(asx.AutoModule):
    w: jax.Array
    act: str


for name, model in [
    ("decide at every flatten", AtFlatten(jnp.ones(3), "relu")),
    ("AutoModule", AutoAct(jnp.ones(3), "relu")),
]:
    zeros = jax.tree.map(lambda _: 0, model)  # a tree of ints, as vmap's in_axes
    shapes = jax.eval_shape(lambda m: m, model)  # a tree of ShapeDtypeStructs
    same = [jax.tree.structure(t) == jax.tree.structure(model) for t in (zeros, shapes)]
    print(f"{name}: the model's treedef kept by a tree of 0s {same[0]}, by eval_shape {same[1]}")
    batch = jax.tree.map(lambda x: jnp.stack([x, x]), model)
    vmapped = jax.vmap(lambda m: m.w.sum(), in_axes=(zeros,))
    nh.attempt("  jax.vmap, in_axes the tree of 0s", lambda: vmapped(batch))
    nh.attempt("  jax.tree.map over model and shapes", lambda: jax.tree.map(lambda a, s: a.shape == s.shape, model, shapes).w)
    nh.attempt("  eqx.partition (as eqx.filter_jit does)", lambda: len(jax.tree.leaves(eqx.partition(model, eqx.is_array))))""",
    ),
    (
        "md",
        """### Decide by type hints

`w: jax.Array` dynamic, every other annotation static, fixed per class. Annotations say
too little: `layers: list` says nothing about what the list holds, so its arrays are
static (the same wrong gradient and jit failure as above), and `Callable` may be a
learnt `eqx.nn.PReLU` (Equinox's reason never to mark fields automatically). And
`scale: float | jax.Array` is ambiguous for any rule: as a leaf (the toy here, and
AutoModule too, which follows Equinox for fields annotated with an array type) a Python
`if` on a configuration value fails under `jax.jit`; as static, a learnt scalar given
there would be baked like the list. AutoModule decides from the value, so an array is a
leaf whatever the annotation; a number meant as configuration is annotated `float`.""",
    ),
    (
        "code",
        """def by_hints(cls):  # rule: dynamic iff the annotation mentions jax.Array
    hints = typing.get_type_hints(cls)
    cls.dynamic = {n for n, h in hints.items() if jax.Array in (h, *typing.get_args(h))}
    return jax.tree_util.register_pytree_node_class(cls)


@by_hints
@dataclasses.dataclass
class Hinted(Toy):
    layers: list  # holds arrays, and `list` says nothing about them
    scale: float | jax.Array  # a configuration number, or a learnt scalar?


class AutoHinted(asx.AutoModule):  # the same annotations
    layers: list
    scale: float | jax.Array


loss = lambda m: m.scale * jnp.sum(m.layers[0] ** 2)  # gradient of layers[0]: [6. 8.]
branch = jax.jit(lambda m: loss(m) if m.scale > 0.5 else 0.0)  # scale as configuration
for cls in (Hinted, AutoHinted):
    model = cls([jnp.array([3.0, 4.0])], 1.0)
    grad = jax.grad(loss)(model).layers[0]
    print(f"{cls.__name__}: leaves {jax.tree.leaves(model)}, gradient of layers[0] {grad}")
    step = jax.jit(loss)
    step(model)
    nh.attempt("  the same jit, a second model", lambda: step(cls([jnp.array([5.0, 6.0])], 1.0)))
    nh.attempt("  `if m.scale > 0.5` under jax.jit", lambda: branch(model))""",
    ),
    (
        "md",
        """### Per attribute

Deciding per attribute (each value wholly static or wholly dynamic) cannot split a mixed
container. `[weights, "relu", 3]` (an array, an activation's name and a size in one
list) must go one way: all dynamic, and `jax.jit` rejects the string leaf; all static,
and the weights are baked into the aux data (the gradient and second-model failures
again). AutoModule splits per leaf: the array is a child at `.parts[0]`, the rest is
static, and the attribute is still the plain list.""",
    ),
    (
        "code",
        """@jax.tree_util.register_pytree_node_class
class PerAttribute(Toy):  # rule: the whole attribute is dynamic, or the whole is static
    def __init__(self, parts, dynamic):
        self.parts, self.dynamic = parts, {"parts"} if dynamic else set()


class AutoParts(asx.AutoModule):
    parts: list


# The gradient of parts[0] is 3 * x = [3. 3.] wherever relu is active.
apply = lambda m, x: jnp.sum(getattr(jax.nn, m.parts[1])(m.parts[0] * x)) * m.parts[2]
w, x = jnp.array([3.0, 4.0]), jnp.ones(2)
dynamic = PerAttribute([w, "relu", 3], dynamic=True)
nh.attempt("per attribute, all dynamic: jax.jit", lambda: jax.jit(apply)(dynamic, x))
for name, make in [
    ("per attribute, all static", lambda w: PerAttribute([w, "relu", 3], dynamic=False)),
    ("AutoModule", lambda w: AutoParts([w, "relu", 3])),
]:
    print(f"{name}: gradient of parts[0] {jax.grad(apply)(make(w), x).parts[0]}")
    step = jax.jit(apply)
    step(make(w), x)
    nh.attempt(f"{name}: the same jit, a second model", lambda: step(make(2 * w), x))
print(asx.explain(AutoParts([w, "relu", 3])))""",
    ),
    (
        "md",
        """## 4. A cost of the design: a changing Python float retraces

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
        """## 5. What it costs: the benchmark results

All numbers below are read from one results file: by default the committed
`benchmarks/results/cpu/results.json`, written only by
`python -m benchmarks --quick --write-results` (the environment variable
`AUTOSTATIC_RESULTS` points elsewhere for development only). Ratios are AutoModule's
time divided by the baseline's, paired per benchmark round, with the interquartile
range: lower is better, below 1 AutoModule is faster. Colours follow the benchmark
report: AutoModule blue, eqx-static (the fair twin's class) orange, eqx-filter
(`eqx.Module` without markers, under `eqx.filter_jit`) green, dataclass purple, dict
black; a ratio against a baseline takes that baseline's colour.""",
    ),
    (
        "code",
        """results, source = nh.load_results()
print(source)
print(nh.provenance(results))""",
    ),
    (
        "md",
        """### Both baselines side by side

Headline operations per model (on the `eqx.nn` models when the run has them) against the
fair twin and against `eqx.filter_jit`, then the training step (forward + grad + optax
adam).""",
    ),
    ("code", "display(Markdown(nh.fair_twin_table(results)))"),
    (
        "md",
        """### Training step time

Milliseconds per step of every implementation; hatched bars run under
`eqx.filter_jit`.""",
    ),
    (
        "code",
        """fig = nh.plot_training(results)
plt.show()""",
    ),
    (
        "md",
        """### The eqx.nn models

Four models built from `eqx.nn` layers (`benchmarks/real_models.py`): 256
`eqx.nn.Linear` in a list beside an activation, a 12-block transformer
(`MultiheadAttention`, `LayerNorm`, `MLP`, `Dropout`), the mixed-container stack (lists
mixing layers, functions, ints, strings and floats) and AutoModules nested 4 deep. One
marker per model and operation, whiskers over the interquartile range; the upper panel
against the fair twin, the lower against `eqx.filter_jit`; the shaded side is where
AutoModule is slower; "fails / n/a" marks an operation the baseline cannot run.""",
    ),
    (
        "code",
        """fig = nh.plot_real_models(results)
plt.show()""",
    ),
    (
        "md",
        """### The benchmark models

The models of `benchmarks/models.py` (MLPs 4, 32 and 256 layers deep, a transformer and
a mixed-container model, written in every implementation): ratios against both
baselines, then the absolute time of the MLPs by depth, one line per implementation
(`dict` is the floor: the same arrays in plain dicts).""",
    ),
    (
        "code",
        """display(Markdown(nh.models_table(results)))
fig = nh.plot_mlp_overhead(results)
plt.show()""",
    ),
    (
        "md",
        """### Where AutoModule loses

Every comparison above whose median ratio is above 1, grouped by operation and
baseline, with how many of them have the whole interquartile range above 1 (a clear
loss rather than noise); then the trace counts of the retracing benchmark.""",
    ),
    (
        "code",
        """display(Markdown(nh.losses_text(results)))
fig = nh.plot_losses(results)
plt.show()
display(Markdown(nh.retracing_text(results)))""",
    ),
    (
        "md",
        """### Targets of this run

MET / MISSED against fixed thresholds, as `python -m benchmarks` judged them.""",
    ),
    ("code", "display(Markdown(nh.targets_text(results)))"),
    (
        "md",
        """## 6. Conclusion

Written by `nh.conclusion` from the results loaded above and from the ecosystem report
(`ecosystem/results/results.json`: diffrax, lineax and optimistix's own tests with their
modules rebased onto AutoModule); no number in it is typed in by hand.""",
    ),
    ("code", "display(Markdown(nh.conclusion(results, nh.load_ecosystem())))"),
]


def build() -> nbformat.NotebookNode:
    """The notebook of `CELLS`, not executed."""
    notebook = nbformat.v4.new_notebook()
    for kind, source in CELLS:
        new = (
            nbformat.v4.new_markdown_cell if kind == "md" else nbformat.v4.new_code_cell
        )
        notebook.cells.append(new(source))
    notebook.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    return notebook


def execute(
    notebook: nbformat.NotebookNode, timeout: int = 600
) -> nbformat.NotebookNode:
    """Runs every cell in a fresh kernel whose working folder is `examples/` (as
    Jupyter's would be), so `import notebook_helpers` finds the module beside it."""
    client = nbclient.NotebookClient(
        notebook,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(HERE)}},
    )
    client.execute()
    return notebook


def main(argv: list[str] | None = None) -> Path:
    """Builds, executes and writes the notebook; returns where it was written."""
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
