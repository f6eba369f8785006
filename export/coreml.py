"""Core ML export: ML Program .mlpackage (iOS 16+), fp16, plus int8-weight and 4-bit palettized variants.

Works on Linux for conversion, compression and spec inspection; predictions need macOS
(check_coreml_on_mac.py does the numeric parity check there). `run_decompositions({})` before
`ct.convert` is required for an ExportedProgram (coremltools refuses the TRAINING dialect that torch.export returns).
"""

from __future__ import annotations

import contextlib
import importlib
from pathlib import Path
from unittest import mock

import torch
from harmony_mobile.export.steps import ExportError
from torch import nn

COREML_VARIANTS = ("coreml-fp16", "coreml-int8", "coreml-palette4")
INPUT_NAME = "image"
OUTPUT_NAMES = ("exit_logits", "features")
MINIMUM_TARGET = "iOS16"


def _ct():
    import coremltools as ct

    return ct


@contextlib.contextmanager
def quiet_progress_bars():
    """coremltools prints a tqdm bar per conversion pass; inside our rich progress bar that is noise."""

    def plain(iterable=None, *args, **kwargs):
        return iterable

    targets = (
        ("coremltools.converters.mil.frontend.torch.ops", "_tqdm"),
        ("coremltools.converters.mil.mil.passes.pass_pipeline", "tqdm"),
        ("coremltools.optimize.coreml._quantization_passes", "tqdm"),
    )
    with contextlib.ExitStack() as stack:
        for target, name in targets:
            try:
                module = importlib.import_module(target)
            except ImportError:
                continue
            if hasattr(module, name):
                stack.enter_context(mock.patch.object(module, name, plain))
        yield


def convert_to_coreml(module: nn.Module, input_shape: tuple[int, int, int]):
    """fp16 ML Program with input `image` (1, C, H, W) and outputs `exit_logits`, `features`."""
    ct = _ct()
    example = (torch.zeros(1, *input_shape),)
    with torch.no_grad():
        program = torch.export.export(module.eval(), example).run_decompositions({})
    return ct.convert(
        program,
        convert_to="mlprogram",
        minimum_deployment_target=getattr(ct.target, MINIMUM_TARGET),
        compute_precision=ct.precision.FLOAT16,
        inputs=[ct.TensorType(name=INPUT_NAME, shape=example[0].shape)],
        outputs=[ct.TensorType(name=name) for name in OUTPUT_NAMES],
    )


def compress(mlmodel, variant: str):
    """The variant of an fp16 ML Program: unchanged, int8 linear weights, or 4-bit k-means palettized."""
    import coremltools.optimize.coreml as cto

    if variant == "coreml-fp16":
        return mlmodel
    if variant == "coreml-int8":
        op_config = cto.OpLinearQuantizerConfig(mode="linear_symmetric", dtype="int8", weight_threshold=0)
        return cto.linear_quantize_weights(mlmodel, cto.OptimizationConfig(global_config=op_config))
    if variant == "coreml-palette4":
        op_config = cto.OpPalettizerConfig(mode="kmeans", nbits=4, weight_threshold=0)
        return cto.palettize_weights(mlmodel, cto.OptimizationConfig(global_config=op_config))
    raise ExportError(f"unknown Core ML variant {variant!r}; known: {', '.join(COREML_VARIANTS)}")


def save_mlpackage(mlmodel, path: str | Path) -> Path:
    path = Path(path)
    if path.suffix != ".mlpackage":
        raise ExportError(f"a Core ML ML Program is saved as a .mlpackage directory, got {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    mlmodel.save(str(path))
    return path


def export_coreml_variants(
    module: nn.Module, input_shape: tuple[int, int, int], variants: list[str], paths: dict[str, Path]
) -> dict[str, Path]:
    """Convert once (fp16), derive and save each requested variant at `paths[variant]`."""
    unknown = [v for v in variants if v not in COREML_VARIANTS]
    if unknown:
        raise ExportError(f"unknown Core ML variant(s) {unknown}; known: {', '.join(COREML_VARIANTS)}")
    with quiet_progress_bars():
        base = convert_to_coreml(module, input_shape)
        return {variant: save_mlpackage(compress(base, variant), paths[variant]) for variant in variants}


def _feature_shape(feature) -> list[int] | None:
    kind = feature.type.WhichOneof("Type")
    if kind == "multiArrayType":
        return [int(d) for d in feature.type.multiArrayType.shape]
    return None


def spec_summary(path: str | Path) -> dict:
    """Inputs/outputs (name, shape, type), spec version and size of a saved .mlpackage, without loading it."""
    ct = _ct()
    path = Path(path)
    model = ct.models.MLModel(str(path), skip_model_load=True)
    spec = model.get_spec()

    def describe(features):
        return [
            {"name": f.name, "shape": _feature_shape(f), "type": f.type.WhichOneof("Type")} for f in features
        ]

    weights = [p for p in path.rglob("weight.bin")]
    return {
        "inputs": describe(spec.description.input),
        "outputs": describe(spec.description.output),
        "specification_version": int(spec.specificationVersion),
        "model_type": spec.WhichOneof("Type"),
        "size": sum(p.stat().st_size for p in path.rglob("*") if p.is_file()),
        "weights_size": sum(p.stat().st_size for p in weights),
    }


def check_spec(summary: dict, input_shape: tuple[int, int, int]) -> None:
    """Raise unless the package has the names the iOS app binds to and an ML Program for iOS 16+."""
    inputs = [(i["name"], i["shape"]) for i in summary["inputs"]]
    outputs = [o["name"] for o in summary["outputs"]]
    if inputs != [(INPUT_NAME, [1, *input_shape])]:
        raise ExportError(f"Core ML input must be {INPUT_NAME} {[1, *input_shape]}, got {inputs}")
    if outputs != list(OUTPUT_NAMES):
        raise ExportError(f"Core ML outputs must be {list(OUTPUT_NAMES)}, got {outputs}")
    if summary["model_type"] != "mlProgram" or summary["specification_version"] < 7:
        raise ExportError(
            f"expected an ML Program for iOS 16+ (spec >= 7), got {summary['model_type']} "
            f"spec {summary['specification_version']}"
        )
