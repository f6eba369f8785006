"""How the Flower engine scales: Flower's Simulation Engine with 10, 100 and 1,000 virtual clients
on Fashion-MNIST (70,000 images: 70 per client at 1,000), a tenth of them sampled per round.

Per client count it records, per round, wall seconds and bytes both ways (flower_rounds.jsonl),
the peak memory (proportional set size: shared pages counted once) of the whole process tree
(this benchmark's child: the ServerApp,
Flower's Simulation Engine with every node's state, Ray's daemons and its actors), the phases'
seconds and the final federated evaluation. Each count runs in a fresh subprocess so Ray and the
memory peak start clean, and its record is written to OUT/flower_scale/<clients>.json as soon as
it finishes: `--resume` keeps the records already there and measures only the missing counts.

    .venv/bin/python benchmarks/flower_scale.py --resume           # 10 100 1000, writes the report
    .venv/bin/python benchmarks/flower_scale.py --clients 10 100 --rounds 2 --out /tmp/scale

Fashion-MNIST comes from Debian's package: `apt-get install dataset-fashion-mnist`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

TIERS = 2  # the first two built-in tiers; clients = TIERS * clients per tier
ACTORS = 2  # Ray actors (virtual SuperNodes' workers): one per core of the 2-core machine
OUT = Path(__file__).parent / "results"
DATASET = "fashion_mnist"
ALPHA = 0.5  # Dirichlet concentration of the label skew: the project's usual non-IID split
METHOD = {"local_steps": 20, "batch_size": 16}  # fedavg: cheap enough for 1,000 clients in minutes


def tree_pss_bytes(root: int) -> tuple[int, int]:
    """Proportional set size of `root` alone and of `root` with all its descendants, from /proc: a
    page shared by n processes counts 1/n in each (RSS would count torch's libraries once per
    process)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            children.setdefault(int(stat[stat.rindex(")") + 2 :].split()[1]), []).append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    own, total, stack = 0, 0, [root]
    while stack:
        pid = stack.pop()
        stack.extend(children.get(pid, []))
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        pss = sum(int(line.split()[1]) * 1024 for line in rollup.splitlines() if line.startswith("Pss:"))
        total += pss
        own = pss if pid == root else own
    return own, total


def run_one(clients: int, rounds: int, fraction: float, run_dir: Path) -> None:
    """In the subprocess: one Flower simulation."""
    import torch
    import yaml

    from harmony_mobile.flower.run import train_flower
    from harmony_mobile.flower.settings import FlowerSettings
    from harmony_mobile.models.tiers import DEFAULT_TIERS_FILE
    from harmony_mobile.training import TrainConfig

    torch.set_num_threads(1)
    tiers = yaml.safe_load(DEFAULT_TIERS_FILE.read_text())
    tiers["tiers"] = tiers["tiers"][:TIERS]
    tiers_file = run_dir.parent / "tiers.yaml"
    tiers_file.write_text(yaml.safe_dump(tiers))
    config = TrainConfig(
        dataset=DATASET,
        tiers_file=str(tiers_file),
        clients_per_tier=clients // TIERS,
        partition="dirichlet",
        alpha=ALPHA,
        rounds=rounds,
        clients_per_round=max(1, round(clients * fraction)),
        algorithm="fedavg",
        algorithm_config=METHOD,
        threads=1,
    )
    resources = {
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
        "init_args": {"num_cpus": ACTORS, "log_to_driver": False},
    }
    settings = FlowerSettings(train_config=config, run_dir=str(run_dir), reply_timeout=3600)
    train_flower(settings, backend_config=resources)


def measure(clients: int, rounds: int, fraction: float) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix=f"flower-scale-{clients}-")) / "run"
    args = [sys.executable, __file__, "--single", str(clients), "--rounds", str(rounds)]
    args += ["--fraction", str(fraction), "--run-dir", str(run_dir)]
    started = time.perf_counter()
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    timeline: list[tuple[float, float, float]] = []  # seconds, ServerApp process MB, whole tree MB

    def sample() -> None:
        while process.poll() is None:
            own, total = tree_pss_bytes(process.pid)
            timeline.append((time.perf_counter() - started, own / 2**20, total / 2**20))
            time.sleep(1.0)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, stderr = process.communicate()
    sampler.join()
    if process.returncode != 0:
        raise RuntimeError(f"{clients} clients failed:\n{stderr[-3000:]}")
    transport = [json.loads(line) for line in (run_dir / "flower_rounds.jsonl").read_text().splitlines()]
    final = json.loads((run_dir / "final_metrics.json").read_text())
    return {
        "clients": clients,
        "sampled_per_round": transport[0]["sampled"],
        "rounds": transport,  # per round: sampled, replied, bytes each way, seconds
        "peak_memory_mb": max(total for _, _, total in timeline),
        # the process running the ServerApp and Flower's Simulation Engine, which keeps every
        # virtual node's state (context.state) between its messages
        "peak_server_process_mb": max(own for _, own, _ in timeline),
        "memory_timeline": [[round(t, 1), round(own), round(total)] for t, own, total in timeline],
        "phase_seconds": final["phase_seconds"],
        "total_seconds": time.perf_counter() - started,
        "summary": final["summary"],
        "clients_evaluated": len(final["per_client"]),
        "clients_without_evaluation": final["clients_without_evaluation"],
    }


def steady(row: dict) -> list[dict]:
    """The rounds after the first (round 0 pays the actors' imports and data loads)."""
    return row["rounds"][1:] or row["rounds"]


def growth(rows: list[dict], value) -> float:
    """Exponent b of value ~ clients^b, least squares on logs over every steady round of every
    size (1 = linear, < 1 = better)."""
    points = [(r["clients"], value(r, t)) for r in rows for t in steady(r)]
    x = np.log([c for c, _ in points])
    y = np.log([max(v, 1e-9) for _, v in points])
    return float(np.polyfit(x, y, 1)[0])


def report(rows: list[dict], fraction: float, wanted: list[int]) -> str:
    rounds = len(rows[0]["rounds"])
    lines = [
        "# Flower Simulation Engine: scale",
        "",
        f"`benchmarks/flower_scale.py --resume`: fedavg on Fashion-MNIST (70,000 images, Dirichlet "
        f"partition alpha {ALPHA}), {rounds} rounds, {fraction:.0%} of the clients sampled per "
        f"round and trained concurrently, {METHOD['local_steps']} local steps of batch {METHOD['batch_size']}, "
        f"tiers entry-android and mid-android, {ACTORS} Ray actors, torch 1 thread, on a shared 2-core machine "
        "(other jobs ran at the same time: single numbers carry noise of tens of percent). Seconds and "
        "bytes per round are the mean over the rounds after the first (round 0 pays the actors' imports "
        "and data loads); the records, per round, are in `flower_scale/<clients>.json`.",
        "",
        "| clients | samples/client (mean) | sampled/round | s/round | MB/round | peak PSS (MB) | accuracy without OOD "
        "| with OOD | setup+connect s | personalize s | evaluate s | total s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        phases, summary = r["phase_seconds"], r["summary"]
        seconds = np.mean([t["seconds"] for t in steady(r)])
        megabytes = np.mean([t["bytes_sent"] + t["bytes_received"] for t in steady(r)]) / 1e6
        lines.append(
            f"| {r['clients']} | {70_000 // r['clients']} | {r['sampled_per_round']} | {seconds:.2f} | "
            f"{megabytes:.1f} | {r['peak_memory_mb']:.0f} | {summary['accuracy_without_ood']:.3f} | "
            f"{summary['accuracy_with_ood']:.3f} | {phases['setup'] + phases['connect']:.1f} | "
            f"{phases['personalize']:.1f} | {phases['evaluate']:.1f} | {r['total_seconds']:.0f} |"
        )
    missing = sorted(set(wanted) - {r["clients"] for r in rows})
    if missing:
        lines += ["", f"Not measured: {missing} clients (no record; rerun with --resume)."]
    lines += ["", *analysis(rows)]
    return "\n".join(lines) + "\n"


def slope(rows: list[dict], key: str) -> float:
    """MB per client: least-squares slope of `key` over the sizes."""
    return float(np.polyfit([r["clients"] for r in rows], [r[key] for r in rows], 1)[0])


def analysis(rows: list[dict]) -> list[str]:
    if len(rows) < 3:
        return ["Growth exponents need at least three sizes; fewer were measured."]
    sizes = np.log([r["clients"] for r in rows])
    memory_b = float(np.polyfit(sizes, np.log([r["peak_memory_mb"] for r in rows]), 1)[0])
    peaks = ", ".join(f"{r['peak_server_process_mb']:.0f}" for r in rows)
    return [
        "Chance is 0.1 (10 classes; a client's test rows are of its own classes, plus other classes' "
        "OOD rows in `with OOD`, which fedavg has no fallback for). fedavg keeps the family's global "
        "model (no personalization), so its accuracy is what the federation learned; each size is one "
        "run (one random lineage and split).",
        "",
        "Growth with the number of clients (exponent b of value ~ clients^b, fitted over every steady "
        f"round of the {len(rows)} sizes; 1 = linear): "
        f"s/round b = {growth(rows, lambda r, t: t['seconds']):.2f}, "
        f"bytes/round b = {growth(rows, lambda r, t: t['bytes_sent'] + t['bytes_received']):.2f}; "
        f"peak memory b = {memory_b:.2f} (one value per size: the whole tree's peak, Ray's daemons and "
        "actors with torch in each, comes in the final evaluation and varies by more than a GB between "
        "runs without a trend in the clients).",
        "",
        "Memory per virtual client (least-squares slope over the sizes): "
        f"{slope(rows, 'peak_server_process_mb'):.2f} MB in the process running the ServerApp and the "
        f"Simulation Engine (peak {peaks} MB), "
        f"{slope(rows, 'peak_memory_mb'):.2f} MB for the whole process tree. The engine keeps every "
        "virtual node's state (Flower's `context.state`) in that process: between personalization "
        "and evaluation that is each client's personalized model (fedavg: the family's whole model, "
        "about 1.2 MB; on a phone it is the phone's own memory), dropped once the client is "
        "evaluated. `memory_timeline` in each record has both values every second.",
        "",
        "Why: a round's sampled clients (a tenth) train concurrently on the actors, at most "
        "max-in-flight (256) messages outstanding, so seconds and bytes per round follow the number "
        "sampled: linear in the clients at a fixed fraction. Bytes per turn are the family model down "
        "and the update up, the same at any size. The ServerApp holds the server's state only "
        "(meta-weights, no client, no data); an actor keeps the data file's raw pixels once plus the "
        "rows of the few clients it served last. Personalization and evaluation visit every client, "
        "so those phases grow linearly with all clients, not the sampled ones.",
    ]


def record_path(out: Path, clients: int) -> Path:
    return out / "flower_scale" / f"{clients}.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--resume", action="store_true", help="keep the sizes already recorded in OUT")
    parser.add_argument("--report-only", action="store_true", help="re-render the report from the records")
    parser.add_argument("--single", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.single is not None:
        run_one(args.single, args.rounds, args.fraction, args.run_dir)
        return
    bad = [n for n in args.clients if n % TIERS]
    if bad:
        parser.error(f"client counts must be multiples of {TIERS} (one tier each): {bad}")
    for clients in args.clients:
        path = record_path(args.out, clients)
        if args.report_only or (args.resume and path.is_file()):
            continue
        row = measure(clients, args.rounds, args.fraction)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(row, indent=2) + "\n")
        print(f"{clients} clients: {row['total_seconds']:.0f} s, {row['summary']}", flush=True)
    rows = [json.loads(p.read_text()) for n in args.clients if (p := record_path(args.out, n)).is_file()]
    if not rows:
        parser.error(f"no record in {args.out / 'flower_scale'}")
    text = report(rows, args.fraction, args.clients)
    (args.out / "flower_scale.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
