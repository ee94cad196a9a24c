"""How much each mode (`--smoke`, `--quick`, `--full`) measures: `Settings` and `MODES`.

`results.json` records the settings of its run (`dataclasses.asdict`), so a field is
renamed only together with the committed results.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Settings:
    """How much of everything one mode measures."""

    mode: str
    sizes: tuple[int, ...]  # MLP depths of the tree-op / dispatch groups
    rounds: int  # rounds of the interleaved tree-op / dispatch groups
    target_batch_s: float  # the aimed duration of one timed batch
    # Wall budget of one interleaved group (after its minimum rounds); None: no limit.
    group_budget_s: float | None
    # The same for the MLP the targets are read on, and for each real model.
    target_group_budget_s: float | None
    retrace_repeats: int  # the "x20" of the scripted retracing scenarios
    contrast_calls: int  # calls per scenario of the retracing contrasts
    adam_steps: int
    # Fresh functions per variant for the time to first call of the cheap function,
    ttfc_reps: int
    # and of the whole forward pass (0: skipped; ~1 s each at N=256 on a CPU).
    ttfc_forward_reps: int
    train_sizes: tuple[int, ...]  # MLP depths trained
    # Whether the models of fixed size marked `trained` in the registry (the
    # transformer) are trained too.
    train_transformer: bool
    train_steps: int  # steps per timed batch
    train_rounds: int
    train_budget_s: float | None
    async_steps: int
    async_rounds: int
    async_host_s: float  # host work between two steps
    async_device_s: float  # aimed device time of one step
    # Construction: rounds of the interleaved builds, the blocks of the transformer
    # built with its layers' init (and traced), the scalar arrays one AutoModule wraps,
    construction_rounds: int
    construction_blocks: int
    construction_arrays: int
    # fresh traces per variant and function,
    trace_reps: int
    # and the diffrax / optimistix processes per side (stock, rebased), each timing
    # this many fresh compiles per workload.
    ecosystem_processes: int
    ecosystem_reps: int
    # The depths of the scaling section (its rounds and budget: `rounds`,
    # `group_budget_s`).
    scaling_sizes: tuple[int, ...]
    # The entries of the containers section's models (its rounds and budget: `rounds`,
    # `group_budget_s`).
    containers_sizes: tuple[int, ...]
    # Whether timed code runs with the collector off (`--gc-off`); on by default, as
    # users run (`timing`).
    gc_off: bool = False


MODES: dict[str, Settings] = {
    "smoke": Settings(
        mode="smoke",
        sizes=(4, 16),
        rounds=3,
        target_batch_s=2e-4,
        group_budget_s=0.5,
        target_group_budget_s=0.5,
        retrace_repeats=3,
        contrast_calls=3,
        adam_steps=5,
        ttfc_reps=1,
        ttfc_forward_reps=0,
        train_sizes=(4,),
        train_transformer=False,
        train_steps=2,
        train_rounds=2,
        train_budget_s=1.0,
        async_steps=2,
        async_rounds=2,
        async_host_s=2e-4,
        async_device_s=2e-4,
        construction_rounds=3,
        construction_blocks=2,
        construction_arrays=2000,
        trace_reps=1,
        ecosystem_processes=1,
        ecosystem_reps=1,
        scaling_sizes=(16, 64),
        containers_sizes=(4, 16),
    ),
    "quick": Settings(
        mode="quick",
        sizes=(4, 32, 256),
        rounds=30,
        target_batch_s=2e-3,
        group_budget_s=2.0,
        target_group_budget_s=6.0,
        retrace_repeats=20,
        contrast_calls=5,
        adam_steps=200,
        ttfc_reps=7,
        ttfc_forward_reps=0,
        train_sizes=(32,),
        train_transformer=True,
        train_steps=10,
        train_rounds=10,
        train_budget_s=3.0,
        async_steps=10,
        async_rounds=6,
        async_host_s=1e-3,
        async_device_s=3e-3,
        construction_rounds=15,
        construction_blocks=12,
        construction_arrays=20000,
        trace_reps=5,
        ecosystem_processes=3,
        ecosystem_reps=3,
        scaling_sizes=(16, 256, 4096),
        containers_sizes=(16, 256, 4096),
    ),
    "full": Settings(
        mode="full",
        sizes=(4, 32, 256),
        rounds=150,
        target_batch_s=2e-3,
        group_budget_s=None,
        target_group_budget_s=None,
        retrace_repeats=20,
        contrast_calls=5,
        adam_steps=200,
        ttfc_reps=15,
        ttfc_forward_reps=5,
        train_sizes=(32, 256),
        train_transformer=True,
        train_steps=20,
        train_rounds=15,
        train_budget_s=None,
        async_steps=50,
        async_rounds=10,
        async_host_s=1e-3,
        async_device_s=3e-3,
        construction_rounds=40,
        construction_blocks=12,
        construction_arrays=20000,
        trace_reps=15,
        ecosystem_processes=5,
        ecosystem_reps=5,
        scaling_sizes=(16, 64, 256, 1024, 4096),
        containers_sizes=(16, 256, 4096),
    ),
}
