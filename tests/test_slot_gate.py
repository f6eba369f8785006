"""The slot gate end to end on the in-process engine: the server's slot prototypes come from its
back-end and the replay set, each phone calibrates its threshold on them after every phone's
personalization, the evaluation exits by them, a saved run reads back the same gate; the engines
and the export that cannot run it refuse it."""

from __future__ import annotations

import pytest
import torch

from harmony_mobile import training
from harmony_mobile.algorithms.base import calibrate_client, calibrate_threshold, exit_score
from harmony_mobile.algorithms.registry import build_algorithm
from harmony_mobile.bench.saved_runs import load_finished_run
from harmony_mobile.evaluation import EvaluationSetting, client_answers, evaluate, predict
from tests.test_flower import tiny_config


@pytest.fixture(scope="module")
def slot_gate_run(tmp_path_factory):
    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("slot-gate") / "run"
    results = training.train(tiny_config("harmony", rounds=1), path, show_progress=False)
    return path, results


def test_each_phone_calibrates_on_the_slot_margin_and_exits_by_it(slot_gate_run):
    path, results = slot_gate_run
    run = load_finished_run(path)
    assert run.exit_rule == "slot_margin"
    target = build_algorithm("harmony").config.calibration_target
    by_max_softmax = []
    for client in run.clients:
        assert client.slot_gate is not None and client.slot_gate.own_slots.any()
        assert client.threshold == pytest.approx(results["thresholds"][client.name])
        with torch.no_grad():
            logits, features = client.model(client.val_x, client.split_depth)
        correct = logits.argmax(dim=1) == client.val_y
        margin = exit_score(client, logits, features, "slot_margin")
        assert client.threshold == pytest.approx(calibrate_threshold(margin, correct, target))
        softmax = exit_score(client, logits, features, "max_softmax")
        by_max_softmax.append(calibrate_threshold(softmax, correct, target))
    # the thresholds are on the margin: calibrated on max softmax they would be other numbers
    assert by_max_softmax != pytest.approx([c.threshold for c in run.clients])
    # the run's own evaluation exited by the gate: evaluating the read-back run gives its numbers
    setting = EvaluationSetting(run.images, run.labels, run.partition, run.seed, run.exit_rule)
    again = evaluate(run.clients, run.served, setting, client_answers(run.clients, run.served, run.images))
    assert again["summary"] == pytest.approx(results["summary"])
    client = run.clients[0]
    answers = predict(client, run.served, client.val_x, run.exit_rule)
    with torch.no_grad():
        _, features = client.model(client.val_x, client.split_depth)
    assert torch.equal(answers["exits"], client.slot_gate.score(features) >= client.threshold)


def test_calibration_waits_for_the_gate_and_scoring_without_it_is_an_error(slot_gate_run):
    client = load_finished_run(slot_gate_run[0]).clients[0]
    client.slot_gate, client.threshold = None, 0.123
    calibrate_client(client, 0.98, "slot_margin")
    assert client.threshold == 0.123  # left for training.finish_run, which has the prototypes
    logits, features = client.model(client.val_x[:2], client.split_depth)
    with pytest.raises(ValueError, match="no slot prototypes"):
        exit_score(client, logits, features, "slot_margin")


def test_the_exit_rule_is_the_methods_own_unless_configured():
    assert build_algorithm("harmony").exit_rule == "slot_margin"  # HARMONY's config sets its gate
    assert build_algorithm("harmony-max-softmax").exit_rule == "max_softmax"  # the gate's ablation
    assert build_algorithm("harmony-fixed-depth").exit_rule == "slot_margin"  # other ablations keep it
    with pytest.raises(ValueError, match="'harmony' is what 'harmony-slot-gate' was"):
        build_algorithm("harmony-slot-gate")
    assert build_algorithm("splitgp").exit_rule == "neg_entropy"
    assert build_algorithm("splitgp", {"exit_rule": "slot_margin"}).exit_rule == "slot_margin"
    assert build_algorithm("splitgp-restricted-slot-gate").exit_rule == "slot_margin"
    with pytest.raises(ValueError, match="exit_rule"):
        build_algorithm("harmony", {"exit_rule": "energy"})


def test_a_run_records_its_exit_rule_and_an_older_run_reads_back_the_one_it_trained_with(slot_gate_run):
    from harmony_mobile.algorithms.registry import exit_gate
    from harmony_mobile.run_dir import RunDir

    assert RunDir(slot_gate_run[0]).info.exit_rule == "slot_margin"
    assert exit_gate("harmony", {}, "slot_margin") == ("slot_margin", 0.98)
    # saved before runs recorded it: HARMONY then exited by max softmax unless its config said otherwise
    assert exit_gate("harmony", {}) == ("max_softmax", 0.98)
    assert exit_gate("harmony-fixed-depth", None)[0] == "max_softmax"
    assert exit_gate("harmony", {"exit_rule": "slot_margin"})[0] == "slot_margin"
    assert exit_gate("splitgp", {})[0] == "neg_entropy"
    assert exit_gate("fedavg")[0] == "max_softmax"


def test_a_slot_gate_variant_trains_with_its_methods_tuned_settings():
    from harmony_mobile.bench.profile import load_profile, parent_method

    assert parent_method("harmony-max-softmax") == "harmony"
    assert parent_method("splitgp-restricted-slot-gate") == "splitgp-restricted"
    profile = load_profile("fashion-variants")
    setting = profile.settings[0]
    tuned = {setting.name: {"harmony": {"lr": 0.01}}}  # the profile tunes per setting
    gate = profile.method_config("harmony-max-softmax", tuned, setting=setting)
    assert gate == profile.method_config("harmony", tuned, setting=setting) and gate["lr"] == 0.01
