"""Each ExecuTorch export step alone, on a small random-initialized front-end and the digits data."""

from __future__ import annotations

import copy

import pytest
import torch
from harmony_mobile.export import steps
from harmony_mobile.export.coreml import check_spec
from harmony_mobile.export.steps import ExportError
from harmony_mobile.export.verify import (
    check_fp32,
    check_int8_not_broken,
    compare_outputs,
    run_eager,
    run_pte,
)
from torch import nn

from harmony_mobile.models import FamilyModel, InterfaceSpec
from harmony_mobile.run_dir import RunDir, RunDirError, load_backend_file
from tests.export_fixtures import digits_or_random, make_run_dir

SHAPE = (1, 28, 28)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    steps.set_threads(1)


@pytest.fixture(scope="module")
def data():
    dataset = digits_or_random()
    return dataset.images, dataset.labels


@pytest.fixture(scope="module")
def module():
    torch.manual_seed(0)
    front_end = FamilyModel("cnn", 1, 28, 10, 1.0, InterfaceSpec()).front_end(1)
    return steps.wrap_front_end(front_end, SHAPE, 10)


@pytest.fixture(scope="module")
def fp32_build(module):
    return steps.build_pte(module, SHAPE, "fp32")


@pytest.fixture(scope="module")
def int8_build(module, data):
    images, _ = data
    return steps.build_pte(module, SHAPE, "int8", calibration=images[:128])


def test_select_front_end_is_the_tiers_representative_client(tmp_path):
    run = RunDir(make_run_dir(tmp_path / "run"))
    client, front_end = steps.select_front_end(run, "mid-ios")
    assert client.tier == "mid-ios" and client.client_id == run.clients_for_tier("mid-ios")[0].client_id
    for name, tensor in front_end.state_dict().items():
        assert torch.equal(tensor, client.front_end_state[name])
    with pytest.raises(KeyError, match="unknown tier 'nope'"):
        steps.select_front_end(run, "nope")


def test_wrap_front_end_checks_the_output_contract(module):
    logits, features = module(torch.zeros(2, *SHAPE))
    assert logits.shape == (2, 10) and features.shape == (2, 64, 8, 8)
    assert steps.output_shapes(module, SHAPE) == ([1, 10], [1, 64, 8, 8])

    class OneOutput(nn.Module):
        def forward(self, image):
            return image.mean((2, 3)), image

    with pytest.raises(ExportError, match="must return"):
        steps.wrap_front_end(OneOutput(), SHAPE, 10)


def test_export_program_static_and_dynamic(module):
    static = steps.export_program(module, SHAPE)
    assert static.module()(torch.zeros(1, *SHAPE))[0].shape == (1, 10)
    dynamic = steps.export_program(module, SHAPE, max_batch=20)
    assert dynamic.module()(torch.zeros(5, *SHAPE))[1].shape == (5, 64, 8, 8)
    assert steps.example_batch_size(20) == 20  # never < 16 for a large max batch


def test_fp32_pte_matches_eager_and_is_fully_delegated(module, fp32_build, data, tmp_path):
    images, labels = data
    assert fp32_build.delegates == 1
    size = steps.serialize(fp32_build, tmp_path / "front.pte")
    assert size == (tmp_path / "front.pte").stat().st_size > 0
    assert steps.planned_input_shape(tmp_path / "front.pte") == (1, *SHAPE)
    method = steps.load_method(tmp_path / "front.pte")
    parity = compare_outputs(run_eager(module, images[:64]), run_pte(method, images[:64]), labels[:64])
    assert parity.max_abs_logits <= 1e-4 and parity.max_abs_features <= 1e-4
    assert parity.top1_agreement == 1.0
    check_fp32(parity, "front.pte")


def test_undelegated_program_is_refused(module):
    from executorch.exir import to_edge_transform_and_lower

    portable = to_edge_transform_and_lower(
        steps.export_program(module, SHAPE), partitioner=[]
    ).to_executorch()
    summary = steps.delegation_summary(portable)
    assert summary["delegates"] == 0 and summary["undelegated"]
    with pytest.raises(ExportError, match="not fully delegated"):
        steps.assert_fully_delegated(portable)


def test_int8_pte_is_close_to_eager_and_matches_its_pt2e_simulation(module, int8_build, fp32_build, data):
    images, labels = data
    assert int8_build.delegates == 1
    assert len(int8_build.buffer) < 0.6 * len(fp32_build.buffer)
    method = steps.load_method(int8_build.buffer)
    outputs = run_pte(method, images[200:264])
    versus_fp32 = compare_outputs(run_eager(module, images[200:264]), outputs, labels[200:264])
    check_int8_not_broken(versus_fp32, "int8")
    assert versus_fp32.rel_l2_logits < 0.1 and versus_fp32.rel_l2_features < 0.1
    versus_simulation = compare_outputs(run_eager(int8_build.reference, images[200:264]), outputs)
    assert versus_simulation.rel_l2_logits < 0.02 and versus_simulation.rel_l2_features < 0.02


def _layer_nodes(program):
    layers = (torch.ops.aten.conv2d.default, torch.ops.aten.linear.default)
    return [n for n in program.graph.nodes if n.op == "call_function" and n.target in layers]


def _weight_is_int8(layer) -> bool:
    weight = layer.args[1]
    return isinstance(weight, torch.fx.Node) and "dequantize_per_channel" in str(weight.target)


@pytest.mark.parametrize("family, depth", [("cnn", 1), ("mobilenet", 2)])
def test_int8_keeps_only_the_exit_logits_layer_fp32_and_stays_fully_delegated(family, depth, data):
    """int8-rounded exit logits turn near-ties into exact ties (argmax then picks the lower
    class). The layer computing exit_logits stays fp32; every other conv/linear (depthwise
    included) keeps int8 per-channel weights, and the .pte is still one XNNPACK delegate."""
    images, _ = data
    torch.manual_seed(0)
    front_end = FamilyModel(family, 1, 28, 10, 1.0, InterfaceSpec()).front_end(depth)
    module = steps.wrap_front_end(front_end, SHAPE, 10)
    build = steps.build_pte(module, SHAPE, "int8", calibration=images[:32])
    assert build.float_layers == ["front_end.exit_head.mlp.2"] and build.delegates == 1

    program = build.reference
    output = next(n for n in program.graph.nodes if n.op == "output")
    exit_layer = output.args[0][0]
    assert exit_layer.target == torch.ops.aten.linear.default and not _weight_is_int8(exit_layer)
    others = [n for n in _layer_nodes(program) if n is not exit_layer]
    assert others and all(_weight_is_int8(n) for n in others)
    if family == "mobilenet":
        depthwise = [n for n in others if len(n.args) > 6 and n.args[6] > 1]  # conv2d groups
        assert len(depthwise) == 4  # one per inverted residual, two per stage, all int8
    # the logits are not on an int8 grid: an int8 output has at most 256 distinct values
    logits, _ = run_eager(program, images[:64])
    assert logits.unique().numel() > 256


def test_output_layer_nodes_walks_back_through_activations_and_reshapes():
    class TwoOutputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.linear = nn.Conv2d(1, 4, 3), nn.Linear(4 * 26 * 26, 10)

        def forward(self, image):
            features = torch.relu(self.conv(image))
            return self.linear(features.reshape(-1, 4 * 26 * 26)), features.reshape(-1, 4, 26, 26)

    graph = steps.export_program(TwoOutputs(), SHAPE).module().graph
    targets = {n.name: n.target for n in graph.nodes}
    exit_nodes = steps.output_layer_nodes(graph)
    assert [targets[n] for n in exit_nodes] == [torch.ops.aten.linear.default]
    feature_nodes = steps.output_layer_nodes(graph, (1,))
    assert sorted(str(targets[n]) for n in feature_nodes) == [
        "aten.conv2d.default",
        "aten.relu.default",
        "aten.reshape.default",
    ]


def test_quantize_int8_refuses_bad_calibration(module):
    with pytest.raises(ExportError, match="calibration"):
        steps.quantize_int8_pt2e(module, SHAPE, torch.zeros(4, 3, 32, 32))
    with pytest.raises(ExportError, match="calibration"):
        steps.build_pte(module, SHAPE, "int8", calibration=None)
    with pytest.raises(ExportError, match="not an ExecuTorch"):
        steps.build_pte(module, SHAPE, "coreml-fp16")


def test_comparison_helper_catches_ignored_scales_on_synthetic_outputs():
    torch.manual_seed(0)
    logits, features = torch.randn(32, 10), torch.rand(32, 64, 8, 8)
    good = compare_outputs((logits, features), (logits + 0.01 * torch.randn_like(logits), features))
    check_int8_not_broken(good, "good")
    # scales ignored: the int8 weights act as if scale = 1, so outputs are ~1/scale (100-1000x) too large
    for broken in [(logits * 300, features), (logits, features * 0 + 1), (logits * float("nan"), features)]:
        with pytest.raises(ExportError, match="int8 output is wrong"):
            check_int8_not_broken(compare_outputs((logits, features), broken), "broken")


def test_a_really_broken_int8_lowering_is_caught(module, data):
    """torchao weight-only int8 lowers fully to XNNPACK but ignores the scales.
    Our comparison must flag that path, which proves it would flag such a bug in our own int8 path."""
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    images, _ = data
    broken = copy.deepcopy(module)
    quantize_(broken, Int8WeightOnlyConfig())  # Linear layers only: the exit head
    program = steps.lower_to_xnnpack(steps.export_program(broken, SHAPE))
    steps.assert_fully_delegated(program)  # delegation alone does not reveal the bug
    outputs = run_pte(steps.load_method(program.buffer), images[:16])
    parity = compare_outputs(run_eager(module, images[:16]), outputs)
    with pytest.raises(ExportError, match="int8 output is wrong"):
        check_int8_not_broken(parity, "weight-only int8")


def test_dynamic_batch_pte_plans_the_max_batch_and_matches_eager(module, data):
    images, _ = data
    build = steps.build_pte(module, SHAPE, "fp32", max_batch=20)
    assert steps.planned_input_shape(build.buffer)[0] == 20
    method = steps.load_method(build.buffer)
    for batch in (1, 7, 20):
        parity = compare_outputs(
            run_eager(module, images[:batch], batch), run_pte(method, images[:batch], batch)
        )
        assert max(parity.max_abs_logits, parity.max_abs_features) <= 1e-4
    with pytest.raises(RuntimeError):
        method.execute([images[:21].contiguous()])


def test_planned_batch_check_catches_the_f3_trap(module):
    """Traced with an example batch < 16, XNNPACK plans batch 15 whatever Dim(max) says."""
    dim = torch.export.Dim("batch", min=1, max=32)
    program = torch.export.export(module, (torch.zeros(8, *SHAPE),), dynamic_shapes=({0: dim},))
    lowered = steps.lower_to_xnnpack(program)
    with pytest.raises(ExportError, match="planned for batch 15"):
        steps.assert_planned_batch(lowered.buffer, 32)


def test_export_backend_writes_state_dict_copy_and_pt2(tmp_path):
    run = make_run_dir(tmp_path / "run", clients_per_tier=1)
    facts = steps.export_backend(run / "backend.pt", tmp_path / "out" / "backend", max_batch=64)
    assert facts["model_version"] == "test-run-v1" and facts["interface_shape"] == [64, 8, 8]
    assert (tmp_path / "out/backend/backend.pt").read_bytes() == (run / "backend.pt").read_bytes()
    loaded = load_backend_file(tmp_path / "out/backend/backend.pt")
    program = torch.export.load(tmp_path / "out/backend/backend.pt2").module()
    z = torch.randn(33, 64, 8, 8)
    with torch.no_grad():
        assert torch.allclose(program(z), loaded.backend(z), atol=1e-5)
    with pytest.raises(RunDirError, match="no server back-end"):
        steps.export_backend(tmp_path / "missing.pt", tmp_path / "out2")


def test_coreml_spec_check_names_what_is_wrong():
    good = {
        "inputs": [{"name": "image", "shape": [1, 1, 28, 28]}],
        "outputs": [{"name": "exit_logits"}, {"name": "features"}],
        "model_type": "mlProgram",
        "specification_version": 7,
    }
    check_spec(good, SHAPE)
    with pytest.raises(ExportError, match="outputs must be"):
        check_spec({**good, "outputs": [{"name": "linear"}, {"name": "relu"}]}, SHAPE)
    with pytest.raises(ExportError, match="input must be"):
        check_spec({**good, "inputs": [{"name": "x", "shape": [1, 1, 28, 28]}]}, SHAPE)
    with pytest.raises(ExportError, match="iOS 16"):
        check_spec({**good, "specification_version": 6}, SHAPE)


def test_coreml_mac_check_compares_and_refuses_to_run_off_a_mac(tmp_path):
    import numpy as np
    from harmony_mobile.export import check_coreml_on_mac

    logits, features = np.eye(4, dtype=np.float32), np.ones((4, 2, 2, 2), dtype=np.float32)
    stats = check_coreml_on_mac.compare(logits, features, logits * 1.001, features)
    assert stats["top1_agreement"] == 1.0 and stats["rel_l2_logits"] == pytest.approx(1e-3, rel=1e-2)
    if __import__("sys").platform != "darwin":
        assert check_coreml_on_mac.main([str(tmp_path)]) == 2


def test_quality_checks():
    from harmony_mobile.export.verify import tier_checks, variant_verdicts

    def row(quantization, size, agreed, samples, acc_ref, acc):
        parity = {
            "max_abs_logits": 0.0 if quantization == "fp32" else 0.3,
            "max_abs_features": 0.0,
            "samples": samples,
            "top1_agreements": agreed,
            "top1_agreement": agreed / samples,
            "labelled_samples": samples,
            "accuracy_reference": acc_ref,
            "accuracy_candidate": acc,
        }
        return {"quantization": quantization, "size": size, "undelegated": [], "vs_eager_fp32": parity}

    big = {
        "parameters": 314_090,
        "pte": [row("fp32", 1000, 1000, 1000, 0.9, 0.9), row("int8", 300, 990, 1000, 0.9, 0.895)],
    }
    assert all(tier_checks(big).values())
    small = {
        "parameters": 13_498,
        "pte": [row("fp32", 1000, 98, 98, 0.9, 0.9), row("int8", 600, 96, 98, 0.9, 0.88)],
    }
    checks = tier_checks(small)
    assert checks["int8_size_le_half_fp32"] is None  # the size rule applies above 100k parameters only
    assert checks["int8_top1_agreement_ge_98"] is False and checks["int8_exit_acc_within_1pt"] is False
    assert checks["int8_agreement_resolves_1pt"] is False  # 98 images: +-2.9 points
    small["checks"], small["coreml"] = checks, [{"quantization": "coreml-fp16"}]
    assert variant_verdicts(small) == {
        "fp32": ("pass", []),
        "int8": (
            "fail",
            ["int8_top1_agreement_ge_98", "int8_agreement_resolves_1pt", "int8_exit_acc_within_1pt"],
        ),
        "coreml-fp16": ("not_checked", []),
    }
    big["pte"][1]["size"] = 600
    assert tier_checks(big)["int8_size_le_half_fp32"] is False


def test_agreement_interval_and_the_samples_that_resolve_one_point():
    from harmony_mobile.export.verify import samples_to_resolve, wilson_interval

    assert samples_to_resolve() == 753  # 1.96^2 * 0.98 * 0.02 / 0.01^2, rounded up
    low, high = wilson_interval(980, 1000)
    assert (round(low, 4), round(high, 4)) == (0.9693, 0.9870)  # +-0.9 points
    low, high = wilson_interval(96, 98)
    assert high - low > 0.05  # the old sample size: a flip is a point, the interval five
    assert wilson_interval(0, 0) == (0.0, 1.0) and wilson_interval(10, 10)[1] == 1.0


def test_verification_md_never_rounds_a_failing_agreement_up_to_the_target():
    from harmony_mobile.export.verify import render_markdown, tier_checks

    parity = {
        "samples": 98,
        "top1_agreements": 96,
        "top1_agreement": 96 / 98,
        "labelled_samples": 98,
        "max_abs_logits": 0.3,
        "max_abs_features": 0.1,
        "accuracy_reference": 0.9,
        "accuracy_candidate": 0.9,
        "rel_l2_logits": 0.01,
        "rel_l2_features": 0.01,
    }
    latency = {"eager_ms": 1.0, "pte_ms": 0.5, "pte_over_eager": 0.5}
    pte = {"quantization": "int8", "size": 10, "delegates": 1, "undelegated": [], "vs_eager_fp32": parity}
    tier = {"tier": "t", "parameters": 10, "test_samples": 98, "pte": [{**pte, "latency_batch1": latency}]}
    tier["checks"] = tier_checks(tier)
    report = {"model_version": "v", "run": "r", "dataset": "d", "threads": 1, "latency_runs": 1}
    report |= {"tiers": [tier], "backend": {"exported_program_file": "b", "max_abs_vs_eager": 0.0}}
    markdown = render_markdown(report)
    assert "0.980" not in markdown and "96/98 = 97.96 %" in markdown
    line = next(line for line in markdown.splitlines() if "int8_top1_agreement_ge_98" in line)
    assert "96/98 = 97.96 %" in line and "**FAIL**" in line
