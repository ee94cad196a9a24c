import json
from pathlib import Path

import matplotlib.pyplot as plt

results = json.loads(Path("../benchmarks/results/cpu/results.json").read_text())
machine = results["machine"]
print(
    f"{machine['mode']} run of {machine['date'][:10]}: {machine['device_kind']}, jax {machine['versions']['jax']}, equinox {machine['versions']['equinox']}"
)

impls = ["autostatic", "eqx-static", "eqx-filter", "dict"]
sizes = sorted(
    int(name.split("-")[1]) for name in results["tree_ops"] if name.startswith("mlp-")
)
fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
for ax, op in zip(axes, ["flatten", "unflatten"]):
    for impl in impls:
        ys = [
            results["tree_ops"][f"mlp-{n}"]["ops_us"][impl][op]["median"] for n in sizes
        ]
        ax.loglog(sizes, ys, "o-", label=impl)
    ax.set(title=f"tree_{op} (median µs)", xlabel="layers")
for variant in [
    "autostatic / jax.jit",
    "eqx-static / jax.jit",
    "eqx-static / eqx.filter_jit",
    "eqx-filter / eqx.filter_jit",
    "dict / jax.jit",
]:
    ys = [
        results["tree_ops"][f"mlp-{n}"]["dispatch_us"][variant].get("median")
        for n in sizes
    ]
    axes[2].loglog(sizes, ys, "o-", label=variant)
axes[2].set(title="dispatch per call (median µs)", xlabel="layers")
axes[0].legend(fontsize=8)
axes[2].legend(fontsize=7)
plt.tight_layout()
plt.show()

for target in results["targets"]:
    value = target["value"]
    shown = f"{value:.2f}" if isinstance(value, float) else value
    print(f"{target['status']:>11}  {target['target']}  ({target['where']}): {shown}")
