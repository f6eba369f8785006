"""Run a benchmark profile and write its report (the same as `harmony bench`).

    python benchmarks/bench.py --profile quick          # smoke profile: mnist5k, 3 seeds, about 40 min on 2 cores
    python benchmarks/bench.py --profile standard --jobs 2   # the README's profile (about 2.5 h on 2 cores)
    python benchmarks/bench.py --profile full --data-root ~/data   # more seeds, digits, Dirichlet 0.1/0.5

Profiles are benchmarks/configs/<name>.yaml; reports land in benchmarks/results/<name>/.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harmony_mobile.bench.runner import bench


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profile", default="quick", help="profile name or path to a profile YAML")
    parser.add_argument(
        "--out", type=Path, default=None, help="report folder (default benchmarks/results/<profile>)"
    )
    parser.add_argument("--work-dir", type=Path, default=None, help="where runs are written")
    parser.add_argument(
        "--data-root", default=None, help="folder with official dataset archives (CIFAR, ...)"
    )
    parser.add_argument("--resume", action="store_true", help="reuse finished runs in the work dir")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds overriding the profile's")
    parser.add_argument("--methods", default=None, help="comma-separated methods overriding the profile's")
    parser.add_argument("--report-only", action="store_true", help="re-render the report from results.json")
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel worker processes")
    args = parser.parse_args()
    bench(
        args.profile,
        args.out,
        args.work_dir,
        args.data_root,
        args.resume,
        [int(s) for s in args.seeds.split(",")] if args.seeds else None,
        args.methods.split(",") if args.methods else None,
        report_only=args.report_only,
        jobs=args.jobs,
    )


if __name__ == "__main__":
    main()
