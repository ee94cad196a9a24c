import os
import sys
from pathlib import Path

# Eight host devices, so sharding tests run on a CPU-only machine. Must precede jax.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
sys.path.insert(0, str(Path(__file__).parent))
