"""The Flower ClientApp: one phone of the federation, driven by the ServerApp's messages.

A SuperNode is one client: node config `partition-id` (and `num-partitions`, which must equal
the run's client count) picks its data split and tier exactly as `harmony train` assigns them.
Each message runs the registry's own `Algorithm` code on a `Client` rebuilt from that data:

  query.hello        -> which partition this node holds
  train.round        Broadcast + stream round + label epoch -> algorithm.client_round -> ClientUpdate
  train.personalize  the same -> algorithm.personalize; the model stays here (threshold only back)
  evaluate.replay    (slot-gated runs only) -> this client's replay features (released like uploads)
  evaluate.final     the server's back-end + slot table (+ its slot prototypes, slot-gated runs) ->
                     this client's metrics, its replay features (unless sent already) and its
                     artifact in its client dir

A turn draws from its own random stream, rounds.seed_turn(run seed, stream round, partition id),
derived here. Both `train` messages return how often the client's most-released sample has left
it (for the DP accountant). A split method's turn is several messages, one per
split step (split.py).

The federation secret and labels live here only: the secret comes from the file the node config
names (else the client part of a run dir on this machine), the data from this node's partition.
What must outlive one message lives in Flower's `context.state`, never in a message: the
algorithm object's own state (the `local` baseline keeps its model and optimizer between rounds),
the client's private state (Client.private_state: release counts, its noise stream, label DP's
draws), its personalized model and, during a split turn, the turn's start and the server's replies.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from harmony_mobile.algorithms.base import calibrate_client
from harmony_mobile.algorithms.registry import build_algorithm
from harmony_mobile.data import DatasetInfo, dataset_info, load_labels, load_rows, ood_test_indices
from harmony_mobile.evaluation import OOD_FRACTIONS, BackendWithSlots, EvaluationSetting, evaluate_client_at
from harmony_mobile.federation.client import Client
from harmony_mobile.federation.replay import client_replay
from harmony_mobile.federation.rounds import seed_turn
from harmony_mobile.federation.slot_gate import SlotGate
from harmony_mobile.flower import split
from harmony_mobile.flower.records import (
    message_to_record,
    record_to_message,
    record_to_tensor_dict,
    tensor_dict_to_record,
)
from harmony_mobile.flower.settings import FlowerSettings, client_count
from harmony_mobile.models import Backend, InterfaceSpec, load_tiers
from harmony_mobile.protocol.label_tokens import parse_slot_table
from harmony_mobile.protocol.messages import Broadcast, InterfaceGradients
from harmony_mobile.run_dir import SECRET_FILE, save_client
from harmony_mobile.training import (
    TrainConfig,
    client_artifact,
    client_partition,
    make_client,
    upload_privacy,
)

STREAM_RECORD = "stream"  # which round's random stream a turn draws from
ALGORITHM_STATE = "algorithm-state"
CLIENT_STATE = "client-state"  # what the phone keeps between rounds besides its model (Client.private_state)
RELEASES_RECORD = "releases"  # the one number of the client's state the server gets: max releases
PERSONALIZED = "personalized-model"  # context.state only: the model personalization left
PERSONALIZED_THRESHOLD = "personalized-threshold"  # and its exit threshold
SERVED_RECORD = "served-backend"  # evaluate.final: the back-end's weights
PROTOTYPES_RECORD = "slot-prototypes"  # evaluate.final of a slot-gated run: the server's prototypes
CLIENT_DIR_KEY = "client-dir"  # node config: where this client keeps its artifact
LINEAGE_RECORD = "lineage"  # the run's label epoch, sent with every turn start
SECRET_FILE_KEY = "federation-secret-file"


class NodeConfigError(ValueError):
    """The SuperNode's node config does not describe a client of this run."""


@dataclass(frozen=True)
class PartitionRows:
    """The images of one client's rows only, indexed by their indices in the whole data set (what
    evaluation asks for: its test split and the OOD samples drawn for it); other rows are absent."""

    images: torch.Tensor
    local_of: dict[int, int]

    def __getitem__(self, index) -> torch.Tensor:
        rows = torch.as_tensor(index).reshape(-1).tolist()
        return self.images[[self.local_of[row] for row in rows]]


@dataclass(frozen=True)
class ClientData:
    """What a node holds of the data set: its own rows' images, every label (the partition is a
    function of them), its split, tier and the run's partition (indices only)."""

    rows: PartitionRows
    labels: torch.Tensor
    info: DatasetInfo
    tier: Any
    split: Any
    partition: Any


@lru_cache(maxsize=2)
def _partition(config_json: str, federation_secret: bytes):
    """The run's partition from the labels alone (no image loaded): training.client_partition's
    split, so partition p here is client p of `harmony train`."""
    config = TrainConfig.model_validate_json(config_json)
    labels = torch.from_numpy(load_labels(config.dataset, config.data_root, limit=config.dataset_limit))
    info = dataset_info(config.dataset, config.data_root)
    tiers = load_tiers(config.tiers_file).with_input_shape(info.input_shape)
    partition = client_partition(config, tiers, LabelsOnly(labels), federation_secret)
    return labels, info, tiers, partition


@dataclass(frozen=True)
class LabelsOnly:
    labels: torch.Tensor  # what client_partition reads of a data set


@lru_cache(maxsize=4)
def _client_data(config_json: str, partition_id: int, federation_secret: bytes) -> ClientData:
    """One client's rows (train, validation, test and the OOD samples its evaluation draws),
    loaded alone: a node never holds the other clients' images. Cached per process: a ClientApp
    process may serve many messages of one run, and several nodes (a virtual SuperNode's actor)."""
    config = TrainConfig.model_validate_json(config_json)
    labels, info, tiers, partition = _partition(config_json, federation_secret)
    tier_of_client = [tier for tier in tiers.tiers for _ in range(config.clients_per_tier)]
    if not 0 <= partition_id < len(tier_of_client):
        raise NodeConfigError(f"partition-id {partition_id} outside 0..{len(tier_of_client) - 1}")
    split = partition.clients[partition_id]
    # evaluation.evaluate_client's draws (a client holding every class gets no OOD rows)
    pool = labels.numpy()[partition.ood_pool]
    has_ood = bool(np.isin(pool, split.classes, invert=True).any())
    fractions = [p for p in OOD_FRACTIONS if p == 0 or has_ood]
    evaluated = [
        ood_test_indices(split, labels.numpy(), partition.ood_pool, p, config.seed)[0] for p in fractions
    ]
    wanted = np.unique(np.concatenate([split.train, split.val, split.test, *evaluated]))
    loaded = load_rows(config.dataset, config.data_root, wanted, limit=config.dataset_limit)
    rows = PartitionRows(loaded.images, {int(row): i for i, row in enumerate(wanted)})
    return ClientData(rows, labels, info, tier_of_client[partition_id], split, partition)


def settings_of(context: Context, settings: FlowerSettings | None) -> FlowerSettings:
    """This run's settings (the run config, unless given), refused when they pin other code."""
    settings = settings or FlowerSettings.from_run_config(dict(context.run_config))
    settings.check_code_version()
    return settings


def partition_of(context: Context, config: TrainConfig) -> int:
    node = context.node_config
    if "partition-id" not in node or "num-partitions" not in node:
        raise NodeConfigError("node config needs partition-id and num-partitions")
    expected = client_count(config)
    if int(node["num-partitions"]) != expected:
        raise NodeConfigError(
            f"node config num-partitions={node['num-partitions']}, the run has {expected} clients"
        )
    return int(node["partition-id"])


def federation_secret(context: Context, settings: FlowerSettings) -> bytes:
    """The secret label tokens and the exit order are keyed with: the file the node config names
    (provisioned to every phone, never to the server), else the client part of the run dir when it
    is on this machine (Simulation Engine, loopback deployment)."""
    path = context.node_config.get(SECRET_FILE_KEY) or Path(settings.run_dir) / SECRET_FILE
    if not Path(str(path)).is_file():
        raise NodeConfigError(f"no federation secret: set node config {SECRET_FILE_KEY} (no file at {path})")
    return Path(str(path)).read_bytes()


def build_client(context: Context, settings: FlowerSettings, label_epoch: str) -> Client:
    config = settings.train_config
    secret = federation_secret(context, settings)
    data = _client_data(config.model_dump_json(), partition_of(context, config), secret)
    interface = InterfaceSpec(config.interface_channels, config.interface_size)
    return make_client(
        data.split,
        data.tier,
        data.rows,
        data.labels,
        data.info,
        interface,
        secret,
        label_epoch,
        upload_privacy(config),
    )


def load_algorithm_state(algorithm, context: Context) -> None:
    if ALGORITHM_STATE in context.state.config_records:
        blob = context.state.config_records[ALGORITHM_STATE]["blob"]
        vars(algorithm).update(torch.load(io.BytesIO(blob), weights_only=True))


def save_algorithm_state(algorithm, context: Context) -> None:
    skipped = ("config", "name", *getattr(algorithm, "process_local", ()))
    state = {k: v for k, v in vars(algorithm).items() if k not in skipped}
    if state:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        context.state.config_records[ALGORITHM_STATE] = ConfigRecord({"blob": buffer.getvalue()})


@dataclass
class Turn:
    """One client's turn as its ClientApp runs it: the registry's algorithm and the client rebuilt
    from the node's data and context.state, the broadcast and the round's random stream."""

    algorithm: Any
    client: Client
    broadcast: Broadcast
    generator: torch.Generator


def begin_turn(context: Context, content: RecordDict, settings: FlowerSettings, algorithm) -> Turn:
    load_algorithm_state(algorithm, context)
    label_epoch = str(content.config_records[LINEAGE_RECORD]["label-epoch"])
    client = build_client(context, settings, label_epoch)
    if CLIENT_STATE in context.state.array_records:
        client.load_private_state(record_to_tensor_dict(context.state.array_records[CLIENT_STATE]))
    broadcast = record_to_message(content, Broadcast)
    stream_round = int(content.config_records[STREAM_RECORD]["round"])
    generator = seed_turn(
        settings.train_config.seed, stream_round, partition_of(context, settings.train_config)
    )
    client.receive(broadcast)
    return Turn(algorithm, client, broadcast, generator)


def end_turn(context: Context, turn: Turn, result: RecordDict) -> RecordDict:
    """The turn's reply: `work`'s result and the max release count; the
    client's private state (and after personalization, round -1, its model) stay in context.state."""
    save_algorithm_state(turn.algorithm, context)
    if turn.broadcast.round_id == -1:
        keep_personalized(context, turn.client)
    context.state[CLIENT_STATE] = tensor_dict_to_record(turn.client.private_state())
    result[RELEASES_RECORD] = ConfigRecord({"max-releases": turn.client.max_releases})
    return result


def run_turn(
    context: Context, content: RecordDict, settings: FlowerSettings | None, work, keep_turns: bool = True
) -> RecordDict:
    """One message of a client's turn: run `work(algorithm, client, server, broadcast, generator)`
    from the turn's start; returns the reply's content: the next split-step request, or `work`'s
    result. A split turn continues its paused thread when this
    process holds it (and `keep_turns`), else replays from the turn's start (split.py)."""
    run_settings = settings_of(context, settings)
    config = run_settings.train_config
    torch.set_num_threads(config.threads)
    algorithm = build_algorithm(config.algorithm, config.algorithm_config)
    if not algorithm.uses_split:
        turn = begin_turn(context, content, run_settings, algorithm)
        return end_turn(context, turn, work(algorithm, turn.client, None, turn.broadcast, turn.generator))
    key = (context.run_id, context.node_id)
    if split.is_continuation(content):
        answered = split.record_reply(context.state, content)
        paused = split.LiveTurn.waiting_for(key, answered) if keep_turns else None
        if paused is not None:
            gradients = record_to_message(content, InterfaceGradients)
            return split_reply(context, paused, paused.resume(gradients), keep_turns)
        content = split.turn_start(context.state)
    else:
        split.save_turn_start(context.state, content)
    turn = begin_turn(context, content, run_settings, algorithm)
    live = split.LiveTurn(key, config.threads, turn)
    server = split.ReplayServer(*split.recorded_steps(context.state), on_new_step=live.pause)
    event = live.start(lambda: work(turn.algorithm, turn.client, server, turn.broadcast, turn.generator))
    return split_reply(context, live, event, keep_turns)


def split_reply(context: Context, live: split.LiveTurn, event, keep_turns: bool) -> RecordDict:
    if isinstance(event, split.SplitStepNeeded):
        split.set_pending(context.state, event.digest)
        if not keep_turns:
            split.LiveTurn.abandon_node(live.key)
        return split.step_request(event)
    split.forget_turn(context.state)
    return end_turn(context, live.turn, event)


def client_round(algorithm, client: Client, server, broadcast: Broadcast, generator) -> RecordDict:
    return message_to_record(algorithm.client_round(client, server, broadcast.round_id, generator))


def personalize(algorithm, client: Client, server, broadcast: Broadcast, generator) -> RecordDict:
    """The personalized model stays on the client (context.state, by `keep_personalized`)."""
    algorithm.personalize(client, server, generator)
    return RecordDict({"client": ConfigRecord({"client-id": client.client_id})})


def keep_personalized(context: Context, client: Client) -> None:
    context.state[PERSONALIZED] = tensor_dict_to_record(client.model.state_dict())
    context.state[PERSONALIZED_THRESHOLD] = ConfigRecord({"threshold": float(client.threshold)})


def personalized_client(context: Context, content: RecordDict, settings: FlowerSettings) -> Client:
    """This node's client as personalization left it (its model and threshold from the node state)."""
    label_epoch = str(content.config_records[LINEAGE_RECORD]["label-epoch"])
    client = build_client(context, settings, label_epoch)
    client.load_private_state(record_to_tensor_dict(context.state.array_records[CLIENT_STATE]))
    client.model.load_state_dict(record_to_tensor_dict(context.state.array_records[PERSONALIZED]))
    client.threshold = float(context.state.config_records[PERSONALIZED_THRESHOLD]["threshold"])
    return client


def replay_record(client: Client, config: TrainConfig) -> RecordDict:
    """This client's share of the replay set (released like uploads), with its release count."""
    features = client_replay(client, client_count(config), config.seed).features
    return RecordDict(
        {
            "replay": tensor_dict_to_record({"features": features}),
            RELEASES_RECORD: ConfigRecord({"max-releases": client.max_releases}),
        }
    )


def evaluate_replay(context: Context, content: RecordDict, settings: FlowerSettings) -> RecordDict:
    """A slot-gated run's first evaluation message: this client's replay share, from which the
    ServerApp makes the slot prototypes evaluate.final brings back."""
    client = personalized_client(context, content, settings)
    reply = replay_record(client, settings.train_config)
    context.state[CLIENT_STATE] = tensor_dict_to_record(client.private_state())
    return reply


def evaluate_final(context: Context, content: RecordDict, settings: FlowerSettings) -> RecordDict:
    """Federated evaluation: this client's metrics with its personalized model and the server's
    back-end (decoded with its own secret), its artifact saved where the node keeps it, and its
    share of the replay set (a slot-gated run's came with evaluate.replay: this message brings the
    slot prototypes, by which the client calibrates its threshold first, as training.gate_clients)."""
    config = settings.train_config
    client = personalized_client(context, content, settings)
    data = _client_data(config.model_dump_json(), partition_of(context, config), client.federation_secret)
    algorithm = build_algorithm(config.algorithm, config.algorithm_config)
    served = backend_with_slots(content, data.info.num_classes, config) if SERVED_RECORD in content else None
    gated = PROTOTYPES_RECORD in content
    if gated:
        prototypes = record_to_tensor_dict(content[PROTOTYPES_RECORD])["prototypes"]
        client.slot_gate = SlotGate(prototypes, client.own_slots(served.slot_tokens))
        calibrate_client(client, algorithm.config.calibration_target, "slot_margin")
    setting = EvaluationSetting(data.rows, data.labels, data.partition, config.seed, algorithm.exit_rule)
    metrics = evaluate_client_at(client, served, setting)
    save_client(client_dir(context, settings), client_artifact(client, data.split))
    report = {**metrics, "threshold": client.threshold}
    reply = RecordDict({"metrics": ConfigRecord({"json": json.dumps(report)})})
    if served is not None and not gated:
        reply["replay"] = replay_record(client, config)["replay"]
    reply[RELEASES_RECORD] = ConfigRecord({"max-releases": client.max_releases})
    context.state[CLIENT_STATE] = tensor_dict_to_record(client.private_state())
    for key in (PERSONALIZED, PERSONALIZED_THRESHOLD):  # saved in the client dir: the node state shrinks
        del context.state[key]
    return reply


def backend_with_slots(content: RecordDict, num_classes: int, config: TrainConfig) -> BackendWithSlots:
    backend = Backend(InterfaceSpec(config.interface_channels, config.interface_size), num_classes)
    backend.load_state_dict(record_to_tensor_dict(content[SERVED_RECORD]))
    tokens = parse_slot_table(json.loads(str(content.config_records["slots"]["tokens"])))
    return BackendWithSlots(backend.eval(), tokens)


def client_dir(context: Context, settings: FlowerSettings) -> Path:
    """Where this client keeps its artifact: the node config's folder, else the run dir's client part."""
    return Path(str(context.node_config.get(CLIENT_DIR_KEY) or settings.run_dir))


def make_client_app(settings: FlowerSettings | None = None, keep_turns: bool = True) -> ClientApp:
    """A ClientApp; without `settings` it reads them from the run config (`flwr run`). With
    `keep_turns=False` every split step replays its turn, as in a process per message."""
    app = ClientApp()

    @app.query("hello")
    def hello(message: Message, context: Context) -> Message:
        config = settings_of(context, settings).train_config
        reply = ConfigRecord({"partition-id": partition_of(context, config)})
        return Message(RecordDict({"node": reply}), reply_to=message)

    @app.train("round")
    def train_round(message: Message, context: Context) -> Message:
        return Message(
            run_turn(context, message.content, settings, client_round, keep_turns), reply_to=message
        )

    @app.train("personalize")
    def train_personalize(message: Message, context: Context) -> Message:
        return Message(
            run_turn(context, message.content, settings, personalize, keep_turns), reply_to=message
        )

    @app.evaluate("replay")
    def replay_share(message: Message, context: Context) -> Message:
        run_settings = settings_of(context, settings)
        return Message(evaluate_replay(context, message.content, run_settings), reply_to=message)

    @app.evaluate("final")
    def final_evaluation(message: Message, context: Context) -> Message:
        run_settings = settings_of(context, settings)
        return Message(evaluate_final(context, message.content, run_settings), reply_to=message)

    return app


app = make_client_app()
