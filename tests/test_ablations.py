"""Each HARMONY ablation turns off exactly one mechanism: its config differs from HARMONY's in one
field, and that field gates the code path of the mechanism (and nothing else changes)."""

import re
from unittest import mock

import pytest
import torch

from harmony_mobile.algorithms.harmony import Harmony, variant_spread
from harmony_mobile.algorithms.registry import ALGORITHMS, RENAMED, build_algorithm
from harmony_mobile.federation.split_trainer import SplitTrainer
from tests.test_baselines import tiny_federation

# each variant: the one config field it changes and its value (ablations turn a mechanism off;
# the harmony-with-* variants turn on one that is off by default)
VARIANTS = {
    "harmony-with-meta": ("meta", True),
    "harmony-with-contrastive": ("contrastive_weight", 0.5),
    "harmony-fixed-depth": ("random_split_depth", False),
    "harmony-full-softmax": ("own_classes_only", False),
    "harmony-no-style-mixing": ("style_mixing", 0.0),
}


def one_round(name: str, client_index: int = 3, supcon: bool = True):
    """One client round of the flagship-tier client (depth 3) under `name`, after a mobilenet client's;
    returns what the server received, the server's softmax masks, the inner-loop calls and the round's
    metrics. `supcon`: with SupCon on (off by default), so that a switch shown to leave it running
    is shown to gate only its own mechanism."""
    # 6 local steps: 12 variant depths drawn, so a random split depth shows every depth 1..3
    overrides = {"local_steps": 6} | ({"contrastive_weight": 0.5} if supcon else {})
    federation = tiny_federation(name, overrides)
    client = federation.clients[client_index]
    federation.server.start_round(0)
    other = federation.clients[1]  # another family first: the server then has rows to align across
    federation.broadcast(other, 0)
    federation.algorithm.client_round(other, federation.server, 0, torch.Generator().manual_seed(4))
    federation.broadcast(client, 0)
    uploads, masks = [], []
    step, softmax_mask = SplitTrainer.step, SplitTrainer.softmax_mask

    def spy_step(server, upload, update=True):
        uploads.append(upload)
        return step(server, upload, update)

    def spy_mask(server, client_id):
        mask = softmax_mask(server, client_id)
        masks.append(mask)
        return mask

    with (
        mock.patch.object(SplitTrainer, "step", spy_step),
        mock.patch.object(SplitTrainer, "softmax_mask", spy_mask),
        mock.patch.object(
            Harmony, "_personalize_inner", autospec=True, side_effect=Harmony._personalize_inner
        ) as inner,
        mock.patch.object(
            SplitTrainer, "_contrastive_loss", autospec=True, side_effect=SplitTrainer._contrastive_loss
        ) as contrastive,
    ):
        update = federation.algorithm.client_round(
            client, federation.server, 0, torch.Generator().manual_seed(5)
        )
    return {
        "depths": {d for u in uploads for d in u.split_depths},
        "open_slots": [int((m == 0).sum()) for m in masks],
        "inner_calls": inner.call_count,
        "contrastive_calls": contrastive.call_count,
        "metrics": update.metrics,
        "client_slots": len(federation.server.client_slots(client.name)),
        "table": len(federation.server.slot_table),
        "style_rows": sum(len(rows) for rows in federation.server._style_bank.values()),
    }


@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_ablation_differs_from_harmony_in_exactly_one_config_field(name):
    harmony = build_algorithm("harmony", {"local_steps": 3}).config.model_dump()
    ablation = build_algorithm(name, {"local_steps": 3}).config.model_dump()
    differing = {k for k in harmony if harmony[k] != ablation[k]}
    field, value = VARIANTS[name]
    assert differing == {field} and ablation[field] == value
    assert ALGORITHMS[name][1] == {field: value}
    # the switch wins over a profile's config: an ablation cannot be turned back on by accident
    assert build_algorithm(name, {field: harmony[field]}).config.model_dump()[field] == value


def test_retired_names_are_refused_with_the_name_to_use():
    for old, message in RENAMED.items():
        with pytest.raises(ValueError, match=re.escape(message)):
            build_algorithm(old)
        named = set(re.findall(r"'([a-z-]+)'", message)) & set(ALGORITHMS)
        assert named, f"{old}: the message names no registered algorithm"


def test_a_setting_named_like_another_mechanism_is_refused_with_the_key_it_means():
    """Random split depth is not stochastic depth (dropping layers): the old key gets the new one."""
    with pytest.raises(ValueError, match="random_split_depth"):
        build_algorithm("harmony", {"stochastic_depth": False})
    assert build_algorithm("harmony", {"random_split_depth": False}).config.random_split_depth is False


@pytest.fixture(scope="module")
def harmony_round():
    return one_round("harmony")


def test_meta_gates_the_inner_loop_and_only_it(harmony_round):
    with_meta = one_round("harmony-with-meta")  # off by default: HARMONY's round has no inner loop
    assert with_meta["inner_calls"] > 0 and harmony_round["inner_calls"] == 0
    assert with_meta["metrics"]["path_norm"] > 0 and harmony_round["metrics"]["path_norm"] == 0
    # the other mechanisms run either way: variants at every depth, weight noise, SupCon, restricted CE
    assert with_meta["depths"] == harmony_round["depths"] == {1, 2, 3}
    for run in (with_meta, harmony_round):
        assert run["metrics"]["noise_norm"] > 0 and run["contrastive_calls"] > 0
        assert run["metrics"]["variant_spread"] > 0


def test_random_split_depth_gates_the_variant_depths_and_only_them(harmony_round):
    ablated = one_round("harmony-fixed-depth")
    assert harmony_round["depths"] == {1, 2, 3} and ablated["depths"] == {3}
    assert ablated["inner_calls"] == harmony_round["inner_calls"] and ablated["contrastive_calls"] > 0


def test_contrastive_weight_gates_the_server_supcon_and_only_it():
    default = one_round("harmony", supcon=False)  # off by default
    turned_on = one_round("harmony-with-contrastive", supcon=False)
    assert turned_on["contrastive_calls"] > 0 and default["contrastive_calls"] == 0
    assert "contrastive_grad_ratio" not in default["metrics"]
    assert turned_on["metrics"]["contrastive_grad_ratio"] > 0
    assert turned_on["depths"] == default["depths"] == {1, 2, 3}
    assert turned_on["inner_calls"] == default["inner_calls"]
    assert turned_on["open_slots"] == default["open_slots"]
    assert turned_on["style_rows"] > 0 and default["style_rows"] > 0


def test_own_classes_only_gates_the_restricted_softmax_and_only_it(harmony_round):
    ablated = one_round("harmony-full-softmax")
    # HARMONY's CE runs over the client's own slots, the ablation's over every slot of the table
    assert harmony_round["open_slots"][-1] == harmony_round["client_slots"]
    assert ablated["open_slots"][-1] == ablated["table"]
    assert ablated["contrastive_calls"] > 0 and ablated["depths"] == {1, 2, 3}


def test_style_mixing_gates_the_servers_feature_statistics_and_only_them(harmony_round):
    ablated = one_round("harmony-no-style-mixing")
    assert harmony_round["style_rows"] > 0 and ablated["style_rows"] == 0
    assert ablated["contrastive_calls"] > 0 and ablated["depths"] == {1, 2, 3}
    assert ablated["inner_calls"] == harmony_round["inner_calls"]


def test_the_round_measures_the_diversity_of_the_simulated_extractors():
    metrics = one_round("harmony-with-meta")["metrics"]  # with an inner loop, so a path to measure
    assert metrics["noise_norm"] > 0 and metrics["path_norm"] > 0
    assert metrics["path_to_noise"] == pytest.approx(metrics["path_norm"] / metrics["noise_norm"])
    assert metrics["contrastive_grad_ratio"] > 0


def test_variant_spread_is_zero_for_identical_variants_and_grows_with_their_difference():
    torch.manual_seed(0)
    features, labels = torch.randn(8, 4, 2, 2), torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    assert variant_spread([features, features.clone()], labels) == pytest.approx(0.0, abs=1e-6)
    shifted = features + 0.1
    far = features + 1.0
    assert 0 < variant_spread([features, shifted], labels) < variant_spread([features, far], labels)
