"""The server's slot table: which output of the back-end g stands for which label token.

Within one label epoch a token is a secret relabeling of one class (protocol/label_tokens.py). The
server gives each token it sees a slot, in order of first appearance, up to the number of outputs
of g (= the number of classes), and trains g over slots. It never learns which class a slot is;
a phone does, by computing the token of every class name it knows (`slot_classes`).

Serialized as a JSON list of lowercase 16-hex-character tokens, slot i at index i
(docs/PROTOCOL.md: slot table).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from harmony_mobile.protocol.label_tokens import TOKEN_BYTES, check_label_epoch, parse_slot_table


class SlotTableFull(ValueError):
    """More distinct tokens than g has outputs: more classes than the lineage was built for, or
    tokens of another epoch or another federation secret mixed into this one."""


class SlotTable:
    def __init__(self, label_epoch: str, capacity: int, tokens: Iterable[bytes] = ()):
        self.label_epoch = check_label_epoch(label_epoch)
        if capacity < 1:
            raise ValueError(f"a slot table needs at least one slot, got capacity {capacity}")
        self.capacity = capacity
        self.tokens: list[bytes] = []
        self._slot_of: dict[bytes, int] = {}
        for token in tokens:
            self.slot(token)
        if len(self.tokens) != len(self._slot_of):
            raise ValueError("a slot table lists every token once")

    def __len__(self) -> int:
        return len(self.tokens)

    def slot(self, token: bytes) -> int:
        """The token's slot, assigned now if the token is new."""
        token = bytes(token)
        if len(token) != TOKEN_BYTES:
            raise ValueError(f"a label token is {TOKEN_BYTES} bytes, got {len(token)}")
        if token in self._slot_of:
            return self._slot_of[token]
        if len(self.tokens) >= self.capacity:
            raise SlotTableFull(
                f"label epoch {self.label_epoch!r} already has {self.capacity} slots (one per output of the "
                "back-end); a new token means another epoch's or another federation's tokens were uploaded"
            )
        self._slot_of[token] = len(self.tokens)
        self.tokens.append(token)
        return self._slot_of[token]

    def slots(self, tokens: Iterable[bytes]) -> torch.Tensor:
        """Slot index per row (int64), assigning slots to new tokens."""
        return torch.tensor([self.slot(token) for token in tokens], dtype=torch.int64)

    def known_slots(self, tokens: Iterable[bytes]) -> torch.Tensor:
        """Slot index per row, -1 for a token without a slot (nothing is assigned)."""
        return torch.tensor([self._slot_of.get(bytes(t), -1) for t in tokens], dtype=torch.int64)

    def to_hex(self) -> list[str]:
        return [token.hex() for token in self.tokens]

    @classmethod
    def from_hex(cls, label_epoch: str, capacity: int, tokens: Iterable[str]) -> SlotTable:
        return cls(label_epoch, capacity, parse_slot_table(tokens))

    def copy(self) -> SlotTable:
        return SlotTable(self.label_epoch, self.capacity, self.tokens)
