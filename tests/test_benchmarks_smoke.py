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
    # A smoke run's numbers mean nothing: no target is judged MET or MISSED.
    not_judged = "not judged (smoke run)"
    assert statuses <= {not_judged, "N/A", f"info: {not_judged}", "info: N/A"}
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
    text = (tmp_path / "results.md").read_text()
    assert "### Real models" in text
    # The short summary comes last, against both baselines.
    summary = text[text.index("### Summary: AutoModule vs eqx.Module") :]
    assert "fair twin" in summary and "eqx.filter_jit" in summary
    assert "flatten (linear-256" in summary and "Where we are slower" in summary

    if importlib.util.find_spec("matplotlib") is not None:
        for png in ("overhead_vs_n.png", "training_throughput.png"):
            assert (tmp_path / png).stat().st_size > 0, png


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sizes", "0"], "positive integers"),
        (["--sizes", "-4"], "positive integers"),
        (["--sizes", ","], "positive integers"),
        (["--sizes", "abc"], "positive integers"),
        (["--qu"], "unrecognized arguments: --qu"),  # not taken for --quick
        (["--smoke", "--quick"], "not allowed with"),
        (["--only", "tree_ops,nope"], "valid sections: tree_ops"),
        (["--out", "x", "--write-results"], "not allowed with"),
        (["--smoke", "--write-results"], "needs a whole --quick or --full run"),
    ],
)
def test_runner_refuses_bad_arguments(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks.runner import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_runner_default_out_is_not_the_committed_results() -> None:
    from benchmarks.runner import out_dir, parse_args

    committed = (ROOT / "benchmarks" / "results").resolve()
    default = out_dir(parse_args([]), "cpu").resolve()
    assert not default.is_relative_to(committed), default
    assert default.is_relative_to(ROOT / "benchmarks" / "out")
    assert out_dir(parse_args(["--write-results"]), "cpu") == committed / "cpu"
    assert out_dir(parse_args(["--out", "x"]), "cpu") == Path("x")
    assert parse_args(["--only", "real-models,tree_ops"]).only == (
        "tree_ops",
        "real_models",
    )


def test_runner_only_one_section(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("optax")
    from benchmarks.runner import main

    argv = ["--smoke", "--only", "retracing", "--out", str(tmp_path), "--no-plots"]
    assert main(argv) == 0
    printed = capsys.readouterr()

    results = json.loads((tmp_path / "results.json").read_text())
    assert results["sections"] == ["retracing"]
    for key in ("tree_ops", "training", "real_models", "first_call", "serialisation"):
        assert key not in results, key
    assert results["retracing"]["counts"]
    assert [t["section"] for t in results["targets"]] == ["retracing"]
    for text in (printed.out, printed.err, (tmp_path / "results.md").read_text()):
        assert "MET" not in text and "MISSED" not in text
    assert "not judged (smoke run)" in printed.out
    assert "1/1 retracing" in printed.err  # progress: step k of n
    assert printed.out.rstrip().endswith(str(tmp_path / "results.md"))
