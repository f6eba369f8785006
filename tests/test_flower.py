"""The Flower app's logic, on a Grid that delivers to ClientApps in this process (flower_fixtures):
message <-> record conversion, the same numbers as the in-process engine, missing replies, resume.
The real Simulation Engine and a SuperLink/SuperNode deployment: test_flower_engines.py."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil

import pytest
import torch

from harmony_mobile.flower import split
from harmony_mobile.flower.client_app import make_client_app
from harmony_mobile.flower.records import RecordError, message_to_record, record_to_message
from harmony_mobile.flower.run import (
    FlowerRunError,
    check_supported,
    provision_federation_secret,
    train_on_grid,
)
from harmony_mobile.flower.settings import FlowerSettings, client_count
from harmony_mobile.protocol import messages
from harmony_mobile.run_dir import SECRET_FILE, RunDir
from harmony_mobile.training import TrainConfig, train
from tests.flower_fixtures import LoopbackGrid

TINY = {"local_steps": 2, "batch_size": 16}
SPLIT_TINY = {"local_steps": 2, "batch_size": 16, "personalize_epochs": 1}


def tiny_config(algorithm: str = "fedavg", rounds: int = 2, **extra) -> TrainConfig:
    return TrainConfig(
        dataset="digits",
        dataset_limit=600,
        clients_per_tier=1,
        rounds=rounds,
        algorithm=algorithm,
        algorithm_config=TINY if algorithm in ("fedavg", "local") else SPLIT_TINY,
        threads=1,
        **extra,
    )


def example_messages() -> list:
    tensor = torch.randn(3, 2, 4, 4)
    return [
        messages.Broadcast(2, "cnn", {"w": torch.randn(2, 2), "n": torch.tensor(3)}, "round-2"),
        messages.FeatureUpload(
            client_id="client-001",
            round_id=2,
            label_epoch="e-1",
            features=tensor,
            label_tokens=(b"12345678",) * 3,
            split_depths=(1, 2, 2),
            family="cnn",
            tier="t",
            model_version="v",
        ),
        messages.InterfaceGradients("client-001", 2, tensor, 0.25),
        messages.ClientUpdate("client-001", 2, "cnn", "t", {"w": torch.randn(5)}, 40, {"loss": 0.5}),
        messages.ClientUpdate("client-002", 0, "cnn", "t", {}, 40, {}),
        messages.ReplayFeatures("client-001", tensor, 2, "cnn", "t"),
    ]


def same_message(a, b) -> bool:
    for field in dataclasses.fields(a):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if isinstance(x, torch.Tensor):
            if not (torch.equal(x, y) and x.dtype == y.dtype):
                return False
        elif isinstance(x, dict) and x and isinstance(next(iter(x.values())), torch.Tensor):
            if x.keys() != y.keys() or not all(torch.equal(x[k], y[k]) for k in x):
                return False
        elif x != y or type(x) is not type(y):
            return False
    return True


@pytest.mark.parametrize("message", example_messages(), ids=lambda m: type(m).__name__)
def test_every_message_survives_the_record_round_trip(message):
    assert same_message(record_to_message(message_to_record(message)), message)


def test_a_record_of_another_type_or_with_extra_fields_is_refused():
    record = message_to_record(example_messages()[3])
    with pytest.raises(RecordError, match="expected Broadcast, got 'ClientUpdate'"):
        record_to_message(record, messages.Broadcast)
    record.config_records["fields"]["label"] = 3
    with pytest.raises(RecordError, match="unknown fields"):
        record_to_message(record)
    with pytest.raises(RecordError, match="is not a message"):
        message_to_record(object())


def test_settings_travel_as_flat_run_config_keys_each_overridable():
    settings = FlowerSettings(train_config=tiny_config(), run_dir="runs/x", min_replies=2)
    flat = settings.to_run_config()
    assert FlowerSettings.from_run_config(flat) == settings
    assert all(isinstance(v, str | int | float | bool) for v in flat.values())
    # what `flwr run --run-config "rounds=7 data-root='/data' dataset-limit=''"` gives the apps
    changed = FlowerSettings.from_run_config({**flat, "rounds": 7, "data-root": "/data", "dataset-limit": ""})
    assert (changed.train_config.rounds, changed.train_config.data_root) == (7, "/data")
    assert changed.train_config.dataset_limit is None
    assert changed.train_config.algorithm_config == tiny_config().algorithm_config
    with pytest.raises(ValueError, match="lacks \\['run-dir'\\]"):
        FlowerSettings.from_run_config({"rounds": 3})
    with pytest.raises(ValueError, match="unknown keys \\['train-config'\\]"):
        FlowerSettings.from_run_config({**flat, "train-config": "{}"})


def test_the_app_bundle_lists_every_setting_at_the_one_default():
    """Flower overrides only keys the app's pyproject.toml lists; its table is settings.py's."""
    import tomllib

    from harmony_mobile.flower.deployment import APP_DIR
    from harmony_mobile.flower.settings import app_config_defaults

    table = tomllib.loads((APP_DIR / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert table == app_config_defaults()
    assert table["reply-timeout"] == FlowerSettings.model_fields["reply_timeout"].default


def test_a_run_for_other_code_is_refused_by_the_server_app_and_every_client_app(tmp_path):
    from flwr.app import Message, RecordDict

    from harmony_mobile.flower.settings import CodeVersionError, code_version

    settings = FlowerSettings(
        train_config=tiny_config(), run_dir=str(tmp_path / "run"), code_version="0.0.1+other"
    )
    with pytest.raises(CodeVersionError, match=f"this process runs '{re.escape(code_version())}'"):
        train_on_grid(None, settings)
    assert not (tmp_path / "run").exists()
    grid = LoopbackGrid(make_client_app(), 4)  # the ClientApp reads its settings from the run config
    for context in grid.contexts.values():
        context.run_config = {**settings.to_run_config(), "code-version": ""}
    with pytest.raises(CodeVersionError, match="pins code-version ''"):
        grid.push_messages([Message(RecordDict(), dst_node_id=101, message_type="query.hello")])


def test_centralized_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="non-federated upper bound"):
        check_supported(tiny_config("centralized"))


def same_lineage(source, target) -> None:
    """Give run dir `target` the federation secret and label epoch of `source` (a run's lineage is
    random: two runs compare bit for bit only within one lineage). A run dir holding run.json and no
    checkpoint starts at round 0 with the lineage it finds."""
    for name in ("run.json", SECRET_FILE):
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / name, target / name)


def run_on_loopback(tmp_path, config, name="flower", min_replies=1, keep_turns=True, **grid_options):
    # the loopback Grid has every reply ready at the first pull: a silent node costs the timeouts
    settings = FlowerSettings(
        train_config=config,
        run_dir=str(tmp_path / name),
        min_replies=min_replies,
        reply_timeout=0.5,
        node_wait_timeout=0.5,
    )
    provision_federation_secret(tmp_path / name)  # the phones' secret, in the run dir's client part
    grid = LoopbackGrid(make_client_app(settings, keep_turns), client_count(config), **grid_options)
    return train_on_grid(grid, settings), tmp_path / name


def metric_lines(run_path) -> list[dict]:
    return [json.loads(line) for line in (run_path / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    "algorithm", ["fedavg", "local", "harmony", "splitgp", "multi-exit", "harmony-max-softmax"]
)
def test_flower_messages_give_exactly_the_in_process_numbers(tmp_path, monkeypatch, algorithm):
    """Same seed, data and budget: every client turn is the same arithmetic with its own random
    stream, so metrics, thresholds and every saved front-end are bit-identical, though Flower
    sends a round's turns at once (a split method's in lockstep: its server answers step k of
    every client in the round's order) and in the loopback Grid's reverse order."""
    config = tiny_config(algorithm, clients_per_round=3)
    reference = train(config, tmp_path / "inprocess", show_progress=False)
    same_lineage(tmp_path / "inprocess", tmp_path / "flower")
    batches: list[list[str]] = []
    push = LoopbackGrid.push_messages

    def push_reversed(grid, messages):  # run the ClientApps in another order than the in-process one
        messages = list(messages)
        batches.append([m.metadata.message_type for m in messages])
        return push(grid, messages[::-1])[::-1]

    monkeypatch.setattr(LoopbackGrid, "push_messages", push_reversed)
    flower, flower_path = run_on_loopback(tmp_path, config)
    round_batches = [len(b) for b in batches if b[0] == "train.round"]
    # every message of a round goes out with the other sampled clients': the turn starts, and for a
    # split method each tick's answers to the step requests of all three (in lockstep)
    assert round_batches == [3] * len(round_batches)
    assert len(round_batches) == 2 if algorithm in ("fedavg", "local") else len(round_batches) > 2
    assert [len(b) for b in batches if b[0] == "evaluate.final"] == [4]
    assert metric_lines(flower_path) == metric_lines(tmp_path / "inprocess")
    reference["summary"].pop("alignment_score", None)  # needs pooled labelled features: in-process only
    for key in ("summary", "mean", "thresholds"):  # json: NaN rates compare equal to NaN
        assert json.dumps(flower[key], sort_keys=True) == json.dumps(reference[key], sort_keys=True)
    mine, theirs = RunDir(flower_path), RunDir(tmp_path / "inprocess")
    assert mine.info.model_version == theirs.info.model_version
    for a, b in zip(mine.clients(), theirs.clients(), strict=True):
        assert a.front_end_state.keys() == b.front_end_state.keys()
        assert all(torch.equal(a.front_end_state[k], b.front_end_state[k]) for k in a.front_end_state)
    transport = [json.loads(line) for line in (flower_path / "flower_rounds.jsonl").read_text().splitlines()]
    assert [t["replied"] for t in transport] == [3, 3]
    assert all(t["bytes_sent"] > 0 and t["bytes_received"] > 0 for t in transport)


@pytest.mark.parametrize("keep_turns", [True, False], ids=["paused-turns", "process-per-message"])
def test_split_turns_cost_their_steps_once_where_the_process_lives_and_replay_where_it_does_not(
    tmp_path, monkeypatch, keep_turns
):
    """A split turn pauses in its thread between messages: each split step is computed once. A
    process per message (keep_turns=False) replays the turn from its start for every step; both
    give the in-process numbers."""
    config = tiny_config("harmony", rounds=1, clients_per_round=2)
    config = config.model_copy(
        update={"algorithm_config": {**SPLIT_TINY, "local_steps": 3, "personalize_epochs": 0}}
    )
    train(config, tmp_path / "inprocess", show_progress=False)
    same_lineage(tmp_path / "inprocess", tmp_path / "flower")
    computed, answered = [], []
    digest, record_reply = split.upload_digest, split.record_reply
    monkeypatch.setattr(split, "upload_digest", lambda *a: computed.append(1) or digest(*a))
    monkeypatch.setattr(split, "record_reply", lambda *a: answered.append(1) or record_reply(*a))
    run_on_loopback(tmp_path, config, keep_turns=keep_turns)
    assert metric_lines(tmp_path / "flower") == metric_lines(tmp_path / "inprocess")
    assert len(answered) >= 2 * 3  # two clients' turns of 3 local steps
    if keep_turns:
        assert len(computed) == len(answered)
    else:
        assert len(computed) > len(answered)


def test_a_refused_split_step_leaves_its_client_out_and_the_lockstep_round_goes_on(tmp_path, monkeypatch):
    """A step request the server refuses ends that client's turn; the others' ticks no longer
    wait for it, so the round finishes with the rest (no hang, no silent loss of the others)."""
    from harmony_mobile.flower.server_app import FlowerClients

    answer_step, refused = FlowerClients.answer_step, []

    def refuse_client_0(self, federation, client_id, request):
        if client_id == 0:
            refused.append(client_id)
            return None
        return answer_step(self, federation, client_id, request)

    monkeypatch.setattr(FlowerClients, "answer_step", refuse_client_0)
    config = tiny_config("harmony", rounds=1, clients_per_round=4)  # every client, client 0 among them
    results, run_path = run_on_loopback(tmp_path, config)
    transport = [json.loads(line) for line in (run_path / "flower_rounds.jsonl").read_text().splitlines()]
    assert refused and [t["sampled"] for t in transport] == [4] and [t["replied"] for t in transport] == [3]
    assert results["clients_without_personalization"] == [0]  # refused there too, the others went on


def test_a_silent_client_is_left_out_and_the_round_proceeds(tmp_path):
    results, run_path = run_on_loopback(tmp_path, tiny_config(), dead=[1])
    assert [m["clients"] for m in metric_lines(run_path)] == [3, 3]
    assert results["clients_without_personalization"] == [1]
    assert (run_path / "final_metrics.json").is_file()


def test_too_few_replies_stop_the_run_and_a_rerun_resumes_from_the_checkpoint(tmp_path):
    config = tiny_config(rounds=3)
    with pytest.raises(FlowerRunError, match="round 1: 0 of 4 sampled clients replied"):
        run_on_loopback(tmp_path, config, dies_at=dict.fromkeys(range(4), 1))
    run_path = tmp_path / "flower"
    assert [m["round"] for m in metric_lines(run_path)] == [0]
    assert torch.load(run_path / "checkpoints/last.pt", weights_only=True)["completed_round"] == 0
    resumed, _ = run_on_loopback(tmp_path, config)
    same_lineage(run_path, tmp_path / "uninterrupted")
    uninterrupted, _ = run_on_loopback(tmp_path, config, name="uninterrupted")
    assert [m["round"] for m in metric_lines(run_path)] == [0, 1, 2]
    assert metric_lines(run_path) == metric_lines(tmp_path / "uninterrupted")
    assert json.dumps(resumed["summary"]) == json.dumps(uninterrupted["summary"])


def test_a_replayed_turn_that_uploads_something_else_is_caught():
    """The client replays its turn against the recorded server replies; if the replay is not the
    same computation (non-determinism), the recorded gradients would be applied to other features:
    ReplayServer refuses instead."""
    upload = example_messages()[1]
    gradients = example_messages()[2]
    recorded = split.ReplayServer([gradients], [split.upload_digest(upload, True)])
    assert recorded.step(upload) is gradients
    with pytest.raises(split.SplitStepNeeded) as needed:
        recorded.step(upload)  # the second step has no recorded reply: the server must answer it
    assert needed.value.upload is upload and needed.value.update is True
    other = dataclasses.replace(upload, features=upload.features + 1e-6)
    with pytest.raises(split.ReplayDivergedError, match="split step 0 differs"):
        split.ReplayServer([gradients], [split.upload_digest(upload, True)]).step(other)
    with pytest.raises(split.ReplayDivergedError):  # same features, but the server must not update
        split.ReplayServer([gradients], [split.upload_digest(upload, True)]).step(upload, update=False)


def test_cli_refuses_an_unknown_engine_and_a_method_flower_cannot_run(tmp_path):
    from typer.testing import CliRunner

    from harmony_mobile.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["train", str(tmp_path / "a"), "--engine", "spark"])
    assert result.exit_code == 2 and "unknown engine 'spark'" in result.output
    result = runner.invoke(
        app, ["train", str(tmp_path / "b"), "--engine", "flower", "--algorithm", "centralized"]
    )
    assert result.exit_code == 2 and "in-process engine" in result.output
    assert not (tmp_path / "b").exists()


def test_a_run_dir_may_start_with_a_provisioned_federation_secret_and_keeps_it(tmp_path):
    from harmony_mobile.run_dir import RunDirError, write_federation_secret
    from harmony_mobile.training import lineage_secrets, prepare_run_dir

    run_path = tmp_path / "run"
    write_federation_secret(run_path, b"k" * 32)
    prepare_run_dir(run_path, tiny_config())
    assert lineage_secrets(run_path)[0] == b"k" * 32
    (run_path / "notes.txt").write_text("x")
    with pytest.raises(RunDirError, match="not empty and holds no harmony run"):
        prepare_run_dir(run_path, tiny_config())


def test_the_server_app_never_opens_the_federation_secret(tmp_path):
    """Every read of the secret file during a Flower run comes from a ClientApp (the loopback Grid
    runs both in this process, so the stack tells them apart); the ServerApp's code never opens it."""
    import inspect
    import sys

    secret_path = str(tmp_path / "flower" / SECRET_FILE)
    opened_by: list[set[str]] = []

    def audit(event, args):
        if event == "open" and args and str(args[0]) == secret_path:
            opened_by.append({frame.filename for frame in inspect.stack(0)})

    provision_federation_secret(tmp_path / "flower")  # the phones' provisioning, before the run
    sys.addaudithook(audit)  # hooks cannot be removed: it only records opens of this test's file
    run_on_loopback(tmp_path, tiny_config("harmony", rounds=1, clients_per_round=2))
    assert opened_by  # the clients did read it (the hook sees what it must)
    for files in opened_by:
        assert any(f.endswith("flower/client_app.py") for f in files), sorted(files)[-5:]


def test_no_flower_message_carries_the_secret_a_client_state_or_a_personalized_model(tmp_path):
    """Everything the ServerApp receives, captured on the Grid: no client's RNG state, release
    counts, label-DP draws or personalized model, and not the secret's bytes."""
    config = tiny_config("harmony", rounds=1, clients_per_round=2).model_copy(
        update={"label_dp_epsilon": 1.0, "feature_clip": 1.0, "noise_multiplier": 0.5}
    )
    captured = []

    class Tap(LoopbackGrid):
        def pull_messages(self, message_ids):
            replies = super().pull_messages(message_ids)
            captured.extend(replies)
            return replies

    provision_federation_secret(tmp_path / "flower")
    secret = (tmp_path / "flower" / SECRET_FILE).read_bytes()
    settings = FlowerSettings(train_config=config, run_dir=str(tmp_path / "flower"), reply_timeout=0.5)
    train_on_grid(Tap(make_client_app(settings), client_count(config)), settings)
    kinds = {reply.metadata.message_type for reply in captured}
    assert {"train.round", "train.personalize", "evaluate.final"} <= kinds
    for reply in captured:
        for name, record in reply.content.items():
            assert name not in ("client-state", "model", "personalized-model"), (
                reply.metadata.message_type,
                name,
            )
            if hasattr(record, "to_numpy_ndarrays"):
                for array in record.to_numpy_ndarrays():
                    assert secret not in array.tobytes(), (reply.metadata.message_type, name)
            assert not any(key in ("noise", "upload_labels", "releases") for key in record), (
                name,
                list(record),
            )


def test_the_server_app_never_loads_data_a_client_or_the_secret_and_a_client_only_its_rows(
    tmp_path, monkeypatch
):
    """Every data load and every Client built during a Flower run comes from a ClientApp (the
    loopback Grid runs both apps in this process, so the stack tells them apart; the secret's
    reads: test_the_server_app_never_opens_the_federation_secret), nobody loads the whole data
    set, and a node holds the images of its own rows only."""
    import inspect

    from harmony_mobile.data import datasets
    from harmony_mobile.federation import client as client_module
    from harmony_mobile.flower import client_app

    callers: list[tuple[str, set[str]]] = []

    def audited(name, function):
        def call(*args, **kwargs):
            callers.append((name, {frame.filename for frame in inspect.stack(0)}))
            return function(*args, **kwargs)

        return call

    def refuse(*args, **kwargs):
        raise AssertionError("a Flower run loaded the whole data set")

    config = tiny_config("fedavg", rounds=1)
    whole = datasets.load_dataset(config.dataset, limit=config.dataset_limit)
    monkeypatch.setattr(datasets, "load_dataset", refuse)
    monkeypatch.setattr("harmony_mobile.training.load_dataset", refuse)
    for name in ("load_rows", "load_labels"):
        monkeypatch.setattr(client_app, name, audited(name, getattr(client_app, name)))
    monkeypatch.setattr(client_module.Client, "__init__", audited("Client", client_module.Client.__init__))
    client_app._client_data.cache_clear()
    client_app._partition.cache_clear()
    results, run_path = run_on_loopback(tmp_path, config)
    assert results["summary"]["accuracy_with_ood"] > 0
    assert {name for name, _ in callers} == {"load_rows", "load_labels", "Client"}
    for name, files in callers:
        assert any(f.endswith("flower/client_app.py") for f in files), (name, sorted(files)[-5:])
    secret = (run_path / SECRET_FILE).read_bytes()
    for partition_id in range(client_count(config)):
        data = client_app._client_data(config.model_dump_json(), partition_id, secret)
        split = data.split
        held = set(data.rows.local_of)
        assert len(data.rows.images) == len(held) < config.dataset_limit // 2
        assert set(split.train) | set(split.val) | set(split.test) <= held
        assert torch.equal(
            data.rows[split.test], whole.images[split.test]
        )  # the same pixels, by global index


def test_a_nodes_state_keeps_no_finished_split_turn(tmp_path):
    """A split turn's start (with model weights) and the server's replies are dropped once the turn
    ended, so a node's context.state does not grow with the rounds it served."""
    config = tiny_config("harmony", rounds=2, clients_per_round=4)
    settings = FlowerSettings(train_config=config, run_dir=str(tmp_path / "flower"), reply_timeout=0.5)
    provision_federation_secret(tmp_path / "flower")
    grid = LoopbackGrid(make_client_app(settings, keep_turns=False), client_count(config))
    train_on_grid(grid, settings)
    for context in grid.contexts.values():
        assert not [key for key in context.state if key.startswith(split.TURN_PREFIX)], list(context.state)


def test_a_client_holding_every_class_is_evaluated_without_ood_rows(tmp_path):
    """A Dirichlet split can give a client every class: evaluation then scores it at p=0 only
    (evaluation.evaluate_client), and the ClientApp loads no OOD rows for it."""
    config = tiny_config(rounds=1).model_copy(update={"partition": "dirichlet", "alpha": 100.0})
    results, _ = run_on_loopback(tmp_path, config)
    assert results["clients_without_evaluation"] == []
    assert results["summary"]["accuracy_without_ood"] > 0


def test_at_most_max_in_flight_messages_are_outstanding_and_the_numbers_stay(tmp_path, monkeypatch):
    """Personalizing or evaluating every client sends them max_in_flight at a time (each message
    holds a copy of a model until answered); the arithmetic does not change."""
    config = tiny_config("fedavg", rounds=1, clients_per_round=4)
    train(config, tmp_path / "inprocess", show_progress=False)
    same_lineage(tmp_path / "inprocess", tmp_path / "flower")
    settings = FlowerSettings(
        train_config=config, run_dir=str(tmp_path / "flower"), reply_timeout=0.5, max_in_flight=3
    )
    grid = LoopbackGrid(make_client_app(settings), client_count(config))
    outstanding, most = set(), [0]
    push, pull = grid.push_messages, grid.pull_messages

    def counted_push(messages):
        messages = list(messages)
        ids = push(messages)
        outstanding.update(
            i for i, m in zip(ids, messages, strict=True) if m.metadata.message_type != "query.hello"
        )
        most[0] = max(most[0], len(outstanding))
        return ids

    def counted_pull(message_ids):
        replies = pull(message_ids)
        outstanding.difference_update(r.metadata.reply_to_message_id for r in replies)
        return replies

    monkeypatch.setattr(grid, "push_messages", counted_push)
    monkeypatch.setattr(grid, "pull_messages", counted_pull)
    train_on_grid(grid, settings)
    assert most[0] == 3  # 4 clients' turns, 3 at a time (query.hello, without a model, is not counted)
    assert metric_lines(tmp_path / "flower") == metric_lines(tmp_path / "inprocess")
