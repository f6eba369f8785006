"""The Flower ServerApp: family meta-weights, the back-end and the rounds, driven over a Grid.

It runs `harmony train`'s own steps (flower/run.py) with the client turns of a round sent as
messages to the SuperNodes that hold those clients. A round visits its sampled clients in the
same order and with the same randomness stream as the in-process engine (each client returns
the RNG state it leaves, the next one continues it), so the arithmetic is the same and the two
engines produce the same numbers.

A client that does not answer within `reply_timeout` (dead SuperNode, error in its ClientApp)
is left out of the round; the round proceeds if at least `min_replies` answered, otherwise the
run stops with its last checkpoint intact and a rerun resumes after it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

from harmony_mobile.files import open_private
from harmony_mobile.flower import split
from harmony_mobile.flower.client_app import (
    LINEAGE_RECORD,
    RELEASES_RECORD,
    RNG_RECORD,
    SERVED_RECORD,
    rng_record,
)
from harmony_mobile.flower.records import (
    message_to_record,
    record_to_message,
    record_to_tensor_dict,
    tensor_dict_to_record,
)
from harmony_mobile.flower.settings import FlowerSettings
from harmony_mobile.protocol.messages import Broadcast, ClientUpdate

log = logging.getLogger(__name__)
POLL_START, POLL_MAX = 0.02, 0.25  # seconds between pulls of the replies: doubling up to the max
TRANSPORT_LOG = "flower_rounds.jsonl"  # per round: replies, missing clients, bytes each way, seconds


def client_name(client_id: int) -> str:
    return f"client-{client_id:03d}"


class FlowerRunError(RuntimeError):
    """The federation cannot go on (too few nodes or replies); the last checkpoint stays valid."""


def record_bytes(content: RecordDict) -> int:
    return sum(record.count_bytes() for record in content.values())


@dataclass
class FlowerClients:
    """The server's view of the SuperNodes: which node holds which client, and traffic counters."""

    grid: Grid
    settings: FlowerSettings
    run: Any  # training.TrainingRun: the server's part of the run (no client in it)
    node_of_client: dict[int, int] = field(default_factory=dict)
    max_releases: dict[int, int] = field(default_factory=dict)  # per client, for the DP accountant
    bytes_sent: int = 0
    bytes_received: int = 0

    def connect(self, expected: int) -> None:
        """Ask each SuperNode which client (partition) it holds, as nodes appear during
        node_wait_timeout, each with reply_timeout to answer; done early once every client has a
        node. A SuperNode that died stays listed until the SuperLink marks it offline (two missed
        heartbeats, up to a minute) and never answers; its restarted successor does."""
        discover_until = time.monotonic() + self.settings.node_wait_timeout
        answer_until = 0.0
        asked: set[int] = set()
        waiting: set[str] = set()
        while len(self.node_of_client) < expected:
            now = time.monotonic()
            new = [n for n in self.grid.get_node_ids() if n not in asked] if now < discover_until else []
            if new:
                asked.update(new)
                hello = [Message(RecordDict(), dst_node_id=n, message_type="query.hello") for n in new]
                waiting |= set(self.grid.push_messages(hello))
                answer_until = now + self.settings.reply_timeout
            replies = list(self.grid.pull_messages(waiting)) if waiting else []
            waiting -= {reply.metadata.reply_to_message_id for reply in replies}
            for reply in replies:
                self.add_node(reply)
            if now >= discover_until and (not waiting or now >= answer_until):
                break
            time.sleep(POLL_MAX)
        if len(self.node_of_client) < self.settings.min_replies:
            raise FlowerRunError(
                f"{len(self.node_of_client)} SuperNodes answered (waited {self.settings.node_wait_timeout:g} s "
                f"for nodes); the run needs at least min_replies={self.settings.min_replies}"
            )
        log.info("%d of %d clients connected", len(self.node_of_client), expected)

    def add_node(self, reply: Message) -> None:
        if reply.has_error():
            log.warning("node %s: %s", reply.metadata.src_node_id, reply.error.reason)
            return
        partition = int(reply.content.config_records["node"]["partition-id"])
        if partition in self.node_of_client:
            raise FlowerRunError(f"two SuperNodes claim partition-id {partition}")
        self.node_of_client[partition] = reply.metadata.src_node_id

    def exchange(self, messages: list[Message]) -> list[Message]:
        """Grid.send_and_receive with a short poll: a deployed Grid's own polls every 3 s, which
        adds seconds to every split step. Returns when every message has its reply or after
        reply_timeout."""
        waiting = set(self.grid.push_messages(messages))
        deadline = time.monotonic() + self.settings.reply_timeout
        replies: list[Message] = []
        interval = POLL_START
        while waiting and time.monotonic() < deadline:
            time.sleep(interval)
            pulled = list(self.grid.pull_messages(waiting))
            replies += pulled
            waiting -= {reply.metadata.reply_to_message_id for reply in pulled}
            interval = min(interval * 2, POLL_MAX)
        return replies

    def ask(self, client_id: int, message_type: str, content: RecordDict, round_id: int) -> RecordDict | None:
        """One client's turn: the reply's content, or None when it does not come in time."""
        node = self.node_of_client.get(client_id)
        if node is None:
            return None
        message = Message(content, dst_node_id=node, message_type=message_type, group_id=str(round_id))
        self.bytes_sent += record_bytes(content)
        replies = self.exchange([message])
        if not replies or replies[0].has_error():
            reason = replies[0].error.reason if replies else "no reply in time"
            log.warning("client %d (node %d), %s: %s", client_id, node, message_type, reason)
            return None
        self.bytes_received += record_bytes(replies[0].content)
        return replies[0].content

    def lineage(self) -> ConfigRecord:
        return ConfigRecord({"label-epoch": self.run.label_epoch})

    def client_turn(
        self, federation, client_id: int, message_type: str, broadcast: Broadcast, generator: torch.Generator
    ) -> RecordDict | None:
        """Send a Broadcast and the round's RNG state, answer the client's split steps with the
        server's `step` (split.py), and on its final reply continue the RNG from the client's."""
        content = message_to_record(broadcast)
        content[RNG_RECORD] = rng_record(generator)
        content[LINEAGE_RECORD] = self.lineage()
        reply = self.ask(client_id, message_type, content, broadcast.round_id)
        while reply is not None and split.is_step_request(reply):
            upload, update = split.read_step_request(reply)
            if federation.server is None or upload.client_id != client_name(client_id):
                log.warning("client %d sent a split step it cannot send; left out", client_id)
                return None
            gradients = federation.server.step(upload, update=update)
            reply = self.ask(client_id, message_type, message_to_record(gradients), broadcast.round_id)
        if reply is not None:
            self.max_releases[client_id] = int(reply.config_records[RELEASES_RECORD]["max-releases"])
            states = record_to_tensor_dict(reply[RNG_RECORD])
            generator.set_state(states["generator"])
            torch.set_rng_state(states["torch"])
        return reply

    def client_count(self) -> int:
        return len(self.run.client_tiers)

    def train_round(self, client_ids: list[int], round_id: int, generator) -> list[ClientUpdate]:
        run = self.run
        federation, updates = run.federation, []
        for client_id in client_ids:
            family = run.client_tiers[client_id].family
            broadcast = Broadcast(round_id, family, federation.family_weights[family], f"round-{round_id}")
            reply = self.client_turn(federation, client_id, "train.round", broadcast, generator)
            if reply is not None:
                update = record_to_message(reply, ClientUpdate)
                if federation.server is not None:  # the server's measurements during this turn
                    metrics = {**update.metrics, **federation.server.take_diagnostics()}
                    update = dataclasses.replace(update, metrics=metrics)
                updates.append(update)
        if len(updates) < self.settings.min_replies:
            raise FlowerRunError(
                f"round {round_id}: {len(updates)} of {len(client_ids)} sampled clients replied, "
                f"fewer than min_replies={self.settings.min_replies}; the run stops at its last checkpoint"
            )
        return updates

    def personalize(self, run, generator: torch.Generator) -> list[int]:
        """Every client personalizes from its family's meta-weights and keeps the result; returns
        the ids of clients that did not answer."""
        missing = []
        for client_id, tier in enumerate(run.client_tiers):
            broadcast = Broadcast(-1, tier.family, run.federation.family_weights[tier.family], "round--1")
            if self.client_turn(run.federation, client_id, "train.personalize", broadcast, generator) is None:
                missing.append(client_id)
        return missing

    def evaluate(self, run, client_ids: list[int]) -> tuple[dict[str, dict], list[torch.Tensor]]:
        """Federated evaluation: each client scores its personalized model with the back-end the
        server sends and reports its metrics (and its replay rows); nothing else comes back."""
        content = RecordDict({LINEAGE_RECORD: self.lineage()})
        server = run.federation.server
        if server is not None:
            content[SERVED_RECORD] = tensor_dict_to_record(run.backend.state_dict())
            tokens = json.dumps([t.hex() for t in server.slot_table.tokens])
            content["slots"] = ConfigRecord({"tokens": tokens})
        reports, replay = {}, []
        for client_id in client_ids:
            reply = self.ask(client_id, "evaluate.final", content, -1)
            if reply is None:
                continue
            reports[client_name(client_id)] = json.loads(str(reply.config_records["metrics"]["json"]))
            self.max_releases[client_id] = int(reply.config_records[RELEASES_RECORD]["max-releases"])
            if "replay" in reply:
                replay.append(record_to_tensor_dict(reply["replay"])["features"])
        return reports, replay

    def after_round(self, round_id: int, sampled: int, replied: int, seconds: float) -> None:
        """flower_rounds.jsonl: replies and bytes each way of the round."""
        entry = {
            "round": round_id,
            "sampled": sampled,
            "replied": replied,
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "seconds": seconds,
        }
        with open_private(self.run.run_path / TRANSPORT_LOG, "a") as out:
            out.write(json.dumps(entry) + "\n")
        self.bytes_sent = self.bytes_received = 0


def make_server_app(settings: FlowerSettings | None = None) -> ServerApp:
    """A ServerApp; without `settings` it reads them from the run config (`flwr run`)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        from harmony_mobile.flower.run import train_on_grid

        run_settings = settings or FlowerSettings.from_run_config(dict(context.run_config))
        results = train_on_grid(grid, run_settings)
        log.info("finished: %s", results.get("summary"))

    return app


app = make_server_app()
