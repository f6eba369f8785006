"""The ExecuTorch export steps, each small and testable alone.

    select_front_end -> wrap_front_end -> export_program -> [quantize_int8_pt2e] -> lower_to_xnnpack
    -> assert_fully_delegated -> serialize -> (verify.py) -> (manifest.py)

Version-specific traps of torch 2.13 / executorch 1.5.1 / torchao 0.18 handled here:
  * a dynamic batch traced with an example batch < 16 is planned for at most 15 whatever
    `Dim(max=...)` says. We trace with example batch = max batch and assert the planned size.
  * a PT2E module keeps the export's shape guards; calibration runs at exported shapes.
  * torchao weight-only int8 configs lower "fine" but ignore the weight scales; we only use
    PT2E static per-channel with the XNNPACK quantizer, and verify.py compares every .pte to eager.
  * int8 outputs: the layer computing exit_logits stays fp32 (see FLOAT_OUTPUTS below:
    int8-rounded logits turn near-ties into exact ties).
  * a missing partitioner still gives a valid but ~100x slower .pte; `assert_fully_delegated`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from harmony_mobile.logs import native_stderr_to_log_file
from harmony_mobile.models import FrontEnd
from harmony_mobile.run_dir import ClientArtifact, RunDir, RunDirError


class ExportError(RuntimeError):
    """An export step failed or produced an artifact that does not meet its contract."""


class ExportInputError(ExportError):
    """The export was asked for something it cannot do (a tier, an output path): nothing was written."""


# --------------------------------------------------------------------------- select + wrap


def select_front_end(run: RunDir, tier_name: str) -> tuple[ClientArtifact, FrontEnd]:
    """The personalized front-end shipped for a tier: the run's representative client of that tier."""
    client = run.representative_client(tier_name)
    try:
        return client, run.front_end(client)
    except RuntimeError as error:  # load_state_dict: missing / unexpected keys or shape mismatches
        first_lines = "\n".join(str(error).splitlines()[:3])
        raise RunDirError(
            f"client {client.client_id}'s front-end in {run.path} does not fit tier {tier_name!r} "
            f"with this version of harmony_mobile.models (written by another version?): {first_lines}"
        ) from None


class ExitAndFeatures(nn.Module):
    """What a phone runs: image (N, C, H, W) -> (exit_logits (N, classes), features (N, *interface)).

    A thin wrapper so every exported graph has exactly this signature, whatever module is inside.
    """

    output_names = ("exit_logits", "features")

    def __init__(self, front_end: nn.Module):
        super().__init__()
        self.front_end = front_end

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        exit_logits, features = self.front_end(image)
        return exit_logits, features


def wrap_front_end(
    front_end: nn.Module, input_shape: tuple[int, int, int], num_classes: int
) -> ExitAndFeatures:
    """Wrap and check (with one eager call) that the module really returns (logits, features)."""
    wrapped = ExitAndFeatures(copy.deepcopy(front_end)).eval()
    with torch.no_grad():
        outputs = wrapped(torch.zeros(1, *input_shape))
    if len(outputs) != 2 or outputs[0].shape != (1, num_classes) or outputs[1].dim() != 4:
        shapes = [tuple(o.shape) for o in outputs]
        raise ExportError(
            f"front-end must return (exit_logits (1, {num_classes}), features (1, C, H, W)), got {shapes}"
        )
    return wrapped


def output_shapes(module: nn.Module, input_shape: tuple[int, int, int]) -> tuple[list[int], list[int]]:
    with torch.no_grad():
        logits, features = module(torch.zeros(1, *input_shape))
    return list(logits.shape), list(features.shape)


# --------------------------------------------------------------------------- torch.export


def example_batch_size(max_batch: int) -> int:
    """Batch of the example input: 1 for a static .pte; the max itself for a dynamic one (an example
    batch below 16 is planned for at most 15)."""
    if max_batch < 1:
        raise ValueError(f"max batch must be >= 1, got {max_batch}")
    return max_batch


def export_program(
    module: nn.Module, input_shape: tuple[int, int, int], max_batch: int = 1
) -> torch.export.ExportedProgram:
    """torch.export with batch 1 (static) or a dynamic batch 1..max_batch."""
    example = (torch.randn(example_batch_size(max_batch), *input_shape),)
    dynamic_shapes = None
    if max_batch > 1:
        dynamic_shapes = ({0: torch.export.Dim("batch", min=1, max=max_batch)},)
    if not isinstance(module, torch.fx.GraphModule):  # a PT2E GraphModule refuses .eval()
        module = module.eval()
    with torch.no_grad():
        return torch.export.export(module, example, dynamic_shapes=dynamic_shapes)


# --------------------------------------------------------------------------- PT2E int8


# The layer that computes `exit_logits` stays fp32 inside the int8 program. The phone
# decides on these logits (argmax, and max softmax >= threshold for answering locally), and an int8
# output tensor rounds them to one per-tensor step (0.39 logits on the MobileNet tier) and clips them
# where the calibration histogram ends (+30 while real logits reach +40): near-ties become exact ties,
# which argmax breaks towards the lower class. On 2.7k images of the mid-android client's classes,
# 30 of 34 int8-vs-fp32 top-1 flips were such ties; with this layer in fp32 there are no ties and
# 17 flips, all at fp32 top-2 margins < 0.5 logits (plain int8 noise: every other layer, depthwise
# convs included, contributes about equally). Every tier's flips drop 1.8-3.4x. Cost: one small
# Linear (hidden x classes) in fp32, ~1 KB, run by XNNPACK in the same delegate. The `features`
# output stays int8: an fp32 connector did not change back-end agreement but adds up to ~28 KB.
# Measurements and alternatives tried: export/README.md, "int8: what is quantized".
FLOAT_OUTPUTS = (0,)  # indices into ExitAndFeatures' outputs: exit_logits
_LAYER_OPS = (torch.ops.aten.conv2d.default, torch.ops.aten.linear.default)
_PASS_THROUGH_OPS = (
    torch.ops.aten.relu.default,
    torch.ops.aten.reshape.default,
    torch.ops.aten.view.default,
    torch.ops.aten.flatten.using_ints,
)


def output_layer_nodes(graph: torch.fx.Graph, outputs: tuple[int, ...] = FLOAT_OUTPUTS) -> set[str]:
    """Names of the nodes computing the given graph outputs: walking back from each output through
    activation/reshape ops to the first conv or linear, all included (empty when there is none)."""
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    names: set[str] = set()
    for index in outputs:
        node, walked = output.args[0][index], []
        while isinstance(node, torch.fx.Node) and node.target in _PASS_THROUGH_OPS:
            walked.append(node.name)
            node = node.args[0]
        if isinstance(node, torch.fx.Node) and node.target in _LAYER_OPS:
            names.update(walked + [node.name])
    return names


def _not_an_output_layer(node: torch.fx.Node) -> bool:
    """XNNPACK quantizer filter: quantize every node except those computing FLOAT_OUTPUTS."""
    return node.name not in output_layer_nodes(node.graph)


def xnnpack_quantizer():
    """Static int8, per-channel weights, for every supported op except the exit-logits layer (above)."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    quantizer = XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=True, is_dynamic=False)
    )
    return quantizer.set_filter_function(_not_an_output_layer)


def float_layers(program: torch.fx.GraphModule) -> list[str]:
    """Module paths of the convs/linears of a PT2E-converted program whose weights are not int8."""
    names = []
    for node in program.graph.nodes:
        if node.op == "call_function" and node.target in _LAYER_OPS:
            weight = node.args[1]
            if not (isinstance(weight, torch.fx.Node) and "dequantize" in str(weight.target)):
                stack = node.meta.get("nn_module_stack") or {"": (node.name, None)}
                names.append(list(stack.values())[-1][0])
    return names


def quantize_int8_pt2e(
    module: nn.Module,
    input_shape: tuple[int, int, int],
    calibration: torch.Tensor,
    max_batch: int = 1,
) -> nn.Module:
    """PT2E static int8, per-channel weights (XNNPACK quantizer), calibrated on `calibration` images;
    the exit-logits layer stays fp32 (FLOAT_OUTPUTS).

    Returns the converted GraphModule (the eager simulation of the int8 program; it keeps the
    export's batch guards, so call it with batches in 1..max_batch).
    """
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    if calibration.dim() != 4 or tuple(calibration.shape[1:]) != tuple(input_shape) or len(calibration) == 0:
        raise ExportError(
            f"calibration data must be a non-empty (N, {', '.join(map(str, input_shape))}) tensor, "
            f"got {tuple(calibration.shape)}"
        )
    graph = export_program(copy.deepcopy(module), input_shape, max_batch).module()
    prepared = prepare_pt2e(graph, xnnpack_quantizer())
    with torch.no_grad():
        for start in range(0, len(calibration), max_batch):
            prepared(calibration[start : start + max_batch])
    return convert_pt2e(prepared)


# --------------------------------------------------------------------------- lowering


def lower_to_xnnpack(program: torch.export.ExportedProgram):
    """Edge dialect + XNNPACK partitioner -> ExecutorchProgramManager (`.buffer` is the .pte)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    return to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch()


DELEGATE_OPS = ("executorch_call_delegate", "getitem")


def _top_level_graph(program) -> torch.fx.Graph:
    if hasattr(program, "exported_program"):
        program = program.exported_program()
    if hasattr(program, "graph_module"):
        return program.graph_module.graph
    if isinstance(program, torch.fx.GraphModule):
        return program.graph
    raise TypeError(f"cannot find a graph in {type(program).__name__}")


def delegation_summary(program) -> dict:
    """{'delegates': number of delegate calls, 'undelegated': [ops left outside any delegate]}."""
    delegates, undelegated = 0, []
    for node in _top_level_graph(program).nodes:
        if node.op != "call_function":
            continue
        name = getattr(node.target, "__name__", str(node.target))
        if name == "executorch_call_delegate":
            delegates += 1
        elif name != "getitem":
            undelegated.append(str(node.target))
    return {"delegates": delegates, "undelegated": undelegated}


def assert_fully_delegated(program) -> int:
    """Raise unless the top-level graph holds only executorch_call_delegate / getitem; returns the delegate count."""
    summary = delegation_summary(program)
    if summary["undelegated"] or summary["delegates"] == 0:
        raise ExportError(
            f"program is not fully delegated to XNNPACK: {summary['delegates']} delegate(s), "
            f"ops left on portable kernels: {summary['undelegated'] or 'none, but no delegate either'}"
        )
    return summary["delegates"]


def serialize(program, path: str | Path) -> int:
    """Write the .pte; returns its size in bytes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = program.buffer
    path.write_bytes(data)
    return len(data)


# --------------------------------------------------------------------------- runtime


def load_method(pte: str | Path | bytes):
    """The `forward` method of a .pte, loaded with the ExecuTorch Python runtime."""
    source = pte if isinstance(pte, bytes) else str(pte)
    with native_stderr_to_log_file():  # creating the threadpool, if not yet done, prints cpuinfo lines
        from executorch.runtime import Runtime

        return Runtime.get().load_program(source).load_method("forward")


def planned_input_shape(pte: str | Path | bytes) -> tuple[int, ...]:
    return tuple(load_method(pte).metadata.input_tensor_meta(0).sizes())


def assert_planned_batch(pte: str | Path | bytes, max_batch: int) -> None:
    """The memory plan must hold `max_batch` (an example batch below 16 silently plans 15)."""
    planned = planned_input_shape(pte)[0]
    if planned != max_batch:
        raise ExportError(
            f".pte is planned for batch {planned}, expected max batch {max_batch} (was the example batch below 16?)"
        )


def set_threads(threads: int) -> None:
    """Torch intra-op threads and the ExecuTorch (XNNPACK) threadpool, set to the same number."""
    torch.set_num_threads(threads)
    # the first query creates the threadpool (cpuinfo lines); a resize prints "Resetting threadpool"
    with native_stderr_to_log_file():
        from executorch.extension.pybindings import portable_lib

        if portable_lib._threadpool_get_thread_count() != threads:
            portable_lib._unsafe_reset_threadpool(threads)


# --------------------------------------------------------------------------- one .pte


@dataclass
class PteBuild:
    quantization: str
    buffer: bytes
    delegates: int
    max_batch: int
    reference: nn.Module  # the eager module the .pte must match (fp32 wrapper, or PT2E converted module)
    float_layers: list[str]  # int8: the layers left in fp32 (module paths); fp32: empty


def build_pte(
    module: nn.Module,
    input_shape: tuple[int, int, int],
    quantization: str,
    calibration: torch.Tensor | None = None,
    max_batch: int = 1,
) -> PteBuild:
    """export -> (int8: PT2E quantize, re-export) -> lower -> assert delegation -> planned batch check."""
    if quantization == "fp32":
        reference = module
    elif quantization == "int8":
        if calibration is None:
            raise ExportError("int8 export needs calibration images")
        reference = quantize_int8_pt2e(module, input_shape, calibration, max_batch)
    else:
        raise ExportError(f"quantization {quantization!r} is not an ExecuTorch/XNNPACK variant (fp32, int8)")
    program = lower_to_xnnpack(export_program(reference, input_shape, max_batch))
    delegates = assert_fully_delegated(program)
    buffer = program.buffer
    assert_planned_batch(buffer, max_batch)
    kept_float = float_layers(reference) if quantization == "int8" else []
    return PteBuild(quantization, buffer, delegates, max_batch, reference, kept_float)


# --------------------------------------------------------------------------- server back-end


def export_backend(source: str | Path, directory: str | Path, max_batch: int = 256) -> dict:
    """Copy RUN_DIR/backend.pt (run_dir.save_backend format, loaded by the server) to
    `directory/backend.pt` and write `directory/backend.pt2`: torch.export of g (features -> logits),
    dynamic batch 1..max_batch for the server's micro-batching, and `directory/backend.onnx`, what a
    replica without torch serves (harmony_mobile/onnx_backend.py). Returns facts for the manifest."""
    import shutil

    from harmony_mobile.run_dir import load_backend_file

    loaded = load_backend_file(source)  # fails with RunDirError when missing or unreadable
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, directory / "backend.pt")
    copy_ = load_backend_file(directory / "backend.pt")  # the copy must load exactly like the source
    backend = loaded.backend.eval()
    interface = list(backend.interface.shape)
    example = torch.randn(min(max_batch, 4), *interface)
    dynamic = ({0: torch.export.Dim("batch", min=1, max=max_batch)},)
    with torch.no_grad():
        program = torch.export.export(backend, (example,), dynamic_shapes=dynamic)
        torch.export.save(program, directory / "backend.pt2")
        reloaded = torch.export.load(directory / "backend.pt2").module()
        probe = torch.randn(3, *interface)
        max_abs = float((reloaded(probe) - copy_.backend(probe)).abs().max())
    if max_abs > FP32_BACKEND_MAX_ABS:
        raise ExportError(f"backend.pt2 differs from the eager back-end by {max_abs:.3g}")
    onnx_max_abs = export_backend_onnx(directory / "backend.pt", copy_, probe)
    return {
        "model_version": loaded.model_version,
        "interface_shape": interface,
        "num_classes": backend.num_classes,
        "class_names": list(loaded.class_names),
        "max_batch": max_batch,
        "max_abs_vs_eager": max_abs,
        "onnx_max_abs_vs_eager": onnx_max_abs,
    }


def export_backend_onnx(pt_file: Path, loaded, probe: torch.Tensor) -> float:
    """`backend.onnx` beside `pt_file`, checked against PyTorch on the replay set's first rows (the
    features the back-end is meant for) plus `probe`; returns the max |logit difference|."""
    from harmony_mobile.protocol.digests import sha256_file
    from harmony_mobile.run_dir import save_backend_onnx

    sample = torch.cat([loaded.replay[:64].float(), probe])
    try:
        return save_backend_onnx(
            pt_file.with_name("backend.onnx"),
            loaded.backend,
            loaded.model_version,
            loaded.slot_table,
            sha256_file(pt_file),
            int(loaded.replay.shape[0]),
            sample,
        )
    except ValueError as error:
        raise ExportError(f"backend.onnx: {error}") from None


FP32_BACKEND_MAX_ABS = 1e-5
