"""No treedef depends on what the process did before: the same models, met in
different orders in fresh interpreters, have the same equal treedefs, treedef hashes
and trace counts (`tests/history_script.py`)."""

import json
import random
import subprocess
import sys
from pathlib import Path

from .history_script import MODELS

SCRIPT = Path(__file__).with_name("history_script.py")


def _seen(order: list[str]) -> dict:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "|".join(order)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_what_jax_sees_of_a_model_does_not_depend_on_the_models_met_before():
    names = list(MODELS)
    orders = [names, names[::-1]]
    rng = random.Random(0)
    for _ in range(2):
        orders.append(rng.sample(names, len(names)))
    seen = [_seen(order) for order in orders]
    for order, other in zip(orders[1:], seen[1:]):
        assert other == seen[0], f"order {order} differs from {orders[0]}"
    # What the order must not change, as the twin has it: a dtype named three ways
    # is one static value, a class is another, and 1, 1.0 and True are three.
    equal = seen[0]["equal"]
    assert equal["cast np.float32"] == ["cast jnp.float32", "cast np.dtype"]
    assert equal["cast int"] == [] and equal["scaled 1"] == []
    assert equal["holder [np.float32, w]"] == ["holder [jnp.float32, w]"]
    assert equal["block [linear, np.float32]"] == ["block [linear, jnp.float32]"]
