"""The benchmark runner works end to end (`--smoke`: seconds). No time is asserted:
benchmarks are never tests; this only checks that every section runs and reports."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `benchmarks` is a package at the repository root
    sys.path.append(str(ROOT))


def test_runner_smoke_mode_writes_results(tmp_path: Path) -> None:
    pytest.importorskip("optax")
    from benchmarks.runner import main

    assert main(["--smoke", "--out", str(tmp_path)]) == 0  # 1 means a section crashed

    results = json.loads((tmp_path / "results.json").read_text())
    for key in (
        "machine",
        "settings",
        "tree_ops",
        "async_dispatch",
        "retracing",
        "first_call",
        "training",
        "serialisation",
        "real_models",
        "targets",
        "errors",
        "wall_s",
    ):
        assert key in results, key
    assert results["errors"] == []
    machine = results["machine"]
    for key in (
        "platform",
        "cpu_count",
        "python",
        "backend",
        "device_kind",
        "versions",
        "date",
        "mode",
    ):
        assert machine[key] is not None, key
    assert machine["mode"] == "smoke"
    assert set(machine["versions"]) >= {
        "jax",
        "jaxlib",
        "equinox",
        "optax",
        "autostatic",
    }

    mlps = [k for k in results["tree_ops"] if k.startswith("mlp-")]
    assert (
        mlps and "transformer" in results["tree_ops"] and "mixed" in results["tree_ops"]
    )
    group = results["tree_ops"][mlps[-1]]
    for impl in ("autostatic", "eqx-static", "eqx-filter", "dataclass", "dict"):
        for op in ("flatten", "unflatten", "flatten_with_path", "treedef_eq"):
            assert group["ops_us"][impl][op]["median"] > 0
    dispatch = group["dispatch_us"]
    assert dispatch["autostatic / jax.jit"]["median"] > 0
    assert "fails" in dispatch["eqx-filter / jax.jit"]  # recorded, not a crash

    counts = results["retracing"]["counts"]["autostatic / jax.jit"]
    assert set(counts) == set(results["retracing"]["scenarios"])
    assert results["training"] and results["async_dispatch"]["variants"]
    statuses = {t["status"] for t in results["targets"]}
    assert statuses <= {"MET", "MISSED", "N/A"} | {
        f"info: {s}" for s in ("MET", "MISSED", "N/A")
    }
    assert len(results["targets"]) >= 9
    assert (tmp_path / "results.md").read_text().count("### Targets") == 1

    real = results["real_models"]
    assert set(real["models"]) == {"linear-256", "transformer", "mixed-stack", "nested"}
    ops = {
        "build",
        "flatten",
        "unflatten_read",
        "treedef_eq",
        "dispatch",
        "dispatch_filter_jit",
        "tree_at_array",
        "tree_at_layer",
    }
    assert set(real["ops"]) == ops
    for name, res in real["models"].items():
        assert set(res["ops_us"]) == ops, name
        for op, stats in res["ops_us"].items():
            # autostatic never fails; the others are measured or record why they fail
            # (eqx-static under plain jax.jit where an eqx.nn layer holds a function).
            assert stats["autostatic"]["median"] > 0, (name, op)
            for impl in ("eqx-static", "eqx-filter"):
                assert stats[impl].get("median", 0) > 0 or stats[impl]["fails"], (
                    name,
                    op,
                    impl,
                )
        assert all(info["treedefs_equal"] for info in res["info"].values()), name
    assert real["models"]["linear-256"]["ops_us"]["flatten"]["dict"]["median"] > 0
    real_targets = [t for t in results["targets"] if t["where"].startswith("real: ")]
    assert len(real_targets) == 14
    assert "### Real models" in (tmp_path / "results.md").read_text()

    if importlib.util.find_spec("matplotlib") is not None:
        for png in ("overhead_vs_n.png", "training_throughput.png"):
            assert (tmp_path / png).stat().st_size > 0, png
