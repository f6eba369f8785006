"""The final evaluation's answer caches: the same answers as a direct forward pass (features up to
float rounding: a convolution may sum in another order for another batch size), each image computed
once however many measurements ask for it."""

import numpy as np
import pytest
import torch

from harmony_mobile.data import load_dataset
from harmony_mobile.data.partition import make_partition
from harmony_mobile.evaluation import BackendWithSlots, ClientAnswers, predict
from harmony_mobile.models import Backend, InterfaceSpec, load_tiers
from harmony_mobile.protocol.label_tokens import class_tokens, epoch_key
from harmony_mobile.training import TrainConfig, build_clients

SECRET, EPOCH = b"S" * 32, "e-test"


@pytest.fixture(scope="module")
def federation():
    torch.manual_seed(0)
    dataset = load_dataset("digits")
    tiers = load_tiers().with_input_shape(dataset.input_shape)
    partition = make_partition("dirichlet", dataset.labels.numpy(), 12, 0, alpha=0.3)
    clients = build_clients(
        TrainConfig(clients_per_tier=3), tiers, dataset, partition, InterfaceSpec(), SECRET, EPOCH
    )
    served = BackendWithSlots(
        Backend(InterfaceSpec(), 10).eval(), list(class_tokens(epoch_key(SECRET, EPOCH), dataset.class_names))
    )
    for client in clients:
        client.threshold = 0.5  # some samples exit, some fall back
    return dataset, clients, served


def overlapping_requests(n_images: int) -> list[np.ndarray]:
    """Index sets as the measurements ask them: overlapping, unsorted, one with a repeated image."""
    rng = np.random.default_rng(0)
    first = rng.choice(n_images, 60, replace=False)
    return [first, np.concatenate([first[:30], rng.choice(n_images, 40, replace=False)]), first[[5, 5, 9]]]


def test_cached_answers_match_a_direct_forward_pass_for_every_request(federation):
    dataset, clients, served = federation
    for client in clients[::3]:  # one client of each tier
        answers = ClientAnswers(client, served, dataset.images)
        for index in overlapping_requests(len(dataset.images)):
            direct = predict(client, served, dataset.images[index])
            cached = answers.predict(index)
            assert direct.keys() == cached.keys()
            for key in direct:
                assert torch.equal(direct[key], cached[key]), key
            features = client.model(dataset.images[index], client.split_depth)[1]
            assert torch.allclose(answers.split(index).features, features, rtol=1e-5, atol=1e-6)


def test_each_image_is_answered_once_however_often_it_is_asked(federation, monkeypatch):
    dataset, clients, served = federation
    client = clients[0]
    computed = []
    forward = type(client.model).forward

    def counting_forward(model, images, depth):
        computed.append(len(images))
        return forward(model, images, depth)

    monkeypatch.setattr(type(client.model), "forward", counting_forward)
    answers = ClientAnswers(client, served, dataset.images)
    requests = overlapping_requests(len(dataset.images))
    for index in requests * 2:
        answers.predict(index)
    assert sum(computed) == len(np.unique(np.concatenate(requests)))


def test_a_method_without_a_back_end_answers_with_its_full_model(federation):
    dataset, clients, _ = federation
    client = clients[0]
    answers = ClientAnswers(client, None, dataset.images)
    index = overlapping_requests(len(dataset.images))[1]
    direct, cached = predict(client, None, dataset.images[index]), answers.predict(index)
    assert all(torch.equal(direct[key], cached[key]) for key in direct) and direct.keys() == cached.keys()
    with pytest.raises(ValueError, match="no split answers"):
        answers.split(index)


def test_an_empty_request_gets_empty_answers_first_or_later(federation):
    dataset, clients, served = federation
    empty = np.array([], dtype=np.int64)
    for backend in (served, None):
        answers = ClientAnswers(clients[0], backend, dataset.images)
        assert all(len(v) == 0 for v in answers.predict(empty).values())
        answers.predict(np.array([3, 1]))
        assert all(len(v) == 0 for v in answers.predict(empty).values())


def test_another_clients_answers_are_refused(federation):
    from harmony_mobile.evaluation import EvaluationSetting, evaluate_client_at

    dataset, clients, served = federation
    setting = EvaluationSetting(dataset.images, dataset.labels, None, 0)
    with pytest.raises(ValueError, match="not .*'s with this back-end"):
        evaluate_client_at(clients[0], served, setting, ClientAnswers(clients[1], served, dataset.images))
