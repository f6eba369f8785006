"""The split step over Flower: a client's turn that needs the server in the middle of its local steps.

Flower's ServerApp speaks and the ClientApp answers; a ClientApp cannot call the server halfway
through `algorithm.client_round`. So the server drives the turn, one message per split step:

  server -> client   train.round: Broadcast + RNG state            (turn start)
  client -> server   FeatureUpload (+ whether the server updates)   (the turn's first split step)
  server -> client   InterfaceGradients of SplitTrainer.step(upload) (continue)
  client -> server   next FeatureUpload ... or, at the end, ClientUpdate + RNG state

The client does not keep a suspended Python frame between messages (a SuperNode may run every
message in a fresh process). It keeps the turn's start (broadcast, RNG states) and the server's
replies so far in Flower's `context.state`, and on each message re-runs `client_round` from the
start against `ReplayServer`, which answers the recorded steps and stops at the first new one.
The turn is deterministic given its start and the replies, which `ReplayServer` checks: a replayed
upload must hash to the one the server answered. Cost: a turn of S split steps computes
S (S + 1) / 2 client steps instead of S; fine for the few steps per round of phones, and the price
of running the registry's algorithms unchanged.
"""

from __future__ import annotations

import hashlib

from flwr.app import ConfigRecord, RecordDict

from harmony_mobile.flower.records import message_to_record, record_to_message
from harmony_mobile.protocol.messages import FeatureUpload, InterfaceGradients

TURN_PREFIX = "turn."  # context.state keys of the current turn
STEP_RECORD = "split-step"  # ConfigRecord of a split-step request: update flag and upload digest


class SplitStepNeeded(Exception):  # noqa: N818 (control flow, not an error)
    """Raised inside a replayed turn at its first split step the server has not answered yet."""

    def __init__(self, upload: FeatureUpload, update: bool, digest: str):
        super().__init__(f"split step of {upload.client_id} needs the server")
        self.upload, self.update, self.digest = upload, update, digest


class ReplayDivergedError(RuntimeError):
    """A replayed turn uploaded something else than the first time: the turn is not deterministic."""


def upload_digest(upload: FeatureUpload, update: bool) -> str:
    digest = hashlib.sha256(upload.features.detach().contiguous().numpy().tobytes())
    digest.update(b"".join(upload.label_tokens))
    digest.update(repr((upload.split_depths, update)).encode())
    return digest.hexdigest()


class ReplayServer:
    """Stands in for the SplitTrainer inside a client's turn on Flower (see the module docstring)."""

    def __init__(self, replies: list[InterfaceGradients], digests: list[str]):
        self.replies, self.digests, self.calls = replies, digests, 0

    def step(self, upload: FeatureUpload, update: bool = True) -> InterfaceGradients:
        index, digest = self.calls, upload_digest(upload, update)
        self.calls += 1
        if index < len(self.replies):
            if digest != self.digests[index]:
                raise ReplayDivergedError(f"{upload.client_id}: split step {index} differs on replay")
            return self.replies[index]
        raise SplitStepNeeded(upload, update, digest)

    def take_diagnostics(self) -> dict[str, float]:
        """None here: the server's own measurements are added to the client's metrics by the
        ServerApp when the turn ends (server_app.py), as the in-process round reads them then."""
        return {}


def step_request(needed: SplitStepNeeded) -> RecordDict:
    content = message_to_record(needed.upload)
    content[STEP_RECORD] = ConfigRecord({"update": needed.update, "digest": needed.digest})
    return content


def is_step_request(content: RecordDict) -> bool:
    return STEP_RECORD in content.config_records


def read_step_request(content: RecordDict) -> tuple[FeatureUpload, bool]:
    return record_to_message(content, FeatureUpload), bool(content.config_records[STEP_RECORD]["update"])


def is_continuation(content: RecordDict) -> bool:
    """A message that answers the client's pending split step (not a turn start)."""
    return content.config_records["message"]["type"] == InterfaceGradients.__name__


def save_turn_start(state: RecordDict, start: RecordDict) -> None:
    """A new turn: forget the previous one's replies, keep this turn's first message."""
    for key in [k for k in state if k.startswith(TURN_PREFIX)]:
        del state[key]
    for key, record in start.items():
        state[TURN_PREFIX + "start." + key] = record
    state[TURN_PREFIX + "steps"] = ConfigRecord({"digests": [""], "pending": ""})


def turn_start(state: RecordDict) -> RecordDict:
    prefix = TURN_PREFIX + "start."
    return RecordDict({k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)})


def set_pending(state: RecordDict, digest: str) -> None:
    state.config_records[TURN_PREFIX + "steps"]["pending"] = digest


def record_reply(state: RecordDict, reply: RecordDict) -> None:
    """Keep the server's answer to the pending split step, with the upload digest it answered."""
    steps = state.config_records[TURN_PREFIX + "steps"]
    if not steps["pending"]:
        raise ReplayDivergedError("server gradients arrived, but no split step is pending")
    digests = [d for d in steps["digests"] if d]
    for key, record in reply.items():
        state[f"{TURN_PREFIX}reply.{len(digests)}.{key}"] = record
    steps["digests"] = [*digests, steps["pending"]]
    steps["pending"] = ""


def recorded_steps(state: RecordDict) -> tuple[list[InterfaceGradients], list[str]]:
    digests = [d for d in state.config_records[TURN_PREFIX + "steps"]["digests"] if d]
    replies = []
    for index in range(len(digests)):
        prefix = f"{TURN_PREFIX}reply.{index}."
        record = RecordDict({k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)})
        replies.append(record_to_message(record, InterfaceGradients))
    return replies, digests
