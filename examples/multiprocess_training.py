"""Training across processes: several JAX processes form one mesh, an AutoModule whose
weights are sharded over it trains under plain `jax.jit`, every process saves its
shards with orbax, and the checkpoint restores onto a mesh of another shape.

On one machine the processes talk through gloo CPU collectives, each simulating
`--devices` CPU devices; on a cluster each would be one host, started by its launcher
with the same `jax.distributed.initialize` call:

    python examples/multiprocess_training.py --processes 2 --devices 2

Run without `--process-id`, the script starts the processes itself (a free local port
for the coordinator), waits for them, and prints process 0's report. Needs
`pip install optax orbax-checkpoint`.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from typing import Any

STEPS = 4


def _worker(args: argparse.Namespace) -> dict[str, Any]:
    """One process: join the mesh, train, save, restore; process 0's report."""
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        f"localhost:{args.port}", args.processes, args.process_id
    )
    from multiprocess_parts import report  # the model and steps, beside this script

    return report(args.folder, STEPS)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def launch(processes: int, devices: int, folder: str, timeout: float) -> dict[str, Any]:
    """Starts `processes` workers of `devices` devices each and returns process 0's
    report; raises `RuntimeError` with every worker's output if one fails."""
    port = _free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.abspath(__file__)), env.get("PYTHONPATH", "")]
    )
    workers = [
        subprocess.Popen(
            [sys.executable, __file__, "--processes", str(processes), "--devices",
             str(devices), "--process-id", str(i), "--port", str(port), "--folder",
             folder],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(processes)
    ]  # fmt: skip
    outputs = []
    try:
        for worker in workers:
            outputs.append(worker.communicate(timeout=timeout)[0])
    finally:
        for worker in workers:
            worker.kill()
    if any(w.returncode != 0 for w in workers):
        shown = "\n".join(
            f"--- process {i}:\n{o[-3000:]}" for i, o in enumerate(outputs)
        )
        raise RuntimeError(f"a worker failed:\n{shown}")
    last = [line for line in outputs[0].splitlines() if line.startswith("{")][-1]
    return json.loads(last)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--devices", type=int, default=2, help="per process")
    parser.add_argument("--process-id", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--folder", help="where the checkpoint goes (a temporary one)")
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    if args.process_id is not None:
        print(json.dumps(_worker(args)), flush=True)
        return
    with tempfile.TemporaryDirectory() as folder:
        out = launch(args.processes, args.devices, args.folder or folder, args.timeout)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
