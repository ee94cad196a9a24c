#!/usr/bin/env bash
# The test suite, run against autostatic as a user installs it: a wheel built from
# this checkout, installed (not editable) with its `test` extra into the active
# environment, and the suite run from a copy of the repository without the package's
# source, so that `import autostatic` can only find the installed wheel (a module the
# wheel lacks fails here). The doctests run on the installed modules. Without
# arguments the whole suite runs in two worker processes (pytest-xdist: CI has two
# cores; the suite is Python-bound, about half the time of one process); arguments go
# to pytest instead (`bash tests/installed.sh -x tests/test_node.py`).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python -m pip wheel -q --no-deps --wheel-dir "$work/dist" "$root"
wheel=$(echo "$work"/dist/autostatic-*.whl)
python -m pip install -q "$wheel[test]"
# Replaces an editable install of the same version, which pip takes as satisfied.
python -m pip install -q --force-reinstall --no-deps "$wheel"

mkdir "$work/checkout"
(cd "$root" && git ls-files -z --cached --others --exclude-standard) \
    | grep -zv '^autostatic/' \
    | (cd "$root" && tar --null --files-from=- --ignore-failed-read -cf -) \
    | (cd "$work/checkout" && tar -xf -)
cd "$work/checkout"
python - <<'PY'
import pathlib, autostatic
where = pathlib.Path(autostatic.__file__).resolve()
assert "site-packages" in where.parts, f"autostatic imported from {where}"
PY
if [ $# -eq 0 ]; then
    set -- -n 2 tests --pyargs autostatic
fi
python -m pytest -q -c pyproject.toml --rootdir . "$@"
