"""The scaling section of the report: its tables, its targets, and its verdict lines."""

from ..schema import Results, Scaling, Target
from .claims import Claim, KindDispatch
from .format import fmt_ratio, fmt_stat_us, table
from .targets import judged_target

KIND_NAMES = {
    "own": "the user's own `Linear` (an AutoModule of a weight and a bias)",
    "eqx.nn": "`eqx.nn.Linear`",
}
OP_NAMES = {
    "flatten": "flatten",
    "unflatten_read": "unflatten + read all",
    "dispatch": "`jax.jit` dispatch",
}
TARGET_DEPTH, DEEPEST = "256", "4096"


def scaling_section(res: Scaling) -> list[str]:
    """Per kind of layer, a row per depth: the paired ratios to the fair twin, the
    times, and the Python memory one model keeps."""
    lines = ["### Scaling: 16 to 4,096 layers, AutoModule / the fair twin", ""]
    for kind, depths in res["kinds"].items():
        rows = []
        for n, d in depths.items():
            rows.append(
                [
                    n,
                    *(fmt_ratio(d["ratios"][op], iqr=True) for op in OP_NAMES),
                    fmt_ratio(d["ratios"].get("dispatch_filter_jit"), iqr=True),
                    f"{d['memory_ratio']:.2f}x",
                    *(
                        f"{fmt_stat_us(d['us'][f'autostatic|{op}'])} / "
                        f"{fmt_stat_us(d['us'][f'eqx-static|{op}'])}"
                        for op in OP_NAMES
                    ),
                    f"{d['memory_bytes']['autostatic']:,.0f} / "
                    f"{d['memory_bytes']['eqx-static']:,.0f}",
                ]
            )
        lines += [f"An MLP of {KIND_NAMES.get(kind, kind)} layers:", ""]
        lines += table(
            ["layers"]
            + [f"{name} (IQR)" for name in OP_NAMES.values()]
            + ["dispatch vs `eqx.filter_jit` (IQR)", "memory"]
            + [f"{name}, µs (ours / twin)" for name in OP_NAMES.values()]
            + ["memory, bytes (ours / twin)"],
            rows,
        )
        lines.append("")
    lines += [
        "Ratios are paired per round (< 1 = faster); the fair twin is the same classes "
        "on `eqx.Module` with every non-array field `eqx.field(static=True)`, under "
        "plain `jax.jit`; dispatch vs `eqx.filter_jit`: against the same classes "
        "without markers under `eqx.filter_jit` (what Equinox users run). Memory: the Python bytes one model keeps after one flatten "
        "(`tracemalloc`), the arrays made beforehand and shared by both.",
        "",
    ]
    return lines


def scaling_targets(results: Results) -> list[Target]:
    """The user's own layers at 256: flatten <= 0.30x and dispatch <= 0.40x; no
    ratio worse at 4,096 than at 256; every model's memory <= 1.25x."""
    res = results.get("scaling")
    if not res:
        return []
    targets = []
    own = res["kinds"].get("own", {})
    at, deepest = own.get(TARGET_DEPTH), own.get(DEEPEST)
    for op, threshold in (("flatten", 0.30), ("dispatch", 0.40)):
        if at is None:
            continue
        r = at["ratios"][op]
        targets.append(
            judged_target(
                f"{OP_NAMES[op]} <= {threshold:.2f}x eqx-static",
                r["median"],
                "<=",
                threshold,
                fmt_ratio(r, iqr=True),
                f"scaling: own, {TARGET_DEPTH} layers",
            )
        )
        if deepest is not None:
            worse = deepest["ratios"][op]["median"] / r["median"]
            targets.append(
                judged_target(
                    f"{OP_NAMES[op]} at {DEEPEST} layers / at {TARGET_DEPTH} <= 1.0",
                    worse,
                    "<=",
                    1.0,
                    f"{deepest['ratios'][op]['median']:.2f}x at {DEEPEST}, "
                    f"{r['median']:.2f}x at {TARGET_DEPTH}",
                    "scaling: own",
                )
            )
    for kind, depths in res["kinds"].items():
        worst = max(depths.items(), key=lambda item: item[1]["memory_ratio"])
        targets.append(
            judged_target(
                "Python memory per model <= 1.25x eqx-static (every depth)",
                worst[1]["memory_ratio"],
                "<=",
                1.25,
                ", ".join(f"{n}: {d['memory_ratio']:.2f}x" for n, d in depths.items()),
                f"scaling: {kind}",
            )
        )
    return targets


def scaling_claims(res: Scaling) -> list[Claim]:
    """The verdict's lines for the models of the user's own layers, beside those of
    the eqx.nn models: each operation over every depth, and memory."""
    own = res["kinds"].get("own", {})
    if not own:
        return []
    depths = ", ".join(own)
    claims = [
        Claim(
            f"{OP_NAMES[op]} of an MLP of the user's own AutoModule layers",
            [d["ratios"][op]["median"] for d in own.values()],
            f"{depths} layers",
            spreads=[
                (d["ratios"][op]["q1"], d["ratios"][op]["q3"]) for d in own.values()
            ],
        )
        for op in OP_NAMES
    ]
    memory = [
        d["memory_ratio"] for depths_ in res["kinds"].values() for d in depths_.values()
    ]
    claims.append(
        Claim(
            "the Python memory one model keeps",
            memory,
            f"both kinds of layer, {depths} layers",
            "the fair twin's",
        )
    )
    return claims


def scaling_dispatch(res: Scaling) -> list[KindDispatch]:
    """Each kind of layer's line of the verdict's dispatch list."""
    return [
        KindDispatch(
            f"an MLP of {KIND_NAMES.get(kind, kind)} layers",
            [f"{int(n):,}" for n in depths],
            "layers",
            [d["ratios"].get("dispatch") for d in depths.values()],
            [d["ratios"].get("dispatch_filter_jit") for d in depths.values()],
        )
        for kind, depths in res["kinds"].items()
    ]
