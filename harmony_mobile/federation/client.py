"""A simulated phone: its personalized model, its own data, and the federation secret.

Client-side code may touch labels; nothing here is sent anywhere except through the message
types of messages.py. What a label becomes on the wire is decided here: a token of the class
name under the lineage's label epoch (after randomized response when label DP is on), next to
features that are clipped and noised when that option is on.

Model weights cross the boundary too (Broadcast, ClientUpdate) and leave the phone in exported
models. A class-indexed output layer in class order would show which classes a client holds and,
matched against its tokens or the server's slots, name them. So a client works in *token order*
throughout: its labels are exit indices, where index j is the class with the j-th smallest token
of the epoch (`protocol/label_tokens.exit_order`). Every model it trains, sends or exports is in
that order, which only federation members can undo (docs/PRIVACY.md).
"""

from __future__ import annotations

import functools
import secrets
from dataclasses import dataclass, field

import torch

from harmony_mobile.federation.slot_gate import SlotGate
from harmony_mobile.models import FamilyModel, Tier, parameter_names
from harmony_mobile.privacy.feature_noise import privatize_features
from harmony_mobile.privacy.label_dp import randomized_response
from harmony_mobile.privacy.options import UploadPrivacy
from harmony_mobile.protocol.label_tokens import class_tokens, epoch_key, exit_order, slot_classes
from harmony_mobile.protocol.messages import Broadcast, FeatureUpload

# HKDF once per (secret, epoch), not once per upload
cached_epoch_key = functools.lru_cache(maxsize=64)(epoch_key)


# Families whose training step runs faster with weights (hence activations) in channels_last: the
# depthwise and 1x1 convolutions of MobileNet blocks, 0.77x for a full-depth step on CPU (benchmarks/results/step_cost.md);
# the plain 3x3 convolutions of the others gain nothing. Same numbers up to float rounding; what
# is sent is made contiguous (`release`), and saved weights are read back by copying values.
CHANNELS_LAST_FAMILIES = frozenset({"mobilenet"})


@dataclass
class Client:
    client_id: int
    tier: Tier
    classes: tuple[int, ...]  # ID classes (data set ids); everything else is OOD for this client
    model: FamilyModel
    train_x: torch.Tensor
    train_y: torch.Tensor  # given as data set class ids, kept as exit indices (token order)
    val_x: torch.Tensor
    val_y: torch.Tensor  # likewise
    federation_secret: bytes  # provisioned at enrolment; never sent to the server
    label_epoch: str
    class_names: tuple[str, ...]  # the data set's class names: tokens are HMACs of these
    privacy: UploadPrivacy = field(default_factory=UploadPrivacy)
    threshold: float = 1.0
    slot_gate: SlotGate | None = None  # the slot_margin rule's, once the server's prototypes exist
    _last_batch: torch.Tensor | None = field(default=None, repr=False)
    _upload_labels: torch.Tensor | None = field(default=None, repr=False)
    _releases: torch.Tensor | None = field(default=None, repr=False)
    _noise: torch.Generator | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.tier.family in CHANNELS_LAST_FAMILIES:
            self.model.to(memory_format=torch.channels_last)
        self.train_y, self.val_y = self.exit_labels(self.train_y), self.exit_labels(self.val_y)
        self._releases = torch.zeros(len(self.train_y), dtype=torch.int64)
        # local randomness of this phone (randomized response, feature noise) from the OS CSPRNG:
        # derived from nothing another party holds (a secret shared by every phone would let any of
        # them, or a server colluding with one, redraw and undo it)
        self._noise = torch.Generator().manual_seed(secrets.randbits(63))
        self._upload_labels = self.train_y
        if self.privacy.label_dp_epsilon is not None:
            # one draw per sample, kept for every release (re-drawing would let a server average it out)
            self._upload_labels = randomized_response(
                self.train_y, self.privacy.label_dp_epsilon, len(self.class_names), self._noise
            )

    @functools.cached_property
    def exit_names(self) -> tuple[str, ...]:
        """The class name behind each exit index: the data set's names in token order."""
        return tuple(exit_order(cached_epoch_key(self.federation_secret, self.label_epoch), self.class_names))

    @functools.cached_property
    def _exit_of_class(self) -> torch.Tensor:
        position = {
            name: j for j, name in enumerate(self.exit_names)
        }  # from exit_names: the order is decided there only
        return torch.tensor([position[name] for name in self.class_names], dtype=torch.int64)

    def exit_labels(self, labels: torch.Tensor) -> torch.Tensor:
        """Data set class ids -> this federation's exit indices (the labels every model here learns)."""
        return self._exit_of_class[labels]

    @property
    def name(self) -> str:
        return f"client-{self.client_id:03d}"

    @property
    def split_depth(self) -> int:
        return self.tier.split_depth

    @property
    def max_releases(self) -> int:
        """How often the most-uploaded training sample has left this phone (for the DP accountant)."""
        return int(self._releases.max()) if len(self._releases) else 0

    def private_state(self) -> dict[str, torch.Tensor]:
        """What the phone keeps between rounds besides its model: how often each training sample
        left it (for the DP accountant) and its local noise stream. An engine that rebuilds the
        client per message (Flower) carries it over with these two methods."""
        return {
            "releases": self._releases.clone(),
            "noise": self._noise.get_state(),
            "upload_labels": self._upload_labels.clone(),  # label DP's draw is sticky per sample
        }

    def load_private_state(self, state: dict[str, torch.Tensor]) -> None:
        self._releases = state["releases"].clone()
        self._noise.set_state(state["noise"])
        self._upload_labels = state["upload_labels"].clone()

    def receive(self, broadcast: Broadcast) -> None:
        """Start from the meta-weights the server broadcast for this client's family."""
        if broadcast.family != self.tier.family:
            raise ValueError(
                f"{self.name} runs family {self.tier.family!r}, got meta-weights of {broadcast.family!r}"
            )
        self.model.load_state_dict(broadcast.meta_weights)

    def held_parameters(self, full: bool = False) -> dict[str, torch.nn.Parameter]:
        """The parameters this client holds (its depth's stages, exits, connectors; or the full model)."""
        names = parameter_names(self.model, self.split_depth, full=full)
        return {n: p for n, p in self.model.named_parameters() if n in names}

    def batch(self, size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """A training batch; the client remembers which samples it drew, for `upload`."""
        index = torch.randint(len(self.train_y), (size,), generator=generator)
        self._last_batch = index
        return self.train_x[index], self.train_y[index]

    def release(self, features: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """Features of training samples `index` as they may leave the phone: clipped and noised when
        those options are on, and counted for the DP accountant. Every feature row that leaves goes
        through here (uploads and the replay set)."""
        # what leaves the phone is contiguous (a model trained in channels_last makes its z
        # channels_last): the server trains on the same tensor in process as by wire
        sent = privatize_features(
            features.contiguous(), self.privacy.feature_clip, self.privacy.noise_multiplier, self._noise
        )
        self._releases.index_add_(0, index, torch.ones_like(index))
        return sent

    def upload(
        self, features: torch.Tensor, labels: torch.Tensor, depths: tuple[int, ...], round_id: int
    ) -> tuple[FeatureUpload, torch.Tensor]:
        """The FeatureUpload of features of the last batch, and the (clipped, noised) features as sent,
        still attached to the front-end's graph so the server's dL/dz can be back-propagated."""
        index = self._last_batch
        if index is None or len(index) != len(labels) or not torch.equal(self.train_y[index], labels):
            raise ValueError(f"{self.name} uploads only features of the batch it drew last")
        sent = self.release(features, index)
        names = [self.exit_names[int(y)] for y in self._upload_labels[index]]
        upload = FeatureUpload(
            client_id=self.name,
            round_id=round_id,
            label_epoch=self.label_epoch,
            features=sent.detach(),
            label_tokens=class_tokens(cached_epoch_key(self.federation_secret, self.label_epoch), names),
            split_depths=depths,
            family=self.tier.family,
            tier=self.tier.name,
            model_version=f"round-{round_id}",
        )
        return upload, sent

    def own_slots(self, slot_table: list[bytes]) -> torch.Tensor:
        """Which slots hold one of this client's classes (bool per slot), from its secret."""
        own_exits = self.exit_labels(torch.tensor(self.classes, dtype=torch.int64))
        return torch.isin(self.slot_to_class(slot_table), own_exits)

    def slot_to_class(self, slot_table: list[bytes]) -> torch.Tensor:
        """Exit index (this client's label) of each slot; -1: a slot none of its class names maps to."""
        key = cached_epoch_key(self.federation_secret, self.label_epoch)
        names = slot_classes(key, self.exit_names, slot_table)
        index = {name: j for j, name in enumerate(self.exit_names)}
        return torch.tensor([index[n] if n is not None else -1 for n in names], dtype=torch.int64)
