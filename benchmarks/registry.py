"""Every benchmark model, in one table: `MODELS`.

Adding a benchmark model
------------------------

A model built from `eqx.nn` layers (the usual case: a model as users write it):

1. In `benchmarks/real_models.py`, define its classes, one `define_classes(name,
   fields, static)` call each (`static` names the fields the fair twin marks
   `eqx.field(static=True)`); a `<model>_layers(seed)` that makes its `eqx.nn` layers
   once (`copy_layers` repeats a layer with fresh arrays); and a
   `build_<model>(impl, layers)` that builds the model around them.
2. Add a `Model(name, EQX_NN, ...)` entry to `MODELS` below: `parts` and `build` (the
   two functions), `probe` (one array of the model + 1: the function the dispatch
   cells jit), `layer` (the sub-layer `eqx.tree_at` replaces) and `new_layer` (what
   replaces it). `dict_floor=True` if `build` also takes `"dict"`. For example:

       Model(
           "conv-stack",
           EQX_NN,
           parts=R.conv_stack_layers,
           build=R.build_conv_stack,
           probe=lambda m: m.layers[0].weight + 1,
           layer=lambda m: m.layers[1],
           new_layer=R.new_conv,
       ),

A synthetic model (hand-built pytrees in the five implementations of `models.IMPLS`):

1. In `benchmarks/models.py`, write its AutoModule classes, each under
   `@_user_class(<its non-array fields>)` (from which the other implementations are
   generated); a `<model>_arrays(seed)`; a `build_<model>(impl, arrays)` that builds
   the nodes with `Kit(impl)`. In `benchmarks/forward.py`, its forward pass
   `<model>_apply(m, x)` and its probe.
2. Add a `Model(name, SYNTHETIC, ...)` entry below, with `apply` and `input_shape`;
   `trained=True` to time its training step too.

Nothing else changes: the runner measures every entry of the sections of its kind,
the report's tables and the summary show it, and the smoke test checks every entry.
A model comes with no target: targets are fixed thresholds stated in
`report/targets.py`.

Names are keys of results.json. A synthetic and an eqx.nn model may share one (both
kinds have a `transformer`): they live in different sections.
"""

from typing import Any

from . import forward as F, models as M, real_models as R
from .models import EQX_NN, Model, SYNTHETIC
from .settings import Settings

MODELS: tuple[Model, ...] = (
    Model(
        "mlp",
        SYNTHETIC,
        parts=M.mlp_arrays,  # from the depth: one model per `--sizes` entry
        build=M.build_mlp,
        probe=F.mlp_probe,
        apply=F.mlp_apply,
        input_shape=M.MLP_INPUT_SHAPE,
        sized=True,
        trained=True,
        python_node=M.build_pynode_mlp,
    ),
    Model(
        "transformer",
        SYNTHETIC,
        parts=M.transformer_arrays,
        build=M.build_transformer,
        probe=F.transformer_probe,
        apply=F.transformer_apply,
        input_shape=M.TF_INPUT_SHAPE,
        uses_key=True,
        trained=True,
    ),
    Model(
        "mixed",
        SYNTHETIC,
        parts=M.mixed_arrays,
        build=M.build_mixed,
        probe=F.mixed_probe,
        apply=F.mixed_apply,
        input_shape=M.MLP_INPUT_SHAPE,
    ),
    Model(
        "linear-256",
        EQX_NN,
        parts=R.linear_layers,
        build=R.build_linears,
        probe=lambda m: m.layers[0].weight + 1,
        layer=lambda m: m.layers[3],
        new_layer=R.new_linear,
        dict_floor=True,
    ),
    Model(
        "transformer",
        EQX_NN,
        parts=R.transformer_layers,
        build=R.build_transformer,
        probe=lambda m: m.blocks[0].attn.query_proj.weight + 1,
        layer=lambda m: m.blocks[3].ln1,
        new_layer=R.new_layer_norm,
        treedef_variants=(R.DROPOUT_CHILD,),
    ),
    Model(
        "mixed-stack",
        EQX_NN,
        parts=R.mixed_stack_layers,
        build=R.build_mixed_stack,
        probe=lambda m: m.blocks[0].layers[0].weight + 1,
        layer=lambda m: m.blocks[3].layers[2],
        new_layer=R.new_linear,
    ),
    Model(
        "nested",
        EQX_NN,
        parts=R.nested_layers,
        build=R.build_nested,
        probe=lambda m: m.children[0].children[0].layers[0].weight + 1,
        layer=lambda m: m.children[1].children[2].layers[3],
        new_layer=R.new_linear,
    ),
)

SYNTHETIC_MODELS: dict[str, Model] = {m.name: m for m in MODELS if m.kind == SYNTHETIC}
EQX_NN_MODELS: dict[str, Model] = {m.name: m for m in MODELS if m.kind == EQX_NN}


def synthetic_model(name: str) -> Model:
    """The entry of a synthetic model's results name (`mlp-32` is `mlp`'s)."""
    base, _, depth = name.rpartition("-")
    sized = SYNTHETIC_MODELS.get(base)
    if sized is not None and sized.sized and depth.isdigit():
        return sized
    found = SYNTHETIC_MODELS.get(name)
    if found is None or found.sized:
        raise ValueError(f"no synthetic model named {name!r}")
    return found


def make_parts(name: str) -> Any:
    """What every implementation of a synthetic model is built from, made anew: from
    the depth in the name for a sized model, else from seed 0."""
    model = synthetic_model(name)
    return model.parts(int(name.rpartition("-")[2]) if model.sized else 0)


def tree_ops_models(sizes: tuple[int, ...]) -> list[str]:
    """The synthetic models of the tree-op / dispatch groups, in table order, a sized
    one once per depth."""
    return [
        name
        for model in SYNTHETIC_MODELS.values()
        for name in (
            [f"{model.name}-{n}" for n in sizes] if model.sized else [model.name]
        )
    ]


def trained_models(settings: Settings) -> list[str]:
    """The synthetic models whose training step is timed: a sized one at each depth
    of `train_sizes`, the others with `train_transformer`."""
    names = []
    for model in SYNTHETIC_MODELS.values():
        if not model.trained:
            continue
        if model.sized:
            names += [f"{model.name}-{n}" for n in settings.train_sizes]
        elif settings.train_transformer:
            names.append(model.name)
    return names
