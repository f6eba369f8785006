"""Each HARMONY mechanism alone, the round loop's resume, and one short end-to-end run."""

import copy
import json
from unittest import mock

import pytest
import torch
import yaml

from harmony_mobile.algorithms.base import (
    calibrate_client,
    calibrate_threshold,
    exit_loss,
    exit_loss_and_activation,
    personalize_split,
    split_step,
    train_exit_head,
)
from harmony_mobile.algorithms.harmony import RoundModels, parameter_distance
from harmony_mobile.algorithms.registry import build_algorithm
from harmony_mobile.data import load_dataset
from harmony_mobile.data.partition import make_partition
from harmony_mobile.federation.rounds import Federation, run_rounds
from harmony_mobile.federation.split_trainer import SplitTrainer, aggregate_by_parameter
from harmony_mobile.models import (
    Backend,
    FamilyModel,
    InterfaceSpec,
    ProjectionHead,
    load_tiers,
    parameter_names,
)
from harmony_mobile.protocol.messages import ClientUpdate
from harmony_mobile.run_dir import SECRET_FILE, RunDir, RunDirError, write_federation_secret
from harmony_mobile.training import EPOCH_FILE, TrainConfig, build_clients, initial_family_weights, train

torch.set_num_threads(1)
FAST = {"local_steps": 2, "batch_size": 16, "personalize_epochs": 1}


FEDERATION_SECRET = b"S" * 32
LABEL_EPOCH = "e-test"


def tiny_federation(algorithm="harmony", seed=0, overrides=None, secret=None, **train_options):
    config = TrainConfig(
        dataset="digits", clients_per_tier=1, seed=seed, algorithm=algorithm, **train_options
    )
    dataset = load_dataset("digits", limit=800)
    tiers = load_tiers().with_input_shape(dataset.input_shape)
    families = [t.family for t in tiers.tiers]
    partition = make_partition(
        "family", dataset.labels.numpy(), len(families), seed, client_families=families
    )
    algo = build_algorithm(algorithm, {**FAST, **(overrides or {})})
    clients = build_clients(
        config, tiers, dataset, partition, InterfaceSpec(), secret or FEDERATION_SECRET, LABEL_EPOCH
    )
    torch.manual_seed(seed)
    backend = Backend(InterfaceSpec(), 10)
    server = SplitTrainer(
        backend, ProjectionHead(backend.feature_dim), algo.split_trainer_config(), LABEL_EPOCH
    )
    weights = initial_family_weights(config, tiers, dataset, InterfaceSpec())
    return Federation(algo, clients, weights, server)


def test_aggregation_averages_each_parameter_over_its_holders_across_depths():
    model = FamilyModel("cnn", 1, 28, 10)
    current = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}
    shallow = {n: torch.full_like(current[n], 1.0) for n in parameter_names(model, 1)}
    deep = {n: torch.full_like(current[n], 4.0) for n in parameter_names(model, 3)}
    updates = [
        ClientUpdate("a", 0, "cnn", "t1", shallow, num_samples=100),
        ClientUpdate("b", 0, "cnn", "t3", deep, num_samples=300),
    ]
    merged = aggregate_by_parameter(current, updates)
    assert torch.allclose(
        merged["stages.0.1.0.0.weight"], torch.full_like(current["stages.0.1.0.0.weight"], 3.25)
    )
    assert torch.allclose(
        merged["connectors.1.conv.bias"], torch.full_like(current["connectors.1.conv.bias"], 3.25)
    )
    assert torch.allclose(merged["stages.2.0.0.weight"], torch.full_like(current["stages.2.0.0.weight"], 4.0))
    assert torch.equal(merged["stages.3.0.0.weight"], current["stages.3.0.0.weight"])  # nobody holds stage 4


def round_models_of_a_depth_3_client(overrides: dict, personalize):
    """HARMONY's algorithm, a broadcast depth-3 client and its RoundModels, theta' = theta with
    `personalize` applied to every parameter in place."""
    federation = tiny_federation(overrides=overrides)
    client = next(c for c in federation.clients if c.split_depth == 3)
    federation.broadcast(client)
    adapted = FamilyModel(client.tier.family, 1, 28, 10, client.tier.width)
    adapted.load_state_dict(client.model.state_dict())
    with torch.no_grad():
        for p in adapted.parameters():
            personalize(p)
    variant = FamilyModel(client.tier.family, 1, 28, 10, client.tier.width)
    return federation.algorithm, client, RoundModels(client.model, adapted, variant, client.held_parameters())


def test_variant_sampler_covers_all_depths_and_the_path_beyond_personalization():
    # theta' - theta = 1 everywhere, so variant - theta = beta
    overrides = {"weight_noise": 0.0, "meta": True}
    algo, client, models = round_models_of_a_depth_3_client(overrides, lambda p: p.add_(1.0))
    generator = torch.Generator().manual_seed(0)
    depths, betas = set(), []
    for _ in range(60):
        depth, noise, _ = algo._sample_variant(client, models, 1.0, generator)
        depths.add(depth)
        assert noise == 0.0  # weight_noise = 0: the measured noise is none
        # every depth runs stage 1 and that depth's connector, so the sampler writes both
        for name in ("stages.0.1.conv1.bias", f"connectors.{depth}.conv.bias"):
            assert name in models.run_at_depth(depth)
            betas.append((models.variant_params[name] - models.theta_params[name]).mean().item())
    assert depths == {1, 2, 3}
    assert min(betas) >= 0 and max(betas) <= algo.config.beta_max + 1e-5
    assert max(betas) > 1.0  # extrapolation beyond the personalized point happens

    fixed = tiny_federation(algorithm="harmony-fixed-depth").algorithm
    assert {fixed._sample_variant(client, models, 1.0, generator)[0] for _ in range(20)} == {3}


def test_a_configured_path_length_moves_the_variants_that_far_along_the_personalization_path():
    # a path 0.1 % of theta's norm long
    overrides = {"weight_noise": 0.0, "path_length": 0.1, "meta": True}
    algo, client, models = round_models_of_a_depth_3_client(overrides, lambda p: p.mul_(1.001))
    scale = algo._path_scale(models)
    assert scale == pytest.approx(100.0, rel=1e-4)  # stretched to 10 % of ||theta||
    depth, _, path = algo._sample_variant(client, models, scale, torch.Generator().manual_seed(0))
    run = {n: models.theta_params[n] for n in models.run_at_depth(depth)}
    moved = sum(float((models.variant_params[n] - p).detach().pow(2).sum()) for n, p in run.items()) ** 0.5
    theta_norm = sum(float(p.detach().pow(2).sum()) for p in run.values()) ** 0.5
    # the variant sits beta_v times the configured length from theta; the sampler draws the depth,
    # then beta_v
    draws = torch.Generator().manual_seed(0)
    torch.randint(1, client.split_depth + 1, (), generator=draws)
    beta = float(torch.rand((), generator=draws)) * algo.config.beta_max
    assert moved / theta_norm == pytest.approx(beta * 0.1, rel=1e-3)
    assert path / theta_norm == pytest.approx(0.1, rel=1e-3)  # the scaled path, over the same parameters
    # an empty path (the inner loop off) is not stretched: the variants stay theta plus noise
    models.adapted.load_state_dict(client.model.state_dict())
    assert algo._path_scale(models) == 1.0
    # nor is a path of float rounding (one weight moved by one ulp): no amplified noise
    with torch.no_grad():
        weight = next(models.adapted.parameters()).view(-1)
        weight[0] = torch.nextafter(weight[0], torch.tensor(float("inf")))
    assert 0.0 < parameter_distance(models) and algo._path_scale(models) == 1.0
    # and without the setting the path keeps the inner loop's own length
    assert tiny_federation().algorithm._path_scale(models) == 1.0


def test_one_backward_of_the_exit_loss_and_the_server_gradient_equals_the_two_pass_step():
    """Personalization (and SplitGP's step) back-propagate the exit loss and dL_srv/dz of one forward
    pass together: the gradients a front-end gets must be the two-pass step's."""
    federation = tiny_federation()
    client = next(c for c in federation.clients if c.split_depth == 3)
    federation.broadcast(client)
    images, labels = client.batch(16, torch.Generator().manual_seed(2))
    depths = (3,) * len(labels)
    grads = []
    for one_pass in (False, True):
        model = copy.deepcopy(client.model)
        if one_pass:
            loss, activation = exit_loss_and_activation(model, images, labels, 3)
            features = model.connectors["3"](activation)
            split_step(client, federation.server, features, labels, depths, -1, 0.7, False, client_loss=loss)
        else:
            exit_loss(model, images, labels, 3).backward()
            _, features = model(images, 3)
            split_step(client, federation.server, features, labels, depths, -1, 0.7, update_server=False)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    two_pass, one_pass = grads
    assert two_pass.keys() == one_pass.keys() and any(n.startswith("connectors.3.") for n in one_pass)
    for name, grad in two_pass.items():
        torch.testing.assert_close(one_pass[name], grad, rtol=1e-4, atol=1e-6)


def test_a_variant_is_written_where_its_depth_runs_and_nowhere_else():
    algo, client, models = round_models_of_a_depth_3_client({}, lambda p: None)
    before = {n: p.detach().clone() for n, p in models.variant_params.items()}
    generator = torch.Generator().manual_seed(0)
    for _ in range(10):
        depth, noise, _ = algo._sample_variant(client, models, 1.0, generator)
        run = set(models.run_at_depth(depth))
        assert noise > 0 and any(n.startswith(f"stages.{depth - 1}.") for n in run)
        for name, p in models.variant_params.items():
            if name in run:  # theta with multiplicative noise: near theta, and not equal where nonzero
                assert name.endswith("bias") or not torch.equal(p, models.theta_params[name])
                torch.testing.assert_close(p, models.theta_params[name], rtol=0.2, atol=0.2)
            else:
                assert torch.equal(p, before[name]), name
        before = {n: p.detach().clone() for n, p in models.variant_params.items()}


@pytest.mark.parametrize("family", ["cnn", "mobilenet", "resnet"])
def test_the_parameters_a_depth_runs_are_those_its_extractor_reaches(family):
    """The variant sampler writes `run_at_depth`: it must be exactly what a split at that depth
    computes with (an omitted stage would run unperturbed, an extra one would be wasted work)."""
    model = FamilyModel(family, 1, 28, 10)
    models = RoundModels(model, model, model, dict(model.named_parameters()))
    for depth in (1, 2, 3):
        model.zero_grad(set_to_none=True)
        model.connectors[str(depth)](model.extract(torch.randn(2, 1, 28, 28), depth)).sum().backward()
        reached = {n for n, p in model.named_parameters() if p.grad is not None}
        assert set(models.run_at_depth(depth)) == reached


def test_without_the_inner_loop_theta_prime_is_theta_itself():
    """A copy of theta made at the round's start would go stale as theta steps; the variants and the
    exit gradient must see theta as it is."""
    for name, adapted_is_theta in (("harmony", True), ("harmony-with-meta", False)):
        federation = tiny_federation(algorithm=name)
        client = next(c for c in federation.clients if c.split_depth == 3)
        federation.broadcast(client)
        models = federation.algorithm._round_models(client)
        assert (models.adapted is client.model) == adapted_is_theta
        assert (models.variant is client.model) is False


def test_personalization_in_one_backward_pass_trains_what_two_passes_trained():
    """`personalize_split` at its call site against the two-pass loop it replaced, same draws."""
    federation = tiny_federation()
    client = next(c for c in federation.clients if c.split_depth == 3)
    federation.broadcast(client)
    twin = copy.deepcopy(client)
    before = {n: p.detach().clone() for n, p in client.model.named_parameters()}
    personalize_split(client, federation.server, 1, 16, 0.001, 0.7, torch.Generator().manual_seed(3))
    optimizer = torch.optim.Adam(twin.held_parameters().values(), lr=0.001)
    generator = torch.Generator().manual_seed(3)
    for _ in range(len(twin.train_y) // 16):
        images, labels = twin.batch(16, generator)
        optimizer.zero_grad()
        exit_loss(twin.model, images, labels, 3).backward()
        _, features = twin.model(images, 3)
        split_step(
            twin, federation.server, features, labels, (3,) * len(labels), -1, 0.7, update_server=False
        )
        optimizer.step()
    # the first step's gradients agree to about 2e-6 (the test above); Adam then turns the rounding
    # of near-zero gradients into whole steps of lr (about 2 % of the movement after 6 steps here),
    # so the two are compared by how far each moved: a wiring error (a dropped term, the wrong
    # connector) moves the model elsewhere entirely
    one_pass = {n: client.model.state_dict()[n] - before[n] for n in before}
    two_pass = {n: p.detach() - before[n] for n, p in twin.model.named_parameters()}
    norm = sum(float(d.pow(2).sum()) for d in two_pass.values()) ** 0.5
    apart = sum(float((one_pass[n] - two_pass[n]).pow(2).sum()) for n in before) ** 0.5
    assert norm > 1e-2 and apart / norm < 0.1, (norm, apart)


def test_the_exit_head_alone_learns_while_the_features_stay_as_they_are():
    """The step after the joint personalization trains the exit head at the phone's depth and
    nothing else: every other parameter and every normalization statistic stays bit for bit, so
    what the gate and the server see is unchanged, and the head fits the phone's data better."""
    federation = tiny_federation()
    client = next(c for c in federation.clients if c.split_depth == 3)
    federation.broadcast(client)
    before = {n: t.detach().clone() for n, t in client.model.state_dict().items()}
    head = f"exits.{client.split_depth}."

    def head_loss() -> float:
        with torch.no_grad():
            client.model.eval()
            logits, _ = client.model(client.train_x, client.split_depth)
            return float(torch.nn.functional.cross_entropy(logits, client.train_y))

    loss_before = head_loss()
    client.model.train()
    train_exit_head(client, 2, 16, 0.001, torch.Generator().manual_seed(1))
    after = client.model.state_dict()
    moved = {n for n in before if not torch.equal(before[n], after[n])}
    assert moved and all(n.startswith(head) for n in moved), sorted(moved)[:5]
    assert client.model.training  # the mode it was called in comes back
    assert head_loss() < loss_before


def test_harmony_personalization_ends_with_the_exit_head_epochs():
    """`exit_head_epochs` runs the head-only step after the joint one; 0 leaves it out."""
    calls = []
    for epochs in (0, 2):
        federation = tiny_federation(overrides={"exit_head_epochs": epochs})
        client = next(c for c in federation.clients if c.split_depth == 3)
        federation.broadcast(client)
        with mock.patch("harmony_mobile.algorithms.harmony.train_exit_head") as head_step:
            federation.algorithm.personalize(client, federation.server, torch.Generator().manual_seed(0))
        calls.append(head_step.call_args.args[1])
    assert calls == [0, 2]


@pytest.mark.parametrize("name", ["harmony", "harmony-with-meta"])
def test_a_round_on_reused_working_copies_equals_a_round_on_fresh_copies(name):
    """HARMONY deep-copies theta' and theta_v once per client and resets the ones it uses every round
    (theta' only with the inner loop; without it theta' is theta): a second round must give exactly
    what a new algorithm, copying afresh, gives from the same state."""
    federation = tiny_federation(algorithm=name)
    algo, server = federation.algorithm, federation.server
    client = next(c for c in federation.clients if c.split_depth == 3)
    federation.broadcast(client)
    server.start_round(0)
    algo.client_round(client, server, 0, torch.Generator().manual_seed(1))
    copies = algo._working_copies[client.model]
    for working_copy in copies:  # leave the copies nothing like theta: values, modes, flags, grads
        working_copy.eval()
        for p in working_copy.parameters():
            p.data.add_(1.0)
            p.grad = torch.ones_like(p)
        next(working_copy.parameters()).requires_grad_(False)
    models = algo._round_models(client)
    assert models.variant is copies[1]
    assert models.adapted is (copies[0] if algo.config.meta else client.model)
    for working_copy in copies if algo.config.meta else copies[1:]:  # a fresh deepcopy's state, in place
        assert working_copy.training == client.model.training
        for p, theta in zip(working_copy.parameters(), client.model.parameters(), strict=True):
            assert torch.equal(p, theta) and p.grad is None and p.requires_grad == theta.requires_grad
    fresh_client, fresh_server = copy.deepcopy(client), copy.deepcopy(server)
    fresh_algo = build_algorithm(name, algo.config.model_dump())

    torch.manual_seed(3)  # channel drop draws from the global generator
    reused = algo.client_round(client, server, 1, torch.Generator().manual_seed(2))
    torch.manual_seed(3)
    fresh = fresh_algo.client_round(fresh_client, fresh_server, 1, torch.Generator().manual_seed(2))

    assert algo._working_copies[client.model] is copies  # the round reused the first round's copies
    assert fresh_client.model in fresh_algo._working_copies
    assert reused.weights.keys() == fresh.weights.keys()
    for name in reused.weights:
        assert torch.equal(reused.weights[name], fresh.weights[name]), name
    assert reused.metrics == fresh.metrics


def connector_gradient_of_one_split_step(algorithm: str) -> torch.Tensor:
    federation = tiny_federation(algorithm=algorithm)
    client, server = federation.clients[0], federation.server
    server.start_round(0)
    # another family uploads first: SupCon's positives come from other families only
    other = federation.clients[1]
    federation.broadcast(other)
    images, labels = other.batch(16, torch.Generator().manual_seed(1))
    _, features = other.model(images, other.split_depth)
    split_step(other, server, features, labels, (other.split_depth,) * 16, 0, weight=1.0)
    federation.broadcast(client)
    images, labels = client.batch(16, torch.Generator().manual_seed(0))
    client.model.zero_grad()
    _, features = client.model(images, client.split_depth)
    split_step(client, server, features, labels, (client.split_depth,) * 16, 0, weight=1.0)
    return client.model.connectors[str(client.split_depth)].conv.weight.grad.clone()


def test_contrastive_gradient_reaches_the_connector():
    with_supcon = connector_gradient_of_one_split_step("harmony-with-contrastive")
    without = connector_gradient_of_one_split_step("harmony")
    assert with_supcon.abs().sum() > 0 and without.abs().sum() > 0
    # same seed, same batch, same initial weights: the only difference is the SupCon term
    assert not torch.allclose(with_supcon, without)


def test_threshold_calibration_picks_the_most_permissive_threshold_reaching_the_target():
    confidence = torch.tensor([0.99, 0.95, 0.9, 0.8, 0.7, 0.6])
    correct = torch.tensor([True, True, True, False, True, False])
    assert calibrate_threshold(confidence, correct, 1.0) == pytest.approx(0.9)
    assert calibrate_threshold(confidence, correct, 0.8) == pytest.approx(0.7)
    unreachable = calibrate_threshold(torch.tensor([0.5, 0.4]), torch.tensor([False, False]), 0.9)
    assert unreachable > 0.5


def test_resume_after_interruption_continues_from_the_last_round(tmp_path):
    straight = tiny_federation()
    run_rounds(straight, rounds=2, clients_per_round=4, seed=0, run_path=tmp_path / "a", show_progress=False)

    interrupted = tiny_federation()
    run_rounds(
        interrupted, rounds=1, clients_per_round=4, seed=0, run_path=tmp_path / "b", show_progress=False
    )
    resumed = tiny_federation()  # a new process: fresh objects, state only from the checkpoint
    history = run_rounds(
        resumed, rounds=2, clients_per_round=4, seed=0, run_path=tmp_path / "b", show_progress=False
    )
    assert [h["round"] for h in history] == [1]
    for family, weights in straight.family_weights.items():
        for name, value in weights.items():
            assert torch.equal(value, resumed.family_weights[family][name]), name
    for name, value in straight.server.backend.state_dict().items():
        assert torch.equal(value, resumed.server.backend.state_dict()[name]), name
    lines = (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["round"] for line in lines] == [0, 1]


def test_end_to_end_training_writes_a_run_that_export_and_serve_can_read(tmp_path):
    config = TrainConfig(
        dataset="digits", clients_per_tier=1, rounds=2, algorithm_config=FAST, dataset_limit=900, threads=1
    )
    # a pinned lineage: a fresh secret reorders the slots (and g's initialisation per class), and
    # two rounds this short land anywhere in 0.09-0.24 across secrets; this one's exits at 0.22
    write_federation_secret(tmp_path / "run", b"\x04" * 32)
    (tmp_path / "run" / EPOCH_FILE).write_text("e-test")
    (tmp_path / "run" / EPOCH_FILE).chmod(0o600)
    results = train(config, tmp_path / "run", show_progress=False)
    summary = results["summary"]
    assert 0.0 <= summary["accuracy_with_ood"] <= 1.0
    # the exits learned (above chance, 0.1); the hybrid's slot gate is calibrated on a handful of
    # validation samples per client this small, so its accuracy says little here
    assert summary["exit_only_accuracy_with_ood"] > 0.15
    run = RunDir(tmp_path / "run")
    tiers = {t.name for t in run.info.tiers.tiers}
    assert {c.tier for c in run.clients()} == tiers
    client = run.representative_client("flagship")
    front_end = run.front_end(client)
    exit_logits, features = front_end(torch.zeros(2, 1, 28, 28))
    assert exit_logits.shape == (2, 10) and features.shape == (2, 64, 8, 8)
    loaded = run.backend()
    assert loaded.model_version == run.info.model_version != "in-training"
    assert loaded.backend(features).shape == (2, 10)
    assert loaded.label_epoch == run.info.label_epoch and len(loaded.slot_table) == 10
    assert sorted(run.slot_to_class().tolist()) == list(range(10))  # every class got a slot, decodable
    for path in [tmp_path / "run", *(tmp_path / "run").rglob("*")]:  # owner-only, every file and dir
        assert path.stat().st_mode & 0o077 == 0, path
    assert (tmp_path / "run" / SECRET_FILE).is_file()
    assert run.info.exit_rule == "slot_margin" and -2 <= client.threshold <= 2  # HARMONY's gate, a margin

    with pytest.raises(RunDirError, match="finished"):
        train(config, tmp_path / "run", show_progress=False)
    with pytest.raises(RunDirError, match="different run"):
        train(config.model_copy(update={"seed": 1}), tmp_path / "run", show_progress=False)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    with pytest.raises(RunDirError, match="not empty"):
        train(config, tmp_path / "other", show_progress=False)


@pytest.mark.parametrize("restricted", [True, False])
def test_the_server_ce_runs_over_the_slots_of_the_uploading_client(restricted):
    algorithm = "harmony" if restricted else "harmony-full-softmax"
    federation = tiny_federation(algorithm=algorithm, overrides={"contrastive_weight": 0.0})
    first, second = federation.clients[0], federation.clients[-1]
    server = federation.server
    server.start_round(0)
    generator = torch.Generator().manual_seed(0)
    for client in (first, second):  # both clients' tokens get slots
        federation.broadcast(client)
        images, labels = client.batch(64, generator)
        _, features = client.model(images, client.split_depth)
        split_step(client, server, features, labels, (client.split_depth,) * 64, 0, 1.0, update_server=False)
    mask = server.softmax_mask(first.name)
    slot_class = first.slot_to_class(server.slot_table.tokens).tolist()  # decoded with the client's secret
    own_labels = set(first.exit_labels(torch.tensor(first.classes)).tolist())
    own = {slot for slot, c in enumerate(slot_class) if c in own_labels}
    assert own and len(server.slot_table) > len(own)  # the second client brought slots the first lacks
    open_slots = {i for i in range(10) if mask[i] == 0}
    assert open_slots == (own if restricted else set(range(len(server.slot_table))))


def test_the_reply_is_the_gradient_of_the_slot_ce_at_the_features_and_nothing_else():
    federation = tiny_federation(algorithm="harmony")  # SupCon off by default
    client, server = federation.clients[0], federation.server
    federation.broadcast(client)
    server.start_round(0)
    images, labels = client.batch(16, torch.Generator().manual_seed(1))
    _, features = client.model(images, client.split_depth)
    upload, _ = client.upload(features, labels, (client.split_depth,) * 16, 0)
    reply = server.step(upload, update=False)
    assert set(vars(reply)) == {"client_id", "round_id", "grad_features", "server_loss"}
    z = upload.features.clone().requires_grad_(True)
    slots = server.slot_table.known_slots(upload.label_tokens)
    ce = torch.nn.functional.cross_entropy(server.backend(z) + server.softmax_mask(client.name), slots)
    (expected,) = torch.autograd.grad(ce, z)
    assert torch.allclose(reply.grad_features, expected, atol=1e-6)
    assert reply.server_loss == pytest.approx(ce.item(), rel=1e-5)


def test_a_tier_threshold_replaces_calibration_and_is_refused_for_an_entropy_exit():
    federation = tiny_federation()
    client = federation.clients[0]
    calibrate_client(client, 0.98)
    calibrated = client.threshold
    client.tier = client.tier.model_copy(update={"threshold": 0.5 if calibrated != 0.5 else 0.6})
    calibrate_client(client, 0.98)
    assert client.threshold == client.tier.threshold != calibrated
    with pytest.raises(ValueError, match="fixes a max-softmax threshold"):
        calibrate_client(client, 0.98, rule="neg_entropy")


def test_training_refuses_a_tier_threshold_for_an_entropy_exit_before_touching_the_run_dir(tmp_path):
    tiers = {"tiers": [{"name": "t", "family": "cnn", "split_depth": 1, "threshold": 0.9}]}
    tiers_file = tmp_path / "tiers.yaml"
    tiers_file.write_text(yaml.safe_dump(tiers))
    config = TrainConfig(dataset="digits", tiers_file=str(tiers_file), algorithm="splitgp")
    with pytest.raises(ValueError, match="fix a max-softmax exit threshold, but 'splitgp'"):
        train(config, tmp_path / "run", show_progress=False)
    assert not (tmp_path / "run").exists()
