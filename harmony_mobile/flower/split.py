"""The split step over Flower: a client's turn that needs the server in the middle of its local steps.

Flower's ServerApp speaks and the ClientApp answers; a ClientApp cannot call the server halfway
through `algorithm.client_round`. So the server drives the turn, one message per split step:

  server -> client   train.round: Broadcast + stream round         (turn start)
  client -> server   FeatureUpload (+ whether the server updates)   (the turn's first split step)
  server -> client   InterfaceGradients of SplitTrainer.step(upload) (continue)
  client -> server   next FeatureUpload ... or, at the end, ClientUpdate

The turn runs in a thread of the ClientApp's process (`LiveTurn`) that pauses at each split step
and continues when the server's answer arrives, if that message reaches the same process (the
Simulation Engine's actors, a long-lived ClientApp process): S split steps cost S client steps.

A SuperNode may instead run every message in a fresh process (a deployed SuperNode does), where
no paused thread survives. So the client also keeps the turn's start (broadcast, stream round) and
the server's replies so far in Flower's `context.state`, and a fresh process re-runs the turn from
the start against `ReplayServer`, which answers the recorded steps and pauses at the first new
one. The turn is deterministic given its start and the replies, which `ReplayServer` checks: a
replayed upload must hash to the one the server answered. There a turn of S split steps costs
S (S + 1) / 2 client steps: the price of running the registry's algorithms unchanged in a
process that keeps nothing between messages.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, ClassVar

from flwr.app import ConfigRecord, RecordDict

from harmony_mobile.federation.lockstep import PausableTurn
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
    """Stands in for the SplitTrainer inside a client's turn on Flower (see the module docstring):
    answers the recorded split steps, then hands each new one to `on_new_step` (by default it
    raises SplitStepNeeded)."""

    def __init__(
        self,
        replies: list[InterfaceGradients],
        digests: list[str],
        on_new_step: Callable[[SplitStepNeeded], InterfaceGradients] | None = None,
    ):
        self.replies, self.digests, self.calls = replies, digests, 0
        self.on_new_step = on_new_step

    def step(self, upload: FeatureUpload, update: bool = True) -> InterfaceGradients:
        index, digest = self.calls, upload_digest(upload, update)
        self.calls += 1
        if index < len(self.replies):
            if digest != self.digests[index]:
                raise ReplayDivergedError(f"{upload.client_id}: split step {index} differs on replay")
            return self.replies[index]
        needed = SplitStepNeeded(upload, update, digest)
        if self.on_new_step is None:
            raise needed
        return self.on_new_step(needed)

    def take_diagnostics(self, client_id: str) -> dict[str, float]:
        """None here: the server's own measurements are added to the client's metrics by the
        ServerApp when the turn ends (server_app.py), as the in-process round reads them then."""
        return {}


class LiveTurn(PausableTurn):
    """A client's split turn running in a thread of this process, paused at each new split step
    until the server's answer comes in the next message (see the module docstring). One process
    may serve several nodes whose turns are open at once (a round's clients run concurrently), so
    paused turns are kept per node, at most `MAX_PAUSED`: beyond that the oldest is ended and its
    node replays when its answer comes. The ClientApp calls `start`/`resume`, which return the
    turn's next event: a SplitStepNeeded (the turn is paused) or the turn's result."""

    MAX_PAUSED: ClassVar[int] = 64  # each holds a client's models; a round's turns of one process
    paused: ClassVar[dict[tuple[int, int], LiveTurn]] = {}

    def __init__(self, key: tuple[int, int], threads: int, turn: Any = None):
        super().__init__(name=f"turn-{key}", threads=threads)
        self.key = key
        self.turn = turn  # what the ClientApp needs when the turn ends (its algorithm, client, stream)
        self.pending = ""

    @classmethod
    def waiting_for(cls, key: tuple[int, int], digest: str) -> LiveTurn | None:
        """The paused turn of node `key` whose pending split step has this upload digest, if any."""
        turn = cls.paused.get(key)
        return turn if turn is not None and turn.pending == digest else None

    @classmethod
    def abandon_node(cls, key: tuple[int, int]) -> None:
        turn = cls.paused.pop(key, None)
        if turn is not None:
            turn.abandon()

    def start(self, body: Callable[[], Any]):
        LiveTurn.abandon_node(self.key)  # a node runs one turn at a time: a new start ends its old one
        return self._registered(super().start(body))

    def resume(self, gradients: InterfaceGradients):
        LiveTurn.paused.pop(self.key, None)
        return self._registered(self.answer(gradients))

    def _registered(self, event: tuple[str, Any]):
        """A paused turn joins the paused ones; either way, the event's value."""
        kind, value = event
        if kind == "step":
            self.pending = value.digest
            LiveTurn.paused[self.key] = self
            while len(LiveTurn.paused) > LiveTurn.MAX_PAUSED:
                LiveTurn.abandon_node(next(iter(LiveTurn.paused)))
        return value


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


def forget_turn(state: RecordDict) -> None:
    """The turn ended (its update went back): its start, with model weights, and the server's
    replies are not needed again, so a node's state does not grow with the turns it served."""
    for key in [k for k in state if k.startswith(TURN_PREFIX)]:
        del state[key]


def turn_start(state: RecordDict) -> RecordDict:
    prefix = TURN_PREFIX + "start."
    return RecordDict({k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)})


def set_pending(state: RecordDict, digest: str) -> None:
    state.config_records[TURN_PREFIX + "steps"]["pending"] = digest


def record_reply(state: RecordDict, reply: RecordDict) -> str:
    """Keep the server's answer to the pending split step, with the upload digest it answered;
    returns that digest."""
    steps = state.config_records[TURN_PREFIX + "steps"]
    if not steps["pending"]:
        raise ReplayDivergedError("server gradients arrived, but no split step is pending")
    digests = [d for d in steps["digests"] if d]
    for key, record in reply.items():
        state[f"{TURN_PREFIX}reply.{len(digests)}.{key}"] = record
    answered = str(steps["pending"])
    steps["digests"] = [*digests, answered]
    steps["pending"] = ""
    return answered


def recorded_steps(state: RecordDict) -> tuple[list[InterfaceGradients], list[str]]:
    digests = [d for d in state.config_records[TURN_PREFIX + "steps"]["digests"] if d]
    replies = []
    for index in range(len(digests)):
        prefix = f"{TURN_PREFIX}reply.{index}."
        record = RecordDict({k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)})
        replies.append(record_to_message(record, InterfaceGradients))
    return replies, digests
