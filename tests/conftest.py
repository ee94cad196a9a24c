import os

# Eight host devices, so sharding tests run on a CPU-only machine. Must precede jax.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

# Scripts that tests run in subprocesses or hand to type checkers: not modules to
# import (--doctest-modules would).
collect_ignore = ["ecosystem_scripts", "typing"]
