"""`python -m benchmarks`: see `benchmarks.runner` for the options."""

import sys

from .runner import main

if __name__ == "__main__":
    sys.exit(main())
