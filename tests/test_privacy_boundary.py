"""The server never receives a label: by its message types, by its entry points, and in a real round.

These tests fail if someone adds a label field to a message, gives a server entry point a
label parameter, or lets the server's results depend on anything but features and tokens.
"""

import copy
import dataclasses
import inspect
import typing

import pytest
import torch

from harmony_mobile.federation.client import cached_epoch_key
from harmony_mobile.federation.rounds import run_rounds
from harmony_mobile.federation.split_trainer import SplitTrainer
from harmony_mobile.protocol import messages
from harmony_mobile.protocol.label_tokens import class_token
from tests.test_training import tiny_federation

LABEL_WORDS = ("label", "target", "class_id", "y_true", "ground_truth")
TOKEN_FIELD = "label_tokens"  # the one allowed name: keyed HMACs, see protocol/label_tokens.py
EPOCH_FIELD = "label_epoch"  # the name of the key epoch, the same string for every row of a lineage


def looks_like_label(name: str) -> bool:
    return name not in (TOKEN_FIELD, EPOCH_FIELD) and (
        name in ("y", "labels") or any(word in name for word in LABEL_WORDS)
    )


def test_no_message_has_a_field_that_can_carry_labels():
    for message_type in (*messages.SERVER_BOUND, *messages.CLIENT_BOUND):
        hints = typing.get_type_hints(message_type)
        for field in dataclasses.fields(message_type):
            assert not looks_like_label(field.name), f"{message_type.__name__}.{field.name}"
        if EPOCH_FIELD in hints:
            assert hints[EPOCH_FIELD] is str
        if "label_tokens" in hints:
            assert hints["label_tokens"] == tuple[bytes, ...], (
                "tokens must stay opaque bytes, never class ids"
            )


def test_nothing_crosses_the_boundary_as_logits_or_a_gradient_wrt_logits():
    names = {f.name for t in (*messages.SERVER_BOUND, *messages.CLIENT_BOUND) for f in dataclasses.fields(t)}
    assert not any("logit" in name for name in names), names
    assert {t.__name__ for t in messages.SERVER_BOUND} == {"FeatureUpload", "ClientUpdate", "ReplayFeatures"}


def test_every_server_entry_point_takes_only_messages():
    allowed = (*messages.SERVER_BOUND, bool, int, str, torch.Tensor)
    for name, method in inspect.getmembers(SplitTrainer, inspect.isfunction):
        if name.startswith("_") or name == "load_state":  # load_state: the server's own checkpoint
            continue
        hints = typing.get_type_hints(method)
        for parameter in inspect.signature(method).parameters:
            if parameter == "self":
                continue
            assert not looks_like_label(parameter), f"SplitTrainer.{name}({parameter})"
            assert hints.get(parameter) in allowed, (
                f"SplitTrainer.{name}({parameter}: {hints.get(parameter)})"
            )


class RecordingServer:
    """Sits on the wire: checks and records every message, and hands the server a deep copy in
    which every integer field (the shape labels would take: int tensors, tuples of ints) is poisoned."""

    def __init__(self, server: SplitTrainer):
        self.server = server
        self.seen: list[object] = []

    def __getattr__(self, name):
        return getattr(self.server, name)

    def _poisoned(self, message):
        assert isinstance(message, messages.SERVER_BOUND), type(message)
        self.seen.append(message)
        message = copy.deepcopy(message)
        for field in dataclasses.fields(message):
            value = getattr(message, field.name)
            if isinstance(value, torch.Tensor) and not value.is_floating_point():
                object.__setattr__(message, field.name, torch.randint_like(value, 0, 10))
            if isinstance(value, tuple) and value and all(isinstance(v, int) for v in value):
                object.__setattr__(message, field.name, tuple(1 + (v * 7) % 3 for v in value))
        return message

    def step(self, upload, update=True):
        reply = self.server.step(self._poisoned(upload), update=update)
        assert isinstance(reply, messages.CLIENT_BOUND), type(reply)
        return reply


def exit_rows(weights: dict, order: list[int]) -> dict:
    """`weights` with the exit heads' class-indexed rows (last Linear of each head) put in `order`."""
    out = {}
    for name, value in weights.items():
        last_layer = name.startswith("exits.") and ".mlp.2." in name
        out[name] = value[order] if last_layer else value
    return out


def one_round(secret: bytes, initial: dict | None = None):
    """One round under `secret`, starting from `initial` meta-weights (None: the federation's own),
    in float64 (call it under `float64_models`): float32 rounding of the rows summed in another
    order, amplified by Adam on near-zero gradients, moves some weights by up to 6e-4, which a
    real dependency on the secret could hide in; in float64 that rounding is 1e-14."""
    federation = tiny_federation(seed=3, secret=secret)
    for client in federation.clients:
        client.train_x, client.val_x = client.train_x.double(), client.val_x.double()
    federation.server = RecordingServer(federation.server)
    if initial is not None:
        federation.family_weights = copy.deepcopy(initial)
    start = copy.deepcopy(federation.family_weights)
    run_rounds(federation, rounds=1, clients_per_round=len(federation.clients), seed=3, show_progress=False)
    return federation, start


def renaming(a, b) -> list[int]:
    """Row j under client `b`'s secret holds the class that row renaming[j] holds under `a`'s."""
    return [a.exit_names.index(name) for name in b.exit_names]


@pytest.fixture
def float64_models():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def test_a_round_depends_on_tokens_only_up_to_renaming_and_never_on_integer_fields(float64_models):
    reference, initial = one_round(b"A" * 32)
    probe = tiny_federation(seed=3, secret=b"B" * 32).clients[0]
    order = renaming(reference.clients[0], probe)
    assert order != sorted(order)  # the two secrets order the exit rows differently
    other_secret, _ = one_round(b"B" * 32, {f: exit_rows(w, order) for f, w in initial.items()})
    # every token changed (other secret) and every integer field on the wire was poisoned...
    first = reference.server.seen[0]
    assert isinstance(first, messages.FeatureUpload)
    assert first.label_tokens != other_secret.server.seen[0].label_tokens
    # ...yet the server learned the same thing: it uses tokens only as equivalence classes. Same up
    # to float rounding, not bit for bit: an exit head's matmul sums its rows in the other order.
    # (A different batch moves these weights by > 1e-3: the tolerance can fail.)
    for name, value in reference.server.server.backend.state_dict().items():
        assert torch.allclose(value, other_secret.server.server.backend.state_dict()[name], atol=1e-9), name
    # and the meta-weights are the same up to the secret order of class-indexed rows
    for family in reference.family_weights:
        ours = exit_rows(reference.family_weights[family], order)
        for name, value in ours.items():
            assert torch.allclose(value, other_secret.family_weights[family][name], atol=1e-9), name
    assert all(isinstance(m, messages.SERVER_BOUND) for m in reference.server.seen)


def test_a_client_learns_exit_indices_in_token_order_never_class_ids():
    client = tiny_federation().clients[0]
    names = client.exit_names
    assert sorted(names) == sorted(client.class_names) and list(names) != list(client.class_names)
    key = cached_epoch_key(client.federation_secret, client.label_epoch)
    tokens = [class_token(key, name) for name in names]
    assert tokens == sorted(tokens)
    # a training label is the exit index of its class name, under this secret only
    ids = torch.arange(len(client.class_names))
    assert [names[j] for j in client.exit_labels(ids)] == list(client.class_names)
    other = tiny_federation(secret=b"another-federation-secret-32byte").clients[0]
    assert not torch.equal(other.exit_labels(ids), client.exit_labels(ids))
