"""The gate study's arithmetic (bench/gates.py): curve end points, the oracle, AUROC and the
prototype score, on hand-made samples whose answers are known."""

import numpy as np
import pytest
import torch

from harmony_mobile.bench.gates import (
    FALLBACK_GRID,
    PhonePrototypes,
    accuracy_curve,
    gate_scores,
    ood_auroc,
)
from harmony_mobile.federation.slot_gate import SlotGate, slot_margin, slot_prototypes


def test_curve_runs_from_exit_only_to_server_only_and_falls_back_lowest_scores_first():
    exit_correct = np.array([1, 1, 0, 0, 1, 0, 1, 1, 0, 1], dtype=bool)
    server_correct = np.array([0, 1, 1, 1, 1, 1, 0, 1, 1, 1], dtype=bool)
    # the samples the exit gets wrong score lowest: falling back 40 % sends exactly them
    score = np.where(exit_correct, 1.0, 0.0) + np.linspace(0, 0.01, 10)
    curve = accuracy_curve(score, exit_correct, server_correct)
    assert curve[0] == pytest.approx(exit_correct.mean())
    assert curve[-1] == pytest.approx(server_correct.mean())
    assert curve[FALLBACK_GRID.index(0.4)] == pytest.approx(1.0)
    # a reversed score falls back the samples the exit gets right first
    reversed_curve = accuracy_curve(-score, exit_correct, server_correct)
    assert reversed_curve[FALLBACK_GRID.index(0.4)] < curve[FALLBACK_GRID.index(0.4)]


def test_auroc_is_one_for_a_separating_score_zero_reversed_and_half_for_ties():
    is_ood = np.array([False] * 5 + [True] * 5)
    score = np.arange(10, 0, -1, dtype=float)
    assert ood_auroc(score, is_ood) == pytest.approx(1.0)
    assert ood_auroc(-score, is_ood) == pytest.approx(0.0)
    assert ood_auroc(np.ones(10), is_ood) == pytest.approx(0.5)
    assert np.isnan(ood_auroc(score, np.zeros(10, dtype=bool)))


def test_scores_rank_a_confident_familiar_sample_above_an_unfamiliar_one():
    prototypes = torch.nn.functional.normalize(torch.eye(3, 6), dim=1)
    features = torch.tensor([[5.0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 5.0]])  # near exit 0; near none
    logits = torch.tensor([[6.0, 0.0, 0.0], [0.4, 0.3, 0.2]])
    scores = gate_scores(logits, features, PhonePrototypes(prototypes))
    assert set(scores) == {"max_softmax", "neg_entropy", "energy", "prototype"}
    for name, value in scores.items():
        assert value[0] > value[1], name
    assert scores["prototype"][0] == pytest.approx(1.0) and scores["prototype"][1] == pytest.approx(0.0)


class SlotByFirstFeatures(torch.nn.Module):
    """A back-end whose slot scores are the first feature values: row i's top slot is known."""

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return features.flatten(1)[:, :4]


def test_slot_prototypes_are_the_unit_mean_of_the_replay_rows_the_backend_puts_in_each_slot():
    replay = torch.tensor(
        [[3.0, 0, 0, 0, 0, 4], [5.0, 0, 0, 0, 0, 0], [0, 2.0, 0, 0, 0, 0], [0, 0, 1.0, 0, 1.0, 0]]
    ).to(torch.float16)
    prototypes = slot_prototypes(SlotByFirstFeatures(), 4, replay)
    assert prototypes.shape == (4, 6)
    # slot 0: mean of the unit rows (0.6, .., 0.8) and (1, .., 0), normalized again
    expected = torch.nn.functional.normalize(torch.tensor([1.6, 0, 0, 0, 0, 0.8]), dim=0)
    assert torch.allclose(prototypes[0], expected, atol=1e-3)
    assert torch.allclose(prototypes[1], torch.tensor([0, 1.0, 0, 0, 0, 0]))
    assert torch.allclose(prototypes[2].norm(), torch.tensor(1.0))
    assert torch.equal(prototypes[3], torch.zeros(6))  # no replay row: no prototype


def test_slot_margin_is_own_nearest_minus_other_nearest_and_ignores_empty_slots():
    prototypes = torch.tensor([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0], [0, 0, 0]])
    own = torch.tensor([True, False, False, True])
    features = torch.tensor([[2.0, 0, 0], [0, 0, 3.0], [1.0, 1.0, 0]])
    margin = slot_margin(features, prototypes, own)
    # at own slot 0: 1 - 0; at other slot 2: 0 - 1; halfway between own 0 and other 1: 0
    assert torch.allclose(margin, torch.tensor([1.0, -1.0, 0.0]), atol=1e-6)
    # a phone holding every slot with a prototype compares with -1, the least cosine
    everything = slot_margin(features, prototypes, torch.tensor([True, True, True, False]))
    assert torch.allclose(everything, torch.tensor([2.0, 2.0, 1.0 / 2**0.5 + 1]), atol=1e-6)
    # one whose own slots have none counts its side as -1 too: scores stay in [-2, 2]
    orphan = slot_margin(features, prototypes, torch.tensor([False, False, False, True]))
    assert torch.allclose(orphan, torch.tensor([-2.0, -2.0, -1.0 - 1.0 / 2**0.5]), atol=1e-6)


def test_the_slot_margin_score_joins_the_study_when_the_run_has_slot_prototypes():
    prototypes = torch.nn.functional.normalize(torch.eye(3, 6), dim=1)
    logits = torch.tensor([[6.0, 0.0, 0.0], [0.4, 0.3, 0.2]])
    features = torch.tensor([[5.0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 5.0]])  # own slot 0; foreign slot 2
    slots = torch.nn.functional.normalize(torch.tensor([[1.0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 1.0]]), dim=1)
    phone = PhonePrototypes(prototypes, SlotGate(slots, torch.tensor([True, False])))
    scores = gate_scores(logits, features, phone)
    assert scores["slot_margin"] == pytest.approx([1.0, -1.0])


def fake_run(method: str, seed: int, shift: float, rule: str = "max_softmax") -> dict:
    curve = [min(1.0, 0.5 + 0.4 * r + shift) for r in FALLBACK_GRID]
    row = {"curve": {rule: curve}, "auroc": {rule: 0.7}, "oracle": 0.9, "server_only": 0.85, "clients": 4}
    return {
        "setting": "s",
        "method": method,
        "seed": seed,
        "gates": {"test": {"p=0.2": row, "p=0.5": row}, "exit_rule": rule},
    }


def test_the_report_compares_curves_at_equal_fallback_rates_paired_by_seed():
    from harmony_mobile.bench.gate_report import curve_table

    runs = [fake_run("harmony", s, 0.05 + 0.01 * s) for s in range(3)]
    runs += [fake_run("splitgp", s, 0.0, "neg_entropy") for s in range(3)]
    runs += [{"setting": "s", "method": "fedavg", "seed": 0}]  # no gate: left out of the table
    lines = curve_table({"runs": runs}, "s", ["harmony", "splitgp", "fedavg"])
    text = "\n".join(lines)
    assert "| harmony | max_softmax | 60.0 | 64.0 | 68.0 | 76.0 |" in text  # 0.5 + 0.4 r + 0.06 on average
    assert "| splitgp | neg_entropy |" in text and "| fedavg |" not in text
    gap_row = next(line for line in lines if line.startswith("| splitgp | **+6.0"))
    assert gap_row.count("**") == 2 * 4  # every compared rate: the interval excludes 0
    assert curve_table({"runs": runs[-1:]}, "s", ["fedavg"]) == []


def test_the_curve_targets_name_the_closest_baseline_and_compare_with_server_only():
    from harmony_mobile.bench.gate_report import curve_target_lines, curve_targets

    verdict = {True: "**met**", False: "**not met**"}
    runs = [fake_run("harmony", s, 0.05 + 0.01 * s) for s in range(3)]
    runs += [fake_run("splitgp", s, 0.0, "neg_entropy") for s in range(3)]
    runs += [fake_run("fedproto", s, 0.04) for s in range(3)]  # 2 points behind on average
    runs += [{"setting": "s", "method": "fedavg", "seed": 0}]  # no split: not a curve to beat
    entry = curve_targets(runs, "harmony", ["splitgp", "fedproto", "fedavg"])
    assert entry["above"]["met"] and entry["above"]["compared"] == ["fedproto", "splitgp"]
    worst = entry["above"]["worst"]
    assert worst["baseline"] == "fedproto" and worst["gap"]["mean"] == pytest.approx(0.02)
    assert worst["seeds"] == 3
    # at 50 % fallback: 0.5 + 0.2 + 0.06 = 0.76 against server-only 0.85: more than 2 points short
    assert entry["server_only"]["hybrid_at_half"] == pytest.approx(0.76)
    assert not entry["server_only"]["met"]
    lines = curve_target_lines("s", "harmony", entry, verdict)
    assert "closest `fedproto`" in lines[0] and "3 paired seeds" in lines[0] and lines[0].endswith("**met**")
    assert "76.0 vs 85.0 -> **not met**" in lines[1]


def test_a_baseline_ahead_at_one_rate_of_ten_to_fifty_percent_fails_the_curve_target():
    from harmony_mobile.bench.gate_report import curve_targets

    runs = [fake_run("harmony", s, 0.14) for s in range(3)]
    ahead = [fake_run("fedproto", s, 0.0) for s in range(3)]
    at = FALLBACK_GRID.index(0.4)  # a rate between the report's table columns
    for run in ahead:
        for row in run["gates"]["test"].values():
            row["curve"]["max_softmax"] = [
                v + (0.3 if i == at else 0.0) for i, v in enumerate(row["curve"]["max_softmax"])
            ]
    entry = curve_targets(runs + ahead, "harmony", ["fedproto"])
    assert not entry["above"]["met"]
    assert entry["above"]["worst"]["rate"] == 0.4 and entry["above"]["worst"]["gap"]["mean"] < 0
    assert entry["server_only"]["met"]  # 0.84 at 50 % against 0.85: within 2 points
    assert curve_targets(ahead, "harmony", ["fedproto"]) is None  # harmony has no curve


def test_a_split_baseline_with_fewer_than_two_paired_seeds_leaves_the_curve_target_not_met():
    from harmony_mobile.bench.gate_report import curve_target_lines, curve_targets

    runs = [fake_run("harmony", s, 0.2) for s in range(3)]
    runs += [fake_run("splitgp", s, 0.0) for s in range(3)]
    runs += [fake_run("fedproto", s, 0.0) for s in (0, 7, 8)]  # one seed in common
    entry = curve_targets(runs, "harmony", ["splitgp", "fedproto", "multi-exit"])
    # fedproto pairs one seed, multi-exit (a split method) did not run: neither is measured
    assert entry["above"]["unmeasured"] == ["fedproto", "multi-exit"] and not entry["above"]["met"]
    line = curve_target_lines("s", "harmony", entry, {True: "met", False: "not met"})[0]
    assert "fewer than 2 seeds paired with `harmony`: fedproto, multi-exit -> not met" in line


def test_logit_norm_makes_the_exit_loss_blind_to_the_logits_scale():
    from harmony_mobile.algorithms.base import exit_loss
    from harmony_mobile.models import FamilyModel

    torch.manual_seed(0)
    model = FamilyModel("cnn", 1, 28, 10)
    images, labels = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    plain, normed = exit_loss(model, images, labels, 1), exit_loss(model, images, labels, 1, 0.04)
    with torch.no_grad():
        last = model.exits["1"].mlp[-1]
        last.weight.mul_(10)
        last.bias.mul_(10)
    # growing the logits changes the plain CE; LogitNorm's loss stays (up to float rounding)
    assert not torch.isclose(exit_loss(model, images, labels, 1), plain)
    assert torch.isclose(exit_loss(model, images, labels, 1, 0.04), normed, rtol=1e-4)


def test_the_report_compares_harmonys_gate_scores_on_validation_and_test():
    from harmony_mobile.bench.gate_report import gate_score_table

    def row(shift: float, auroc: float) -> dict:
        curves = {
            "max_softmax": [0.5 + 0.4 * r + shift for r in FALLBACK_GRID],
            "prototype": [0.5 + 0.4 * r + shift + 0.02 for r in FALLBACK_GRID],
        }
        return {"curve": curves, "auroc": {"max_softmax": auroc, "prototype": auroc + 0.1}}

    runs = []
    for seed in range(2):
        val, test = row(0.01 * seed, 0.6), row(0.01 * seed - 0.05, 0.7)
        gates = {"val": {"p=0.2": val, "p=0.5": val}, "test": {"p=0.2": test, "p=0.5": test}}
        runs.append(
            {"setting": "s", "method": "harmony", "seed": seed, "gates": gates | {"exit_rule": "max_softmax"}}
        )
    text = "\n".join(gate_score_table({"runs": runs}, "s"))
    assert "(its own: `max_softmax`)" in text and "mean over 2 seeds" in text
    # 0.5 + 0.4 r + the seeds' mean shift 0.005 on validation, -0.045 on test; prototype 2 points higher
    assert "| max_softmax | val | 54.5 | 58.5 | 62.5 | 70.5 | 0.600 |" in text
    assert "| prototype | test | 51.5 | 55.5 | 59.5 | 67.5 | 0.800 |" in text
    assert gate_score_table({"runs": [{"setting": "s", "method": "harmony", "seed": 0}]}, "s") == []
    # a score only newer records have is left out rather than read from the records without it
    for on in ("val", "test"):
        newer = runs[0]["gates"][on]["p=0.2"] = runs[0]["gates"][on]["p=0.2"] | {}
        newer["curve"] = newer["curve"] | {"slot_margin": newer["curve"]["prototype"]}
    text = "\n".join(gate_score_table({"runs": runs}, "s"))
    assert "| prototype | test |" in text and "slot_margin" not in text


def test_a_study_that_names_no_split_baseline_states_only_the_server_only_target():
    from harmony_mobile.bench.gate_report import curve_target_lines, curve_targets

    runs = [fake_run("harmony", s, 0.2) for s in range(3)]
    for baselines in ([], ["fedavg"]):  # none, or none with a back-end
        entry = curve_targets(runs, "harmony", baselines)
        assert not entry["above"]["named"]
        lines = curve_target_lines("s", "harmony", entry, {True: "met", False: "not met"})
        assert len(lines) == 1 and "below its back-end answering everything" in lines[0]
    entry = curve_targets(runs, "harmony", ["multi-exit"])  # named, not run: still a verdict
    assert len(curve_target_lines("s", "harmony", entry, {True: "met", False: "not met"})) == 2
