"""Evaluation-only screen: should a phone answer a fallen-back sample with the server's top slot
alone, or fuse the server's slot scores (which the V2 response already carries) with what it holds
(its exit's probabilities, which classes are its own)? Over the saved HARMONY runs of the `fashion`
profile; every phone keeps its calibrated threshold and gate; validation picks, test confirms.

    python benchmarks/results/fashion-fallback-fusion/fusion_screen.py \
        --runs-under benchmarks/results/fashion/work/eval --out benchmarks/results/fashion-fallback-fusion
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from scipy import stats

from harmony_mobile.algorithms.base import calibrate_threshold, exit_score
from harmony_mobile.bench import gates
from harmony_mobile.bench.saved_runs import load_finished_run
from harmony_mobile.data.partition import ClientSplit, ood_test_indices
from harmony_mobile.evaluation import ClientAnswers

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/
from gate_study import split_runs_under  # noqa: E402

PRIOR_BONUS = (-1.0, -0.5, 0.5, 1.0, 2.0)
POOL = (0.1, 0.25, 0.5)
PRODUCT = (0.1, 0.25, 0.5, 1.0)
MARGIN_BONUS = (2.0, 5.0, 10.0, 20.0)
FALLBACK_AT = 0.5


def class_log_probs(client, served, features) -> torch.Tensor:
    """The server's slot scores as log-probabilities over the phone's exit classes (what the
    phone decodes with its secret); slots of no class of the phone drop out."""
    slot_class = client.slot_to_class(served.slot_tokens)
    log_p = served.slot_scores(features).log_softmax(dim=1)
    out = torch.full((len(features), client.model.num_classes), -1e9)
    for slot, cls in enumerate(slot_class.tolist()):
        if cls >= 0:
            out[:, cls] = torch.logaddexp(out[:, cls], log_p[:, slot])
    return out


def fused_answers(log_server, exit_logits, own, margin) -> dict[str, torch.Tensor]:
    log_exit = exit_logits.log_softmax(dim=1)
    answers = {"server": log_server.argmax(dim=1)}
    server_top_own = own[answers["server"]].bool()
    # where the server names one of the phone's own classes, the phone's exit picks which one
    answers["own top -> exit"] = torch.where(server_top_own, exit_logits.argmax(dim=1), answers["server"])
    own_only = log_server.masked_fill(own == 0, float("-inf"))
    for beta in (0.5, 1.0):
        among_own = (own_only + beta * log_exit).argmax(dim=1)
        answers[f"own top -> server x exit^{beta:g} among own"] = torch.where(
            server_top_own, among_own, answers["server"]
        )
    for a in MARGIN_BONUS:  # own classes favoured as far as the slot margin says the sample is one
        answers[f"margin bonus {a:g}"] = (log_server + a * margin[:, None] * own).argmax(dim=1)
        answers[f"margin-shifted bonus {a:g}"] = (log_server + a * (margin[:, None] - 0.05) * own).argmax(
            dim=1
        )
    for b in PRIOR_BONUS:
        answers[f"own bonus {b:+g}"] = (log_server + b * own).argmax(dim=1)
    for lam in POOL:
        pooled = (1 - lam) * log_server.exp() + lam * log_exit.exp()
        answers[f"pool {lam:g}"] = pooled.argmax(dim=1)
    for beta in PRODUCT:
        answers[f"product {beta:g}"] = (log_server + beta * log_exit.clamp_min(-30)).argmax(dim=1)
    return answers


GATE_WEIGHTS = (0.0, 0.1, 0.25, 0.5)


def combined_gates(client, split) -> dict:
    """margin + w max softmax on the phone's validation samples and on the studied samples."""
    val_logits, val_features = client.model(client.val_x, client.split_depth)
    out = {}
    for w in GATE_WEIGHTS:

        def score(logits, features, w=w):
            return exit_score(client, logits, features, "slot_margin") + w * logits.softmax(dim=1).amax(dim=1)

        out[f"margin + {w:g} max_softmax"] = (
            score(val_logits, val_features),
            score(split.exit_logits, split.features),
        )
    return out


@torch.no_grad()
def client_rows(answers: ClientAnswers, served, labels, index, is_ood) -> dict:
    client = answers.client
    truth = client.exit_labels(labels[index])
    split = answers.split(index)
    own = torch.zeros(client.model.num_classes)
    own[client.train_y.unique()] = 1.0
    log_server = class_log_probs(client, served, split.features)
    margin = exit_score(client, split.exit_logits, split.features, "slot_margin")
    fused = fused_answers(log_server, split.exit_logits, own, margin)
    assert torch.equal(fused["server"], split.server_prediction)
    score = margin.numpy()
    calibrated = score >= client.threshold
    at_rate = np.zeros(len(score), dtype=bool)
    at_rate[np.argsort(score, kind="stable")[round(FALLBACK_AT * len(score)) :]] = True
    exit_ok = (split.exit_prediction == truth).numpy()
    rows = {}
    server_ok = (fused["server"] == truth).numpy()
    for name, (val_score, sample_score) in combined_gates(client, split).items():
        threshold = calibrate_threshold(
            val_score, client.val_y == client.model(client.val_x, client.split_depth)[0].argmax(dim=1), 0.98
        )
        keep = (sample_score >= threshold).numpy()
        rows[f"gate {name}"] = {
            "headline": float(np.where(keep, exit_ok, server_ok).mean()),
            "at_50": np.nan,
            "server_only": float(server_ok.mean()),
            "id_fallback": np.nan,
            "ood_fallback": np.nan,
        }
    for name, answer in fused.items():
        server_ok = (answer == truth).numpy()
        rows[name] = {
            "headline": float(np.where(calibrated, exit_ok, server_ok).mean()),
            "at_50": float(np.where(at_rate, exit_ok, server_ok).mean()),
            "server_only": float(server_ok.mean()),
            "id_fallback": float(server_ok[~calibrated & ~is_ood].mean())
            if (~calibrated & ~is_ood).any()
            else np.nan,
            "ood_fallback": float(server_ok[~calibrated & is_ood].mean())
            if (~calibrated & is_ood).any()
            else np.nan,
        }
    return rows


def run_rows(path: Path) -> dict:
    run = load_finished_run(path)
    label_array = run.labels.numpy()
    out = {}
    for on in ("val", "test"):
        pool = run.partition.ood_pool
        if on == "val":
            pool = np.unique(
                np.concatenate([np.asarray(s.val, dtype=np.int64) for s in run.partition.clients])
            )
        per_p = []
        for p in gates.GATE_OOD_FRACTIONS:
            clients = []
            for client in run.clients:
                split = run.partition.clients[client.client_id]
                if on == "val":
                    split = ClientSplit(
                        client.client_id, tuple(client.classes), split.val, split.val, split.val
                    )
                try:
                    index, is_ood = ood_test_indices(split, label_array, pool, p, run.seed)
                except ValueError:
                    continue
                answers = ClientAnswers(client, run.served, run.images)
                clients.append(client_rows(answers, run.served, run.labels, index, is_ood))
            per_p.append(clients)
        names = per_p[0][0]
        out[on] = {
            name: {
                metric: float(np.mean([np.nanmean([c[name][metric] for c in cl]) for cl in per_p]))
                for metric in per_p[0][0][name]
            }
            for name in names
        }
    return out


def paired(a: list[float], b: list[float]) -> str:
    d = 100 * (np.asarray(a) - np.asarray(b))
    half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
    return f"{d.mean():+.2f} [{d.mean() - half:+.2f}, {d.mean() + half:+.2f}]"


def report(rows: dict) -> list[str]:
    lines = [
        "# A fallen-back sample's answer fused with what the phone holds (evaluation only)",
        "",
        "Accuracy with OOD in %: `headline` at each phone's calibrated threshold; `at 50 %` with half of "
        "each phone's samples falling back, lowest margin first. `gate ...` rows: the phones "
        "recalibrated on that score, the server's top slot as the answer. See README.md.",
        "",
    ]
    for setting, runs in rows.items():
        names = list(runs[0]["val"])
        lines += [
            f"## {setting} ({len(runs)} runs)",
            "",
            "| fallback answer | val headline | test headline | test - server (paired) | val at 50 % | test at 50 % "
            "| test server only | test ID fallback acc | test OOD fallback acc |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for name in names:

            def mean(on, metric, name=name, runs=runs):
                return 100 * float(np.nanmean([r[on][name][metric] for r in runs]))

            diff = paired(
                [r["test"][name]["headline"] for r in runs], [r["test"]["server"]["headline"] for r in runs]
            )
            lines.append(
                f"| {name} | {mean('val', 'headline'):.2f} | {mean('test', 'headline'):.2f} | {diff} "
                f"| {mean('val', 'at_50'):.2f} | {mean('test', 'at_50'):.2f} | {mean('test', 'server_only'):.2f} "
                f"| {mean('test', 'id_fallback'):.1f} | {mean('test', 'ood_fallback'):.1f} |"
            )
        lines.append("")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs-under", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows: dict[str, list] = {}
    for path in split_runs_under(args.runs_under, "harmony"):
        rows.setdefault(path.parent.parent.name, []).append(run_rows(path))
        print(path, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rows.json").write_text(json.dumps(rows) + "\n")
    (args.out / "report.md").write_text("\n".join(report(rows)) + "\n")


if __name__ == "__main__":
    main()
