"""What a fallback-server install brings, beside the whole environment: `pip install .[server]`
against `pip install .[all]` (what `make` builds), each into a fresh venv under the lock's versions.

For each: pip's wall time (warm cache, this machine's local torch wheel), the venv's size and
distribution count, the largest distributions, whether the training, Flower and exporter stacks are
there, and `harmony serve --no-alignment` (one process, a tiny export as its model dir): seconds
from process start to the first 200 from /v2/health/ready, and its resident memory then.

    .venv/bin/python benchmarks/install_footprint.py [--model-dir EXPORT] [--starts 3] [--roles server]

Without --model-dir it trains one round on `digits` and exports the entry-android tier in the
[all] venv first. `--roles server` re-measures that role alone (a --model-dir is then needed) and
keeps the other role's numbers from the existing report, each role with its own date and load.
Writes benchmarks/results/install_footprint.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers import role_venv  # noqa: E402

MB = 1024 * 1024


def distribution_sizes(venv: Path) -> dict[str, int]:
    """Bytes of each installed distribution, from the files its RECORD lists."""
    (site,) = (venv / "lib").glob("python*/site-packages")
    sizes = {}
    for record in site.glob("*.dist-info/RECORD"):
        name = record.parent.name.removesuffix(".dist-info").rsplit("-", 1)[0]
        total = 0
        for line in record.read_text().splitlines():
            path = site / line.split(",")[0]
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
        sizes[role_venv.normalize(name)] = total
    return sizes


def measure_role(
    extra: str, wheel: Path, work: Path, model_dir: Path | None, starts: int
) -> tuple[dict, Path]:
    venv = work / f"{extra}-venv"
    load_average = round(os.getloadavg()[0], 1)
    install_seconds = role_venv.create_venv(venv, wheel, extra)
    if model_dir is None:
        model_dir = tiny_export(venv, work)
    serves = []
    for index in range(starts):
        data_dir = work / f"{extra}-serve-data-{index}"
        serves.append(role_venv.serve_until_ready(venv / "bin" / "harmony", model_dir, data_dir, work))
    on_disk = role_venv.installed(venv)
    sizes = distribution_sizes(venv)
    largest = sorted(sizes.items(), key=lambda item: -item[1])[:10]
    result = {
        "extra": extra,
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_average": load_average,
        "install_seconds": round(install_seconds, 1),
        "venv_mb": round(role_venv.tree_bytes(venv) / MB, 1),
        "distributions": len(on_disk),
        "largest_mb": {name: round(size / MB, 1) for name, size in largest},
        "present_of_training_flower_exporter": sorted(set(on_disk) & set(role_venv.NOT_ON_A_SERVER)),
        "seconds_to_ready": [round(s.seconds_to_ready, 2) for s in serves],
        "seconds_to_ready_median": round(statistics.median(s.seconds_to_ready for s in serves), 2),
        "seconds_to_ready_fastest": round(min(s.seconds_to_ready for s in serves), 2),
        "rss_mb_at_ready": [round(s.rss / MB, 1) for s in serves],
        "rss_mb_at_ready_median": round(statistics.median(s.rss for s in serves) / MB, 1),
        "peak_rss_mb_median": round(statistics.median(s.peak_rss for s in serves) / MB, 1),
    }
    return result, model_dir


def tiny_export(venv: Path, work: Path) -> Path:
    run_dir, export_dir = work / "run", work / "export"
    steps = [
        ["train", str(run_dir), "--dataset", "digits", "--rounds", "1", "--clients-per-tier", "1"],
        ["export", "run", str(run_dir), "--out", str(export_dir), "--tiers", "entry-android"]
        + ["--key-dir", str(work / "keys"), "--threads", "1"],
    ]
    for args in steps:
        done = role_venv.run_harmony(venv, args, work)
        if done.returncode != 0:
            raise SystemExit(f"harmony {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return export_dir


def markdown(report: dict) -> str:
    server, full = report["roles"]["server"], report["roles"]["all"]
    rows = [
        ("pip install wall time (s)", "install_seconds"),
        ("venv size (MB)", "venv_mb"),
        ("distributions", "distributions"),
        ("`harmony serve` start to /v2/health/ready, median (s)", "seconds_to_ready_median"),
        ("`harmony serve` start to /v2/health/ready, fastest (s)", "seconds_to_ready_fastest"),
        ("resident memory at ready, median (MB)", "rss_mb_at_ready_median"),
        ("peak resident memory by ready, median (MB)", "peak_rss_mb_median"),
    ]
    lines = [
        "# Install footprint: `[server]` against `[all]`",
        "",
        "Written by `benchmarks/install_footprint.py`; every number below is measured by it, on",
        f"{report['machine']}; the machine is shared, so the times are wall times under the load",
        f"at each role's start (`[server]`: load average {server.get('load_average', report['load_average'])},"
        f" {server.get('measured_at', report['measured_at'])}; `[all]`: {full.get('load_average', report['load_average'])},"
        f" {full.get('measured_at', report['measured_at'])}). Each install goes into a fresh venv",
        "with requirements.lock as constraints, pip's cache warm and torch taken from the local CPU",
        f"wheel. `harmony serve --no-alignment`, one process, {report['starts']} starts each, model",
        "dir: a one-round `digits` run exported for the entry-android tier. Under such a load a",
        "start's time depends on what else runs at that moment (see each start below): the fastest",
        "start says more than the median, and the memory is the steadier comparison.",
        "",
        "| | `pip install .[server]` | `pip install .[all]` |",
        "| --- | ---: | ---: |",
    ]
    for label, key in rows:
        lines.append(f"| {label} | {server[key]} | {full[key]} |")
    lines.append(
        "| training, Flower and exporter distributions present "
        f"(of {', '.join(role_venv.NOT_ON_A_SERVER)}) | "
        f"{', '.join(server['present_of_training_flower_exporter']) or 'none'} | "
        f"{', '.join(full['present_of_training_flower_exporter']) or 'none'} |"
    )
    lines += ["", "Each start (s to ready / MB resident):", ""]
    for role in (server, full):
        pairs = zip(role["seconds_to_ready"], role["rss_mb_at_ready"], strict=True)
        lines.append(f"- `[{role['extra']}]`: " + ", ".join(f"{s} s / {m} MB" for s, m in pairs))
    lines += ["", "Largest distributions (MB):", ""]
    for role in (server, full):
        largest = ", ".join(f"{name} {size}" for name, size in role["largest_mb"].items())
        lines.append(f"- `[{role['extra']}]`: {largest}")
    lines += [
        "",
        "`harmony serve --no-alignment` runs the back-end with what is installed: `[server]` has no",
        "PyTorch and serves backend.onnx through ONNX Runtime, `[all]` serves backend.pt through",
        "PyTorch (alignment rounds need it: the `[alignment]` extra). The training, Flower and",
        "exporter stacks are never imported by the server.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, help="an export dir (default: train and export a tiny one)")
    parser.add_argument("--starts", type=int, default=3, help="server starts per install")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--render-only", action="store_true", help="rewrite the .md from the .json")
    parser.add_argument("--roles", default="all,server", help="roles to measure (others kept from the .json)")
    args = parser.parse_args()
    if args.render_only:
        report = json.loads((args.out / "install_footprint.json").read_text())
        (args.out / "install_footprint.md").write_text(markdown(report))
        return
    roles = [role.strip() for role in args.roles.split(",")]
    if "all" not in roles and args.model_dir is None:
        parser.error("without the [all] role there is no venv to make a tiny export in: give --model-dir")
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "load_average": round(os.getloadavg()[0], 1),
        "starts": args.starts,
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "roles": {},
    }
    if set(roles) != {"all", "server"}:
        report = json.loads((args.out / "install_footprint.json").read_text())
    with tempfile.TemporaryDirectory(prefix="install-footprint-") as temporary:
        work = Path(temporary)
        wheel = role_venv.build_wheel(work / "wheel")
        model_dir = args.model_dir.resolve() if args.model_dir else None
        for role in sorted(roles):  # "all" first: without --model-dir it makes the tiny export
            report["roles"][role], model_dir = measure_role(role, wheel, work, model_dir, args.starts)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "install_footprint.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "install_footprint.md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
