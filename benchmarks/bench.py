"""Run a benchmark profile and write its report: the same command as `harmony bench`, for a checkout
where the package's console script is not on PATH.

    python benchmarks/bench.py --profile quick                 # the smoke profile
    python benchmarks/bench.py --profile standard --jobs 2     # the README's profile
    python benchmarks/bench.py --help                          # every flag of `harmony bench`

Profiles are benchmarks/configs/<name>.yaml; reports land in benchmarks/results/<name>/.
"""

from __future__ import annotations

import sys

from harmony_mobile.cli import app

if __name__ == "__main__":
    app(["bench", *sys.argv[1:]], prog_name="benchmarks/bench.py")
