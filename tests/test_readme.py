"""The README's first example runs as printed."""

import re
from pathlib import Path


def test_readme_example_runs(capsys):
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    example = re.findall(r"```python\n(.*?)```", readme, re.S)[0]
    exec(compile(example, "README.md", "exec"), {})
    assert capsys.readouterr().out.strip() == ".layers[0]['b']"
