"""The optional upload protections: randomized response, feature clipping + Gaussian noise and
their accounting, in training; and the slot table they feed."""

import math

import dp_accounting
import pytest
import torch
from dp_accounting import rdp

from harmony_mobile.algorithms.base import split_step
from harmony_mobile.privacy.feature_noise import (
    clip_rows,
    feature_privacy_report,
    gaussian_epsilon,
    privatize_features,
)
from harmony_mobile.privacy.label_dp import keep_probability, randomized_response
from harmony_mobile.privacy.options import UploadPrivacy
from harmony_mobile.protocol.slots import SlotTable, SlotTableFull
from harmony_mobile.training import TrainConfig, privacy_report
from tests.test_training import tiny_federation

torch.set_num_threads(1)


def test_randomized_response_keeps_with_the_stated_probability_and_spreads_the_rest_uniformly():
    labels = torch.full((40_000,), 3)
    noisy = randomized_response(labels, 1.0, 10, torch.Generator().manual_seed(0))
    keep = keep_probability(1.0, 10)
    assert keep == pytest.approx(math.e / (math.e + 9))
    assert (noisy == 3).float().mean().item() == pytest.approx(keep, abs=0.01)
    others = torch.bincount(noisy[noisy != 3], minlength=10).float()
    others = others[torch.arange(10) != 3]
    assert (others / others.sum() - 1 / 9).abs().max() < 0.02  # uniform over the other classes
    with pytest.raises(ValueError, match="finite number > 0"):
        randomized_response(labels, 0.0, 10)


def test_clipping_bounds_every_row_and_noise_has_the_stated_scale():
    features = torch.randn(64, 64, 8, 8) * 5
    clipped = clip_rows(features, 2.0)
    assert clipped.flatten(1).norm(dim=1).max() <= 2.0 + 1e-5
    small = torch.full((1, 4), 0.1)
    assert torch.equal(clip_rows(small, 2.0), small)  # rows inside the ball are untouched
    noised = privatize_features(features, 2.0, 1.5, torch.Generator().manual_seed(0)) - clipped
    assert noised.std().item() == pytest.approx(3.0, rel=0.02)
    assert torch.equal(privatize_features(features, None, None), features)
    with pytest.raises(ValueError, match="needs a clip norm"):
        UploadPrivacy(noise_multiplier=1.0)


def test_the_epsilon_is_the_maintained_accountants():
    accountant = rdp.RdpAccountant()
    accountant.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(2.0), 7))
    assert gaussian_epsilon(2.0, 7, 1e-5) == pytest.approx(accountant.get_epsilon(1e-5))
    assert gaussian_epsilon(2.0, 7) < gaussian_epsilon(2.0, 70)  # more releases, more epsilon
    assert gaussian_epsilon(2.0, 7, replace_one=True) > gaussian_epsilon(2.0, 7)
    off = feature_privacy_report(None, None, 10)
    assert off["epsilon"] is None and off["accountant"] is None


def test_training_with_the_options_uploads_clipped_noised_rows_and_reports_the_account():
    federation = tiny_federation(label_dp_epsilon=1.0, feature_clip=1.0, noise_multiplier=1.0)
    client, server = federation.clients[0], federation.server
    federation.broadcast(client)
    sent = []
    step = server.step
    server.step = lambda upload, update=True: sent.append(upload) or step(upload, update)
    images, labels = client.batch(32, torch.Generator().manual_seed(0))
    _, features = client.model(images, client.split_depth)
    split_step(client, server, features, labels, (client.split_depth,) * 32, 0, 1.0)
    (upload,) = sent
    noise = upload.features - clip_rows(features.detach(), 1.0)
    assert noise.std().item() == pytest.approx(1.0, rel=0.05)  # sigma * clip on every coordinate
    assert client.max_releases >= 1
    config = TrainConfig(label_dp_epsilon=1.0, feature_clip=1.0, noise_multiplier=1.0)
    report = privacy_report(config, max(c.max_releases for c in federation.clients), 10)
    assert report["label_dp_keep_probability"] == pytest.approx(keep_probability(1.0, 10))
    features_report = report["features"]
    assert features_report["max_releases_per_sample"] == client.max_releases
    assert features_report["epsilon"] == pytest.approx(gaussian_epsilon(1.0, client.max_releases))
    assert features_report["delta"] == 1e-5


def test_slot_table_assigns_in_first_appearance_order_up_to_its_capacity():
    a, b, c = b"a" * 8, b"b" * 8, b"c" * 8
    table = SlotTable("e-1", 2)
    assert table.slots([b, a, b]).tolist() == [0, 1, 0]
    assert table.known_slots([c, a]).tolist() == [-1, 1]
    with pytest.raises(SlotTableFull, match="already has 2 slots"):
        table.slot(c)
    assert SlotTable.from_hex("e-1", 2, table.to_hex()).tokens == [b, a]
    with pytest.raises(ValueError, match="16 lowercase hex"):
        SlotTable.from_hex("e-1", 2, ["ABCDEF0123456789"])
    with pytest.raises(ValueError, match="label epoch"):
        SlotTable("bad epoch!", 2)


def test_a_phones_dp_randomness_is_its_own_not_derived_from_the_shared_secret():
    """Two phones built alike (same secret, name, data) draw different noise and label-DP draws:
    a seed derived from the secret would let any phone, or a server colluding with one, redraw
    and subtract them."""
    a, b = (
        tiny_federation(label_dp_epsilon=0.5, feature_clip=1.0, noise_multiplier=1.0).clients[0]
        for _ in range(2)
    )
    assert a.federation_secret == b.federation_secret and a.name == b.name
    features = torch.zeros(16, 64, 8, 8)
    index = torch.arange(16)
    assert not torch.equal(a.release(features, index), b.release(features, index))
    assert not torch.equal(a._upload_labels, b._upload_labels)
