"""Label privacy against everything a server operator holds, not only the training messages.

The operator gets the server part of a finished run dir (everything but `clients/`) and the model
dir it serves, and knows the public class names. Each trial trains a tiny run under a fresh secret
and exports one tier. Without labeled data the checkpoint attack of bench/privacy_attacks.py
(inputs synthesized to fire each output of the checkpoint's meta front-end, run through the
served .pte) must name slots at chance: a random naming gets a slot right with probability 1/C,
so over T trials of C slots the count of right slots has mean T and variance <= T (fixed points
of random permutations). Bound tested: right <= T + 4 sqrt(T) + 1.

Mutation check: a mutant that ships class-ordered exit heads (the phones' artifacts re-ordered
before export, while the server's checkpoint stays token-ordered, as before token order) is named
well above the bound by the checkpoint attack (10 of 10 slots seen).
"""

from __future__ import annotations

import math
import shutil
import stat

import pytest
import torch
import yaml
from harmony_mobile.export.pipeline import export_run

from harmony_mobile.bench.privacy_attacks import (
    OperatorView,
    checkpoint_naming,
    named_right,
)
from harmony_mobile.models.tiers import load_tiers
from harmony_mobile.run_dir import CLIENT_PART, RunDir, save_client
from harmony_mobile.training import TrainConfig, train

TIER = "flagship"
SEEDS = (11, 12)
CONFIG = {"local_steps": 4, "personalize_epochs": 1}


def served_tiers_file(root) -> str:
    """The built-in tiers with the attacked tier exported as the one variant the attack reads (its
    fp32 .pte): the int8 and Core ML variants cost most of an export and play no part here."""
    tiers = load_tiers().model_dump(mode="json")
    for tier in tiers["tiers"]:
        if tier["name"] == TIER:
            tier.update(quantization=["fp32"], backends=["xnnpack"])
    path = root / "tiers.yaml"
    path.write_text(yaml.safe_dump(tiers))
    return str(path)


def trial(root, seed: int):
    """(operator view, truth per slot, run) of one tiny trained and exported run."""
    config = TrainConfig(
        dataset="digits",
        dataset_limit=900,
        clients_per_tier=1,
        rounds=3,
        seed=seed,
        algorithm_config=CONFIG,
        tiers_file=served_tiers_file(root),
    )
    train(config, root / "run", show_progress=False)
    return served(root)


def served(root):
    """Export root/run's attacked tier to root/model; the operator view of it and its server part."""
    export_run(
        root / "run",
        root / "model",
        tiers=[TIER],
        key_dir=root / "keys",
        progress=False,
        latency_runs=1,
        test_samples=32,
        allow_failed_variants=True,  # 32 gate images cannot resolve the int8 gate; this test reads the back-end
    )
    server_part = root / "server-part"
    shutil.copytree(root / "run", server_part, ignore=shutil.ignore_patterns(CLIENT_PART))
    run = RunDir(root / "run")
    return OperatorView.load(root / "model", server_part, TIER), run.slot_to_class(), run


def to_class_order(run: RunDir) -> None:
    """Mutant: every client artifact's exit heads re-ordered from token order to class order."""
    exit_of_class = run.exit_labels(torch.arange(run.info.num_classes))
    for artifact in run.clients():
        state = artifact.front_end_state
        assert any(name.startswith("exit_head.mlp.2.") for name in state)  # the mutant has teeth
        for name in state:
            if name.startswith("exit_head.mlp.2."):
                state[name] = state[name][exit_of_class]
        save_client(run.path, artifact)


@pytest.fixture(scope="module")
def trials(tmp_path_factory):
    return [trial(tmp_path_factory.mktemp(f"trial{seed}"), seed) for seed in SEEDS]


def chance_bound(trials: int) -> float:
    return trials + 4 * math.sqrt(trials) + 1


def test_the_server_part_holds_no_secret_no_client_and_nothing_world_readable(trials):
    _, _, run = trials[0]
    server_files = [p for p in run.path.rglob("*") if CLIENT_PART not in p.relative_to(run.path).parts]
    secret = run.federation_secret()
    for path in server_files:
        assert path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO) == 0, path
        if path.is_file():
            assert secret not in path.read_bytes(), path
    assert "client_classes" not in (run.path / "run.json").read_text()


def test_without_labeled_data_the_checkpoint_matched_to_the_served_pte_names_slots_at_chance(trials):
    right = seen = 0
    for view, truth, run in trials:
        r, s = named_right(checkpoint_naming(view, run.path.parent / "server-part", TIER), truth)
        right, seen = right + r, seen + s
    assert right <= chance_bound(len(trials)), (right, seen)


def test_mutation_class_ordered_exit_heads_in_the_export_give_the_slots_away(trials, tmp_path):
    """The first trial's trained run, copied, mutated and exported again."""
    shutil.copytree(trials[0][2].path, tmp_path / "run")
    to_class_order(RunDir(tmp_path / "run"))
    view, truth, _ = served(tmp_path)
    right, seen = named_right(checkpoint_naming(view, tmp_path / "server-part", TIER), truth)
    assert right > chance_bound(1), (right, seen)


def test_the_server_part_does_not_give_away_which_classes_each_client_holds(trials):
    """run.json publishes the seed; if the split were a function of it, the server would recompute
    which classes each family holds and, with the slots each client uploads to, narrow every slot
    down to a few classes without an image (a red team did). The split is keyed with the phones'
    secret (training.partition_seed): the server's recomputation must miss."""
    from harmony_mobile.data.partition import make_partition

    _, _, run = trials[0]
    config = TrainConfig(**run.info.train_config)
    families = [t.family for t in run.info.tiers.tiers for _ in range(config.clients_per_tier)]
    labels = run.dataset().labels.numpy()
    public = make_partition(config.partition, labels, len(families), config.seed, client_families=families)
    actual = [tuple(c.classes) for c in run.clients()]
    assert [tuple(s.classes) for s in public.clients] != actual
