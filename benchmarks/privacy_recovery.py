"""What a curious operator recovers from what it holds, against auxiliary data and feature noise.

For each feature-noise setting and seed: train a run (digits, harmony), export one tier, give the
"operator" the server part of the run dir (no `clients/`) and the model dir, and attack
(harmony_mobile/bench/privacy_attacks.py):

* slot naming with k = 0 labeled images per class (the checkpoint attack: inputs synthesized from
  the server's meta-weights, run through the served .pte) and with k = 1, 5, 20 (the aux images
  through the served .pte and g, each class given the slot its images land in most);
* row recovery: a phone's uploads (its training images through the served .pte, clipped and
  noised as the lineage says) labelled from their features alone by the nearest class mean of k = 5
  aux images in g's feature space. Label DP does not change this number: it randomizes tokens,
  not features.

With each noise setting, the run's accuracy with OOD (its own final evaluation) gives the cost.

    .venv/bin/python benchmarks/privacy_recovery.py            # sigma off, 0.02, 0.1, 0.5; seeds 0 1 2
    .venv/bin/python benchmarks/privacy_recovery.py --seeds 0 --sigmas 0 --rounds 3   # quick look
    .venv/bin/python benchmarks/privacy_recovery.py --resume   # after a stop: keeps OUT.json's records

Writes benchmarks/results/privacy_recovery.md and .json (docs/PRIVACY.md quotes them).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from harmony_mobile.export.pipeline import export_run

from harmony_mobile.bench.privacy_attacks import (
    OperatorView,
    aux_naming,
    aux_sample,
    checkpoint_naming,
    named_right,
    row_recovery,
)
from harmony_mobile.privacy.feature_noise import privatize_features
from harmony_mobile.run_dir import CLIENT_PART, RunDir
from harmony_mobile.training import TrainConfig, train

RESULTS = Path(__file__).parent / "results"
TIER = "flagship"
KS = (1, 5, 20)
CLIP = 1.0


def train_and_export(work: Path, seed: int, sigma: float, rounds: int) -> tuple[RunDir, OperatorView]:
    noise = {"feature_clip": CLIP, "noise_multiplier": sigma} if sigma > 0 else {}
    config = TrainConfig(dataset="digits", clients_per_tier=1, rounds=rounds, seed=seed, **noise)
    train(config, work / "run", show_progress=False)
    export_run(  # the attack reads the served model: a variant that missed its int8 gate does not matter
        work / "run",
        work / "model",
        tiers=[TIER],
        key_dir=work / "keys",
        progress=False,
        latency_runs=1,
        allow_failed_variants=True,
    )
    shutil.copytree(work / "run", work / "server-part", ignore=shutil.ignore_patterns(CLIENT_PART))
    return RunDir(work / "run"), OperatorView.load(work / "model", work / "server-part", TIER)


def phone_uploads(
    run: RunDir, view: OperatorView, sigma: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows as the representative phone uploads them, their true classes)."""
    client = run.representative_client(TIER)
    dataset = run.dataset()
    index = torch.tensor(client.train_idx)
    with torch.no_grad():
        _, features = view.program.run(dataset.images[index])
    generator = torch.Generator().manual_seed(seed)
    rows = privatize_features(features.float(), CLIP if sigma > 0 else None, sigma or None, generator)
    return rows, dataset.labels[index]


def attack(run: RunDir, view: OperatorView, work: Path, sigma: float, seed: int) -> dict:
    truth = run.slot_to_class()
    dataset = run.dataset()
    held = np.concatenate([np.asarray(c.train_idx) for c in run.clients()])
    labels = dataset.labels.numpy()
    right, seen = named_right(checkpoint_naming(view, work / "server-part", TIER), truth)
    result = {"slots": seen, "named_k0": right / seen}
    for k in KS:
        index = aux_sample(labels, k, held, seed)
        right, _ = named_right(aux_naming(view, dataset.images[index], dataset.labels[index]), truth)
        result[f"named_k{k}"] = right / seen
    index = aux_sample(labels, 5, held, seed)
    rows, classes = phone_uploads(run, view, sigma, seed)
    guess = row_recovery(view, rows, dataset.images[index], dataset.labels[index])
    result["row_recovery_k5"] = float((guess == classes).float().mean())
    result["accuracy_with_ood"] = run.final_metrics()["summary"]["accuracy_with_ood"]
    return result


def render(records: list[dict], rounds: int, seconds: float) -> str:
    columns = ["named_k0", *(f"named_k{k}" for k in KS), "row_recovery_k5", "accuracy_with_ood"]
    lines = [
        "# What a curious operator recovers (benchmarks/privacy_recovery.py)",
        "",
        f"digits, harmony defaults, {rounds} rounds, one client per tier; attacks on tier {TIER}; "
        f"features clipped to {CLIP:g} when noised. Mean [min, max] over seeds. "
        f"Chance for naming a slot: 0.10. {seconds / 60:.1f} min of runs on {platform.machine()}, 1 torch thread.",
        "",
        "| feature noise sigma | seeds | " + " | ".join(columns) + " |",
        "|---|---|" + "---|" * len(columns),
    ]
    for sigma in sorted({r["sigma"] for r in records}):
        rows = [r for r in records if r["sigma"] == sigma]
        cells = [
            f"{np.mean([r[c] for r in rows]):.2f} [{min(r[c] for r in rows):.2f}, {max(r[c] for r in rows):.2f}]"
            for c in columns
        ]
        lines.append(f"| {sigma:g} | {len(rows)} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "named_kK: fraction of slots named right with K labeled images per class (K = 0: no labeled data, "
        "the checkpoint attack). row_recovery_k5: fraction of a phone's uploaded rows whose class the "
        "operator guesses from the features alone (5 labeled images per class), whatever label DP does "
        "to their tokens. accuracy_with_ood: the run's own final evaluation (mean over p = 0.2, 0.5).",
        "Feature noise is drawn from each phone's CSPRNG, so a noised run does not repeat bit for bit.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--sigmas", type=float, nargs="+", default=[0.0, 0.02, 0.1, 0.5])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--out", type=Path, default=RESULTS / "privacy_recovery")
    parser.add_argument("--resume", action="store_true", help="keep the records in OUT.json, run the rest")
    args = parser.parse_args()
    if any(s < 0 for s in args.sigmas) or args.rounds < 1:
        parser.error("sigmas must be >= 0 and rounds >= 1")
    torch.set_num_threads(1)
    report = args.out.with_suffix(".json")
    saved = json.loads(report.read_text()) if args.resume and report.is_file() else {}
    if saved and saved["rounds"] != args.rounds:
        parser.error(f"{report} holds {saved['rounds']}-round runs; resume with --rounds {saved['rounds']}")
    records, seconds = saved.get("records", []), saved.get("seconds", 0.0)
    for sigma in args.sigmas:
        for seed in args.seeds:
            if any(r["sigma"] == sigma and r["seed"] == seed for r in records):
                continue
            started = time.perf_counter()
            with tempfile.TemporaryDirectory() as tmp:
                run, view = train_and_export(Path(tmp), seed, sigma, args.rounds)
                records.append({"sigma": sigma, "seed": seed, **attack(run, view, Path(tmp), sigma, seed)})
            seconds += time.perf_counter() - started
            report.write_text(
                json.dumps({"rounds": args.rounds, "seconds": seconds, "records": records}, indent=2)
            )
            print(json.dumps(records[-1]), flush=True)
    args.out.with_suffix(".md").write_text(render(records, args.rounds, seconds))


if __name__ == "__main__":
    main()
