"""The benchmark report writer on a small synthetic results dict, and the profile's budget rules."""

import json
import math

import pytest
from pydantic import ValidationError

from harmony_mobile.bench.profile import BenchProfile, load_profile
from harmony_mobile.bench.report import aggregate, paired_gap, write_report

METHODS = ["harmony", "harmony-meta", "splitgp", "fedavg"]


def fake_run(method: str, seed: int, accuracy: float, split: bool = True) -> dict:
    mean = {}
    for p in ("p=0", "p=0.2", "p=0.5"):
        row = {"accuracy": accuracy - (0.1 if p != "p=0" else 0.0), "exit_rate": 0.6 if split else 1.0}
        if split:
            row |= {"fallback_rate": 0.4, "server_fallback_accuracy": 0.7}
        mean[p] = row
    summary = {"accuracy_without_ood": accuracy, "accuracy_with_ood": accuracy - 0.1}
    if split:
        summary["alignment_score"] = 0.5
    run = {
        "setting": "toy-family",
        "method": method,
        "seed": seed,
        "summary": summary,
        "mean": mean,
        "wall_seconds": 10.0 + seed,
        "upload_bytes_per_sample": 1234.0,
        "uplink": {"total": 1234},
    }
    if split:
        run["validation"] = {"accuracy_with_ood": accuracy - 0.05}
    return run


def synthetic_results() -> dict:
    base = {"harmony": 0.9, "harmony-meta": 0.85, "splitgp": 0.7, "fedavg": 0.6}
    runs = [
        fake_run(m, seed, base[m] + 0.01 * seed, split=m != "fedavg") for seed in (0, 1, 2) for m in METHODS
    ]
    points = {
        "x": [0.0, 1.0, 2.0, 3.0],
        "y": [1.0, 0.0, 1.0, 2.0],
        "class": [0, 1, 2, 3],
        "family": ["cnn", "mobilenet", "resnet", "cnn"],
        "ood": [False, False, True, False],
    }
    return {
        "profile": {
            "name": "toy",
            "description": "a synthetic profile",
            "seeds": [0, 1, 2],
            "settings": [{"name": "toy-family", "dataset": "digits", "partition": "family"}],
            "methods": METHODS,
            "budget": {"rounds": 2, "local_steps": 3, "samples_per_step": 32},
            "train": {"clients_per_tier": 1},
            "notes": "tuned on validation only",
        },
        "method_configs": {m: {"local_steps": 3} for m in METHODS},
        "machine": {"cpu_count": 2},
        "total_wall_seconds": 123.0,
        "runs": runs,
        "projections": {
            "setting": "toy-family",
            "seed": 0,
            "methods": {"splitgp": points, "harmony": points},
        },
    }


def test_aggregate_gives_mean_and_sample_std_over_seeds():
    aggregated = aggregate(synthetic_results())
    harmony = aggregated["toy-family"]["harmony"]
    assert harmony["acc_p0"]["mean"] == pytest.approx(0.91)
    assert harmony["acc_p0"]["std"] == pytest.approx(0.01)
    assert harmony["acc_with_ood"]["n"] == 3
    assert math.isnan(aggregated["toy-family"]["fedavg"]["alignment_score"]["mean"])
    gap = paired_gap(synthetic_results(), "toy-family", "harmony", "splitgp")
    assert gap["mean"] == pytest.approx(0.2) and gap["std"] == pytest.approx(0.0, abs=1e-12)


def test_report_has_a_table_per_setting_plots_and_round_tripping_json(tmp_path):
    results = synthetic_results()
    report = write_report(results, tmp_path)
    text = report.read_text()
    assert "## toy-family" in text
    assert "| method | acc p=0 | acc p=0.2 | acc p=0.5 | acc with OOD |" in text
    harmony_row = next(line for line in text.splitlines() if line.startswith("| harmony |"))
    assert "91.0 ± 1.0" in harmony_row  # acc p=0, percent
    assert "81.0 ± 1.0" in harmony_row  # with OOD
    assert "1,234" in harmony_row  # upload bytes per sample
    fedavg_row = next(line for line in text.splitlines() if line.startswith("| fedavg |"))
    assert "–" in fedavg_row  # no fallback / alignment for a no-split method
    assert "**+20.0 ± 0.0 points**" in text  # HARMONY - SplitGP
    assert "`harmony-meta` -5.0" in text  # ablation cost
    assert "target of at least +5 points: **met**" in text
    assert "Every ablation costs accuracy on average: **yes**" in text
    assert "tuned on validation only" in text
    for png in ("accuracy_vs_ood.png", "pca_features.png"):
        data = (tmp_path / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
        assert f"]({png})" in text
    loaded = json.loads((tmp_path / "results.json").read_text())
    assert loaded["runs"] == json.loads(json.dumps(results["runs"]))
    assert loaded["aggregated"]["toy-family"]["harmony"]["acc_p0"]["mean"] == pytest.approx(0.91)
    assert loaded["aggregated"]["toy-family"]["fedavg"]["alignment_score"]["mean"] is None  # NaN -> null
    assert loaded["projections"]["methods"]["harmony"]["family"][0] == "cnn"
    # the report re-renders from its own results.json (NaN stored as null) with the same table
    rerendered = write_report(loaded, tmp_path / "again").read_text()
    assert rerendered.split("## Plots")[0] == text.split("## Plots")[0]


def test_profiles_share_one_budget_and_pass_hyper_parameters_to_relatives():
    profile = BenchProfile(
        name="t",
        seeds=[0],
        settings=[{"name": "s"}],
        methods=["harmony", "harmony-contrastive", "splitgp", "multi-exit", "fedavg"],
        budget={"rounds": 2, "local_steps": 5, "samples_per_step": 64},
        algorithm_config={"harmony": {"lr": 0.01}, "splitgp": {"gamma": 0.3, "mix_lambda": 0.5}},
    )
    assert profile.method_config("harmony") == {"local_steps": 5, "batch_size": 32, "lr": 0.01}
    assert profile.method_config("harmony-contrastive") == {"local_steps": 5, "batch_size": 32, "lr": 0.01}
    assert profile.method_config("multi-exit") == {"local_steps": 5, "batch_size": 64, "gamma": 0.3}
    assert profile.method_config("fedavg") == {"local_steps": 5, "batch_size": 64}
    with pytest.raises(ValidationError):
        BenchProfile(**{**profile.model_dump(), "methods": ["nope"]})
    for name in ("quick", "full"):
        assert load_profile(name).name == name


def test_a_tiny_benchmark_runs_end_to_end_and_counts_uplink_bytes(tmp_path):
    from harmony_mobile.bench.runner import run_benchmark

    profile = BenchProfile(
        name="tiny",
        seeds=[0],
        settings=[{"name": "digits-family", "dataset": "digits", "dataset_limit": 600}],
        methods=["harmony", "splitgp", "fedavg", "local"],
        budget={"rounds": 1, "local_steps": 2, "samples_per_step": 16},
        train={"clients_per_tier": 1},
        algorithm_config={"harmony": {"personalize_epochs": 1}},
    )
    results = run_benchmark(profile, tmp_path / "runs", log=lambda _: None)
    runs = {r["method"]: r for r in results["runs"]}
    harmony, splitgp = runs["harmony"]["uplink"], runs["splitgp"]["uplink"]
    # HARMONY uploads V=2 variants of each query row, SplitGP one row per sample, 64x8x8 float32 each
    assert harmony["feature_bytes"] == harmony["uploaded_rows"] * 64 * 8 * 8 * 4
    assert harmony["label_bytes"] == 8 * harmony["uploaded_rows"]
    assert splitgp["uploaded_rows"] > 0 and splitgp["update_bytes"] > 0
    assert runs["local"]["uplink"]["total"] == 0  # nothing leaves a local-only phone
    assert runs["fedavg"]["uplink"]["feature_bytes"] == 0 and runs["fedavg"]["uplink"]["update_bytes"] > 0
    assert 0 <= runs["harmony"]["validation"]["accuracy_with_ood"] <= 1
    assert "validation" not in runs["fedavg"]
    assert set(results["projections"]["methods"]) == {"splitgp", "harmony"}
    report = write_report(results, tmp_path / "report")
    assert "| harmony |" in report.read_text()


def test_a_client_holding_every_class_is_evaluated_without_ood():
    """Dirichlet alpha 0.5 (the full profile) gives some clients every class: no OOD exists for them."""
    import torch

    from harmony_mobile.data import load_dataset
    from harmony_mobile.data.partition import make_partition
    from harmony_mobile.evaluation import ServedBackend, evaluate
    from harmony_mobile.models import Backend, InterfaceSpec, load_tiers
    from harmony_mobile.privacy.label_tokens import class_tokens, epoch_key
    from harmony_mobile.training import TrainConfig, build_clients

    dataset = load_dataset("digits")
    tiers = load_tiers().with_input_shape(dataset.input_shape)
    partition = make_partition("dirichlet", dataset.labels.numpy(), 12, 0, alpha=0.5)
    everything = [c.client_id for c in partition.clients if len(c.classes) == 10]
    assert everything  # seed 0 has such a client
    clients = build_clients(
        TrainConfig(clients_per_tier=3), tiers, dataset, partition, InterfaceSpec(), b"S" * 32, "e-test"
    )
    served = ServedBackend(
        Backend(InterfaceSpec(), 10).eval(),
        list(class_tokens(epoch_key(b"S" * 32, "e-test"), dataset.class_names)),
    )
    results = evaluate(clients, served, dataset.images, dataset.labels, partition, 0)
    name = clients[everything[0]].name
    assert results["per_client"][name]["p=0.5"]["accuracy"] == results["per_client"][name]["p=0"]["accuracy"]
    assert torch.isfinite(torch.tensor(results["summary"]["accuracy_with_ood"]))
