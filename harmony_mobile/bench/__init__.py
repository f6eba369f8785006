"""`harmony bench`: every method on the same partitions, tiers and budget over several seeds, and
the report (markdown table per setting, PNG plots, results.json).

    profile.py  what a benchmark profile is (benchmarks/configs/<name>.yaml) and how a method's
                config is derived from the shared budget
    runner.py   one training run per (setting, method, seed), uplink byte accounting, validation
                metrics (clients' val splits only, for tuning), PCA of back-end features
    report.py   aggregation over seeds and the report writer
"""

from harmony_mobile.bench.profile import BenchProfile, load_profile
from harmony_mobile.bench.report import aggregate, write_bench_report
from harmony_mobile.bench.runner import run_benchmark

__all__ = ["BenchProfile", "aggregate", "load_profile", "run_benchmark", "write_bench_report"]
