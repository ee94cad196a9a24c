"""The containers section of the report: its table, its targets, and its verdict
lines."""

from ..schema import ContainersKind, Ratio, Results, SAME_CONTAINERS, Target
from .claims import Claim, KindDispatch
from .format import fmt_ratio, fmt_stat_us, table
from .targets import judged_target

KIND_NAMES = {
    "readme-mlp": 'the README\'s `MLP` (a list of `{"w", "b"}` dicts)',
    "dict-of-dicts": 'a dict of `{"w", "b"}` dicts',
    "list-of-arrays": "a list of arrays",
    "mixed-tuples": "a list of `(array, jax.nn.relu, i)` tuples",
}
OP_NAMES = {
    "flatten": "flatten",
    "unflatten": "unflatten",
    "dispatch": "`jax.jit` dispatch",
}
# The project's targets: (op, threshold) on every kind the fair twin holds as it is,
# at every size,
TARGETS: tuple[tuple[str, float], ...] = (
    ("flatten", 2.3),
    ("unflatten", 1.2),
    ("dispatch", 1.5),
)
TARGET_KINDS = ("readme-mlp", "dict-of-dicts", "list-of-arrays")
# and (ratio, threshold, reference) on the mixed tuples, whose fair baseline is the
# twin's dynamic half.
MIXED = "mixed-tuples"
MIXED_TARGETS: tuple[tuple[str, float, str], ...] = (
    ("dispatch_filter_jit", 0.5, "eqx-filter / eqx.filter_jit"),
    ("dispatch", 3.0, "eqx-static's dynamic half / jax.jit"),
)
MEMORY_THRESHOLD = 1.25


def _entries(n: str) -> str:
    """`4,096`."""
    return f"{int(n):,}"


def containers_section(res: dict[str, ContainersKind]) -> list[str]:
    """A row per kind and size: the paired ratios, the times and the Python memory
    one model keeps."""
    rows = []
    for kind, entry in res.items():
        for i, (n, d) in enumerate(entry["sizes"].items()):
            us = d["us"]
            rows.append(
                [
                    KIND_NAMES.get(kind, kind) if i == 0 else "",
                    _entries(n),
                    *(fmt_ratio(d["ratios"].get(op), iqr=True) for op in OP_NAMES),
                    fmt_ratio(d["ratios"].get("dispatch_filter_jit"), iqr=True),
                    f"{d['memory_ratio']:.2f}x",
                    *(
                        f"{fmt_stat_us(us.get(f'autostatic|{op}'))} / "
                        f"{fmt_stat_us(us.get(f'eqx-static|{op}'))}"
                        for op in OP_NAMES
                    ),
                    fmt_stat_us(us.get("eqx-filter|dispatch")),
                    f"{d['memory_bytes']['autostatic']:,.0f} / "
                    f"{d['memory_bytes']['eqx-static']:,.0f}",
                ]
            )
    lines = [
        "### Containers in fields: the models people write, AutoModule / the fair "
        "baseline",
        "",
    ]
    lines += table(
        ["model", "entries"]
        + [f"{name} (IQR)" for name in OP_NAMES.values()]
        + ["dispatch vs `eqx.filter_jit` (IQR)", "memory"]
        + [f"{name}, µs (ours / fair)" for name in OP_NAMES.values()]
        + ["`eqx.filter_jit` dispatch, µs", "memory, bytes (ours / twin)"],
        rows,
        "ll" + "r" * 10,
    )
    lines += [
        "",
        "Each model is a class of two fields, `params` (the container) and "
        "`activation` (`jax.nn.relu`). Ratios of AutoModule under plain `jax.jit`, "
        "paired per round (< 1 = faster), against the fair baseline: the fair twin "
        "(the same fields on `eqx.Module`, `activation` marked static, plain "
        "`jax.jit`) holding the same containers, except where said below; and, for "
        "dispatch, against `eqx.filter_jit` on the unmarked twin (what Equinox users "
        "run). Unflatten is `treedef.unflatten(leaves)`, no field read. Dispatch: a "
        "jitted function returning a constant. Memory: the Python bytes one model "
        "keeps after one flatten (`tracemalloc`), against the fair twin's class "
        "holding the same containers, the arrays made beforehand and shared.",
        "",
    ]
    lines += [
        f"* {KIND_NAMES.get(kind, kind)}: the fair baseline holds {entry['fair']}."
        for kind, entry in res.items()
        if entry["fair"] != SAME_CONTAINERS
    ]
    return lines + ([""] if lines[-1] else [])


def _over_sizes(
    name: str,
    entry: ContainersKind | None,
    key: str,
    threshold: float,
    kind: str,
) -> Target:
    """`key`'s ratio <= `threshold` at every size, judged on the worst (N/A where the
    kind was not measured)."""
    measured: list[tuple[str, Ratio]] = [
        (n, r)
        for n, d in (entry["sizes"].items() if entry else ())
        if (r := d["ratios"].get(key))
    ]
    worst = max((r["median"] for _, r in measured), default=None)
    detail = ", ".join(f"{_entries(n)}: {fmt_ratio(r, iqr=True)}" for n, r in measured)
    return judged_target(
        f"{name} (every size)",
        worst,
        "<=",
        threshold,
        detail or "not measured",
        f"containers: {kind}",
    )


def _memory_target(entry: ContainersKind | None, kind: str) -> Target:
    """The Python memory per model <= 1.25x the fair twin's at every size."""
    sizes = entry["sizes"] if entry else {}
    worst = max((d["memory_ratio"] for d in sizes.values()), default=None)
    return judged_target(
        f"Python memory per model <= {MEMORY_THRESHOLD}x eqx-static (every size)",
        worst,
        "<=",
        MEMORY_THRESHOLD,
        ", ".join(f"{_entries(n)}: {d['memory_ratio']:.2f}x" for n, d in sizes.items())
        or "not measured",
        f"containers: {kind}",
    )


def containers_targets(results: Results) -> list[Target]:
    """`TARGETS` on each kind the fair twin holds as it is, `MIXED_TARGETS` on the
    mixed tuples, and every kind's memory, each at every size (N/A where a kind was
    not measured)."""
    res = results.get("containers") or {}
    targets = []
    for kind in TARGET_KINDS:
        for op, threshold in TARGETS:
            name = f"{OP_NAMES[op]} <= {threshold}x eqx-static"
            targets.append(_over_sizes(name, res.get(kind), op, threshold, kind))
    for key, threshold, ref in MIXED_TARGETS:
        name = f"`jax.jit` dispatch <= {threshold}x {ref}"
        targets.append(_over_sizes(name, res.get(MIXED), key, threshold, MIXED))
    kinds = [*TARGET_KINDS, MIXED] + [k for k in res if k not in (*TARGET_KINDS, MIXED)]
    return targets + [_memory_target(res.get(kind), kind) for kind in kinds]


def containers_claims(res: dict[str, ContainersKind]) -> list[Claim]:
    """The verdict's lines: flatten and unflatten on every kind the fair twin holds
    as it is (the mixed tuples' baseline, a dynamic half, is not the same tree), and
    every kind's memory."""
    same = {k: v for k, v in res.items() if v["fair"] == SAME_CONTAINERS}
    claims = []
    for op in ("flatten", "unflatten"):
        found = [
            r
            for entry in same.values()
            for d in entry["sizes"].values()
            if (r := d["ratios"].get(op))
        ]
        if found:
            claims.append(
                Claim(
                    f"{OP_NAMES[op]} of a model holding its parameters in containers",
                    [r["median"] for r in found],
                    f"{', '.join(same)}; {_sizes_text(same)} entries",
                    spreads=[(r["q1"], r["q3"]) for r in found],
                )
            )
    memory = [d["memory_ratio"] for e in res.values() for d in e["sizes"].values()]
    if memory:
        claims.append(
            Claim(
                "the Python memory of a model holding its parameters in containers",
                memory,
                f"{', '.join(res)}; {_sizes_text(res)} entries",
                "the fair twin's",
            )
        )
    return claims


def _sizes_text(res: dict[str, ContainersKind]) -> str:
    """Every size measured, `16, 256, 4,096`."""
    sizes = sorted({int(n) for e in res.values() for n in e["sizes"]})
    return ", ".join(f"{n:,}" for n in sizes)


def containers_dispatch(res: dict[str, ContainersKind]) -> list[KindDispatch]:
    """Each kind's line of the verdict's dispatch list."""
    kinds = []
    for kind, entry in res.items():
        sizes = entry["sizes"]
        fair_name = (
            "the fair twin"
            if entry["fair"] == SAME_CONTAINERS
            else "the fair twin's dynamic half"
        )
        kinds.append(
            KindDispatch(
                KIND_NAMES.get(kind, kind),
                [_entries(n) for n in sizes],
                "entries",
                [d["ratios"].get("dispatch") for d in sizes.values()],
                [d["ratios"].get("dispatch_filter_jit") for d in sizes.values()],
                fair_name,
            )
        )
    return kinds
