"""The Flower ServerApp: family meta-weights, the back-end and the rounds, driven over a Grid.

`train_on_grid` runs `harmony train`'s own steps (training.py) with the client turns of a round
sent as messages to the SuperNodes that hold those clients. Each turn draws from its own random stream
(rounds.seed_turn of the run's seed, the round and the client), which the ClientApp derives
itself, so turns are independent: a round's messages go out at once and the clients train
concurrently, yet the arithmetic is the in-process engine's and so are the numbers. A split
method's server learns from each upload, so in a training round its turns run in lockstep
(federation/lockstep.py): the ServerApp answers step k of every open turn, in the round's order,
once all have sent it; the clients compute between steps at once.

A client that does not answer within `reply_timeout` (dead SuperNode, error in its ClientApp)
is left out of the round; the round proceeds if at least `min_replies` answered, otherwise the
run stops with its last checkpoint intact and a rerun resumes after it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

from harmony_mobile.algorithms.registry import build_algorithm
from harmony_mobile.evaluation import summarize
from harmony_mobile.federation.rounds import personalization_round
from harmony_mobile.federation.slot_gate import slot_prototypes
from harmony_mobile.files import open_private
from harmony_mobile.flower import split
from harmony_mobile.flower.client_app import (
    LINEAGE_RECORD,
    PROTOTYPES_RECORD,
    RELEASES_RECORD,
    SERVED_RECORD,
    STREAM_RECORD,
)
from harmony_mobile.flower.records import (
    message_to_record,
    record_to_message,
    record_to_tensor_dict,
    tensor_dict_to_record,
)
from harmony_mobile.flower.settings import FlowerSettings
from harmony_mobile.protocol.messages import Broadcast, ClientUpdate
from harmony_mobile.training import (
    TrainConfig,
    finish_server,
    start_run,
    train_rounds,
    write_final_metrics,
)

log = logging.getLogger(__name__)
POLL_START, POLL_MAX = 0.02, 0.25  # seconds between pulls of the replies: doubling up to the max
DIAGNOSTICS_RECORD = "server-diagnostics"  # ServerApp only: added to a turn's reply, never sent
TRANSPORT_LOG = "flower_rounds.jsonl"  # per round: replies, missing clients, bytes each way, seconds


def client_name(client_id: int) -> str:
    return f"client-{client_id:03d}"


class FlowerRunError(RuntimeError):
    """The federation cannot go on (too few nodes or replies); the last checkpoint stays valid."""


def record_bytes(content: RecordDict) -> int:
    return sum(record.count_bytes() for record in content.values())


# a turn to run: (client id, message type, its first message's content, built when it is sent)
TurnStart = tuple[int, str, Callable[[], RecordDict]]


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

    def run_turns(
        self, federation, starts: list[TurnStart], round_id: int, lockstep: bool = False
    ) -> dict[int, RecordDict]:
        """Send the turns' first messages at once, as Flower's Message-API strategies do (at most
        max_in_flight outstanding: a message is built when it is sent, so the ServerApp and the
        SuperLink hold that many copies of a model, not one per client), and answer each
        split-step request with the server's `step`: as it comes, or with `lockstep` once every
        open turn has sent one, in the order of `starts` (federation/lockstep.py). Returns each
        client's final reply; a client whose message fails or finds no reply within reply_timeout
        is left out. Polls with a short interval: a deployed Grid's own send_and_receive polls
        every 3 s, which adds seconds to every split step."""
        queued = list(starts)
        order = [client_id for client_id, _, _ in starts]
        open_turns = {c for c in order if c in self.node_of_client}  # started or queued, not ended
        waiting: dict[str, tuple[int, str, float]] = {}
        held: dict[int, tuple[str, RecordDict]] = {}  # lockstep: step requests of the current tick
        finals: dict[int, RecordDict] = {}
        interval = POLL_START
        while queued or waiting:
            free = self.settings.max_in_flight - len(waiting)
            self.push([(c, t, build()) for c, t, build in queued[:free]], round_id, waiting)
            del queued[: max(free, 0)]
            now = time.monotonic()
            for message_id in [m for m, (_, _, deadline) in waiting.items() if now >= deadline]:
                client_id, message_type, _ = waiting.pop(message_id)
                open_turns.discard(client_id)
                log.warning("client %d, %s: no reply in time", client_id, message_type)
            if waiting:
                time.sleep(interval)
                pulled = list(self.grid.pull_messages(list(waiting)))
                interval = POLL_START if pulled else min(interval * 2, POLL_MAX)
                for reply in pulled:
                    self.take_reply(reply, waiting, held, finals, open_turns)
            if not lockstep or (held and open_turns <= set(held)):
                ready = [(c, *held.pop(c)) for c in order if c in held]
                self.push(self.answer_steps(federation, ready, open_turns), round_id, waiting)
        return finals

    def take_reply(self, reply: Message, waiting: dict, held: dict, finals: dict, open_turns: set) -> None:
        """File one pulled reply: an error ends its turn, a split-step request waits in `held`, a
        final reply ends the turn with its content."""
        client_id, message_type, _ = waiting.pop(reply.metadata.reply_to_message_id)
        if reply.has_error():
            log.warning("client %d, %s: %s", client_id, message_type, reply.error.reason)
            open_turns.discard(client_id)
            return
        self.bytes_received += record_bytes(reply.content)
        if split.is_step_request(reply.content):
            held[client_id] = (message_type, reply.content)
        else:
            finals[client_id] = reply.content
            open_turns.discard(client_id)

    def answer_steps(
        self, federation, ready: list[tuple[int, str, RecordDict]], open_turns: set[int]
    ) -> list[tuple[int, str, RecordDict]]:
        """The server's answers to split-step requests, in the given order. A request a client may
        not send gets none: that client is left out, and its turn no longer holds up a tick."""
        answers = []
        for client_id, message_type, request in ready:
            answer = self.answer_step(federation, client_id, request)
            if answer is None:
                open_turns.discard(client_id)
            else:
                answers.append((client_id, message_type, answer))
        return answers

    def push(
        self,
        sends: list[tuple[int, str, RecordDict]],
        round_id: int,
        waiting: dict[str, tuple[int, str, float]],
    ) -> None:
        messages, senders = [], []
        for client_id, message_type, content in sends:
            node = self.node_of_client.get(client_id)
            if node is None:
                continue
            messages.append(
                Message(content, dst_node_id=node, message_type=message_type, group_id=str(round_id))
            )
            senders.append((client_id, message_type))
            self.bytes_sent += record_bytes(content)
        if not messages:
            return
        message_ids = self.grid.push_messages(messages)
        deadline = time.monotonic() + self.settings.reply_timeout
        for message_id, (client_id, message_type) in zip(message_ids, senders, strict=True):
            waiting[message_id] = (client_id, message_type, deadline)

    def answer_step(self, federation, client_id: int, request: RecordDict) -> RecordDict | None:
        """The server's half of one split step; None (the client is left out) when the request is
        not one this client may send."""
        upload, update = split.read_step_request(request)
        if federation.server is None or upload.client_id != client_name(client_id):
            log.warning("client %d sent a split step it cannot send; left out", client_id)
            return None
        return message_to_record(federation.server.step(upload, update=update))

    def lineage(self) -> ConfigRecord:
        return ConfigRecord({"label-epoch": self.run.label_epoch})

    def family_turn_start(self, client_id: int, round_id: int, stream_round: int) -> RecordDict:
        """A turn's first message: the Broadcast of the client's family meta-weights (round -1:
        personalization), the label epoch and which round's random stream the client draws from
        (its own: rounds.seed_turn of the run's seed, that round, itself)."""
        family = self.run.client_tiers[client_id].family
        weights = self.run.federation.family_weights[family]
        content = message_to_record(Broadcast(round_id, family, weights, f"round-{round_id}"))
        content[STREAM_RECORD] = ConfigRecord({"round": stream_round})
        content[LINEAGE_RECORD] = self.lineage()
        return content

    def turns(
        self, federation, starts: list[TurnStart], round_id: int, training: bool = False
    ) -> dict[int, RecordDict]:
        """A training round's (or personalization's) turns, all at once. A split method's server
        learns from the uploads of a training round, so those turns run in lockstep (rounds.py),
        and its measurements on a client's uploads go with that client's update. (In
        personalization it answers without learning: any order gives the same numbers.)"""
        learns = federation.server is not None and training
        if learns and len(starts) > self.settings.max_in_flight:
            raise FlowerRunError(
                f"a split method runs a round's {len(starts)} sampled clients in lockstep, all at "
                f"once: max-in-flight ({self.settings.max_in_flight}) must be at least that many"
            )
        finals = self.run_turns(federation, starts, round_id, lockstep=learns)
        for client_id, reply in finals.items():
            self.max_releases[client_id] = int(reply.config_records[RELEASES_RECORD]["max-releases"])
            if learns:
                measured = federation.server.take_diagnostics(client_name(client_id))
                reply[DIAGNOSTICS_RECORD] = ConfigRecord(measured)
        return finals

    def client_count(self) -> int:
        return len(self.run.client_tiers)

    def train_round(self, client_ids: list[int], round_id: int, seed: int) -> list[ClientUpdate]:
        federation = self.run.federation
        starts = [
            (i, "train.round", partial(self.family_turn_start, i, round_id, round_id)) for i in client_ids
        ]
        finals = self.turns(federation, starts, round_id, training=True)
        updates = []
        for client_id in client_ids:
            if client_id not in finals:
                continue
            reply = finals[client_id]
            update = record_to_message(reply, ClientUpdate)
            if DIAGNOSTICS_RECORD in reply:  # the server's measurements during this turn
                update = dataclasses.replace(
                    update, metrics={**update.metrics, **dict(reply[DIAGNOSTICS_RECORD])}
                )
            updates.append(update)
        if len(updates) < self.settings.min_replies:
            raise FlowerRunError(
                f"round {round_id}: {len(updates)} of {len(client_ids)} sampled clients replied, "
                f"fewer than min_replies={self.settings.min_replies}; the run stops at its last checkpoint"
            )
        return updates

    def personalize(self, run) -> list[int]:
        """Every client personalizes from its family's meta-weights and keeps the result; returns
        the ids of clients that did not answer."""
        stream_round = personalization_round(run.config.rounds)
        starts = [
            (i, "train.personalize", partial(self.family_turn_start, i, -1, stream_round))
            for i in range(len(run.client_tiers))
        ]
        finals = self.turns(run.federation, starts, -1)
        return [client_id for client_id in range(len(run.client_tiers)) if client_id not in finals]

    def evaluate(self, run, client_ids: list[int]) -> tuple[dict[str, dict], list[torch.Tensor]]:
        """Federated evaluation: each client scores its personalized model with the back-end the
        server sends and reports its metrics (and its replay rows); nothing else comes back. All
        clients at once (no server step). A slot-gated run collects the replay rows first
        (evaluate.replay) and sends the slot prototypes it makes from them with the back-end."""
        content = RecordDict({LINEAGE_RECORD: self.lineage()})
        server = run.federation.server
        replay = []
        if server is not None:
            content[SERVED_RECORD] = tensor_dict_to_record(run.backend.state_dict())
            tokens = json.dumps([t.hex() for t in server.slot_table.tokens])
            content["slots"] = ConfigRecord({"tokens": tokens})
        rule = build_algorithm(run.config.algorithm, run.config.algorithm_config).exit_rule
        if server is not None and rule == "slot_margin":
            replay = self.replay_shares(run, client_ids)
            pooled = torch.cat(replay).to(torch.float16)
            prototypes = slot_prototypes(run.backend.eval(), len(server.slot_table.tokens), pooled)
            content[PROTOTYPES_RECORD] = tensor_dict_to_record({"prototypes": prototypes})
        finals = self.run_turns(
            run.federation, [(i, "evaluate.final", lambda: content) for i in client_ids], -1
        )
        reports = {}
        for client_id in client_ids:
            reply = finals.get(client_id)
            if reply is None:
                continue
            reports[client_name(client_id)] = json.loads(str(reply.config_records["metrics"]["json"]))
            self.max_releases[client_id] = int(reply.config_records[RELEASES_RECORD]["max-releases"])
            if "replay" in reply:
                replay.append(record_to_tensor_dict(reply["replay"])["features"])
        return reports, replay

    def replay_shares(self, run, client_ids: list[int]) -> list[torch.Tensor]:
        """Every answering client's replay share, in client order (as the in-process engine pools them)."""
        content = RecordDict({LINEAGE_RECORD: self.lineage()})
        finals = self.run_turns(
            run.federation, [(i, "evaluate.replay", lambda: content) for i in client_ids], -1
        )
        if not finals:
            raise FlowerRunError("no client sent its replay share")
        for client_id, reply in finals.items():
            self.max_releases[client_id] = int(reply.config_records[RELEASES_RECORD]["max-releases"])
        return [record_to_tensor_dict(finals[i]["replay"])["features"] for i in client_ids if i in finals]

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


UNSUPPORTED = {
    "centralized": "is the non-federated upper bound: one model per family trained on every client's "
    "pooled raw data. Its trainer (the pool, each family's model and optimizer) is one object that all "
    "clients' turns share, which the in-process engine has and Flower does not: each ClientApp keeps "
    "its own state, so on Flower every client would train alone on its own data. Running it there "
    "honestly means sending every client's raw images to the ServerApp, the transfer federated "
    "training exists to avoid, for a bound that is the same number on either engine: train it on the "
    "in-process engine (--engine inprocess)",
}


def check_supported(config: TrainConfig) -> None:
    if config.algorithm in UNSUPPORTED:
        raise ValueError(f"{config.algorithm!r} {UNSUPPORTED[config.algorithm]}")


def train_on_grid(grid, settings: FlowerSettings) -> dict:
    """The ServerApp's whole job; returns the final metrics it also writes to the run dir."""
    check_supported(settings.train_config)
    settings.check_code_version()
    run = start_run(settings.train_config, Path(settings.run_dir), play_clients=False)
    phases = {"setup": time.perf_counter() - run.started}
    transport = FlowerClients(grid, settings, run)
    transport.connect(len(run.client_tiers))
    phases["connect"] = time.perf_counter() - run.started - sum(phases.values())
    history = train_rounds(run, turns=transport)
    phases["rounds"] = time.perf_counter() - run.started - sum(phases.values())
    missing = transport.personalize(run)
    if len(run.client_tiers) - len(missing) < settings.min_replies:
        raise FlowerRunError(f"{len(missing)} clients did not personalize")
    phases["personalize"] = time.perf_counter() - run.started - sum(phases.values())
    personalized = [i for i in range(len(run.client_tiers)) if i not in missing]
    reports, replay = transport.evaluate(run, personalized)
    if not reports:
        raise FlowerRunError("no client reported its evaluation")
    results = summarize(reports)
    results["thresholds"] = {name: report.pop("threshold") for name, report in reports.items()}
    pooled = torch.cat(replay).to(torch.float16) if replay else None
    results = finish_server(run, history, results, pooled, max(transport.max_releases.values(), default=0))
    phases["evaluate"] = time.perf_counter() - run.started - sum(phases.values())
    results["engine"] = "flower"
    results["phase_seconds"] = phases
    results["clients_without_personalization"] = missing
    results["clients_without_evaluation"] = sorted(set(personalized) - {int(n[7:]) for n in reports})
    return write_final_metrics(run, results)


def make_server_app(settings: FlowerSettings | None = None) -> ServerApp:
    """A ServerApp; without `settings` it reads them from the run config (`flwr run`)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        run_settings = settings or FlowerSettings.from_run_config(dict(context.run_config))
        results = train_on_grid(grid, run_settings)
        log.info("finished: %s", results.get("summary"))

    return app


app = make_server_app()
