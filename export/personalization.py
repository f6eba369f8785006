"""On-device personalization programs: what a phone trains with ExecuTorch's training runtime.

A tier's front-end is cut in two for personalization:

    frozen   image -> (exit_hidden, features): the stages, the exit head's conv + pooling and the
             connector. An XNNPACK program like the inference ones (fast), run once per sample.
    trained  exit_hidden -> exit_logits: the exit head's classifier (Linear, ReLU, Linear), the part
             a phone fine-tunes on its own labelled samples.

Three .pte files per tier:

    personalize_frozen.pte   XNNPACK fp32, image -> (exit_hidden, features)
    personalize_train.pte    the forward-backward joint graph (torch.export +
                             torch.export.experimental._export_forward_backward), portable kernels:
                             method `forward`: (exit_hidden (B, H), exit_positions (B,) int64)
                             -> (cross-entropy loss, exit_logits), its gradients and parameters
                             (ExecuTorch's TrainingModule slices them; SGD updates them in place)
    personalize_head.pte     the classifier with its parameters as inputs, portable kernels:
                             (exit_hidden, *parameters in `parameter_names` order) -> exit_logits;
                             after training the phone answers with frozen + head and its trained
                             parameters

Why only the classifier trains (measured, benchmarks/results/device_training.md): the training
runtime has no XNNPACK backward, and its portable kernels made a batch-32 step of the exit head
with its conv 19-37x slower than eager PyTorch, and with the last stage too 32-147x; the
classifier alone took 1.3-1.5x. The training graphs of those larger scopes still
build and run (`TRAINABLE_SCOPES`; the exit head's AvgPool2d becomes reshape + mean there:
`avg_pool2d_backward` is missing from the training runtime), so the benchmark measures them.
Labels are exit positions (the head's outputs are in token order); nothing class-ordered is in any
of these programs.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from harmony_mobile.export.steps import ExportError, build_pte
from harmony_mobile.export.verify import FP32_MAX_ABS
from torch import nn

from harmony_mobile.logs import native_stderr_to_log_file
from harmony_mobile.models import FrontEnd

TRAIN_BATCH = 32
TRAINING_METHOD = "forward"
TRAINABLE_SCOPES = ("exit_classifier", "exit_head", "exit_head+last_stage")
SHIPPED_SCOPE = "exit_classifier"
FROZEN_FILE, TRAINING_FILE, HEAD_FILE = (
    "personalize_frozen.pte",
    "personalize_train.pte",
    "personalize_head.pte",
)
MAX_LOSS_DIFFERENCE = 1e-4  # .pte loss vs eager loss on the same batch and parameters
MAX_LOGIT_DIFFERENCE = 1e-4  # head program vs eager classifier
MAX_FROZEN_DIFFERENCE = FP32_MAX_ABS  # frozen XNNPACK program vs eager: the fp32 inference .pte's bound


def exit_pooling(conv: nn.Module, pool: int, flat_features: int, activation: torch.Tensor) -> torch.Tensor:
    """An exit head's conv + ReLU + average pooling (kernel `pool`), flattened: (N, C, H, W) ->
    (N, flat_features). Pooling is a reshape + mean (the training runtime has no
    avg_pool2d_backward); same numbers as the head's AvgPool2d."""
    pooled = F.relu(conv(activation))
    n, c, h, w = pooled.shape
    pooled = pooled.reshape(n, c, h // pool, pool, w // pool, pool).mean(dim=(3, 5))
    return pooled.reshape(n, flat_features)


def pool_kernel(exit_head: nn.Module) -> int:
    kernel = exit_head.pool.kernel_size
    return kernel if isinstance(kernel, int) else kernel[0]


class FrozenPart(nn.Module):
    """image -> (exit_hidden, features): everything a phone does not train, for XNNPACK."""

    output_names = ("exit_hidden", "features")

    def __init__(self, front_end: FrontEnd):
        super().__init__()
        self.stages = front_end.stages
        self.exit_head = front_end.exit_head
        self.connector = front_end.connector

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        activation = self.stages(image)
        # the head's own AvgPool2d here: XNNPACK delegates it (not a 6-d mean), and no backward runs
        head = self.exit_head
        hidden = head.pool(F.relu(head.conv(activation))).reshape(-1, head.flat_features)
        return hidden, self.connector(activation)


class TrainedPart(nn.Module):
    """The trained scope of a front-end with the exit loss: (input, exit_positions) -> (loss, logits).

    Scope `exit_classifier`: input exit_hidden; `exit_head`: the last stage's activation;
    `exit_head+last_stage`: the activation before the last stage. Only the scope's parameters are
    in the module, so each reaches the loss and nothing frozen asks for a gradient."""

    def __init__(self, front_end: FrontEnd, scope: str):
        super().__init__()
        if scope not in TRAINABLE_SCOPES:
            raise ExportError(f"unknown trainable scope {scope!r}; known: {', '.join(TRAINABLE_SCOPES)}")
        self.scope = scope
        self.pool, self.flat_features = pool_kernel(front_end.exit_head), front_end.exit_head.flat_features
        self.classifier = copy.deepcopy(front_end.exit_head.mlp)
        self.exit_conv = copy.deepcopy(front_end.exit_head.conv) if scope != "exit_classifier" else None
        self.last_stage = copy.deepcopy(front_end.stages[-1]) if scope == "exit_head+last_stage" else None

    def logits(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.last_stage is not None:
            inputs = self.last_stage(inputs)
        if self.exit_conv is not None:
            inputs = exit_pooling(self.exit_conv, self.pool, self.flat_features, inputs)
        return self.classifier(inputs)

    def forward(
        self, inputs: torch.Tensor, exit_positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.logits(inputs)
        return F.cross_entropy(logits, exit_positions), logits.detach()


def trained_part_inputs(front_end: FrontEnd, scope: str, images: torch.Tensor) -> torch.Tensor:
    """What a scope's training program takes for `images`, computed eagerly (tests, benchmark)."""
    with torch.no_grad():
        if scope == "exit_head+last_stage":
            return front_end.stages[:-1](images)
        activation = front_end.stages(images)
        if scope == "exit_head":
            return activation
        head = front_end.exit_head
        return exit_pooling(head.conv, pool_kernel(head), head.flat_features, activation)


class ClassifierWithParameters(nn.Module):
    """The exit classifier with its parameters as inputs (so a phone feeds the trained ones)."""

    def __init__(self, classifier: nn.Module, parameter_names: list[str]):
        super().__init__()
        self.classifier = copy.deepcopy(classifier)
        self.parameter_names = list(parameter_names)

    def forward(self, exit_hidden: torch.Tensor, *parameters: torch.Tensor) -> torch.Tensor:
        named = dict(zip(self.parameter_names, parameters, strict=True))
        return torch.func.functional_call(self.classifier, named, (exit_hidden,))


def training_program(part: TrainedPart, example_inputs: torch.Tensor, num_classes: int) -> bytes:
    """torch.export -> forward-backward joint graph -> edge -> ExecuTorch: the training .pte."""
    from executorch.exir import EdgeCompileConfig, to_edge
    from torch.export.experimental import _export_forward_backward

    labels = torch.arange(len(example_inputs)) % num_classes
    program = torch.export.export(part.train(), (example_inputs, labels), strict=False)
    program = _export_forward_backward(program)
    edge = to_edge(program, compile_config=EdgeCompileConfig(_check_ir_validity=False))
    return edge.to_executorch().buffer


def load_training_program(buffer: bytes):
    """ExecuTorch's Python TrainingModule over a training .pte."""
    with native_stderr_to_log_file():
        from executorch.extension.training import _load_for_executorch_for_training_from_buffer

        return _load_for_executorch_for_training_from_buffer(buffer)


def head_program(classifier: nn.Module, parameter_names: list[str], hidden: int, batch: int) -> bytes:
    """The classifier with parameters as inputs, portable kernels, static batch `batch`."""
    from executorch.exir import to_edge

    module = ClassifierWithParameters(classifier, parameter_names).eval()
    parameters = dict(module.classifier.named_parameters())
    example = (torch.zeros(batch, hidden), *(parameters[n].detach() for n in parameter_names))
    with torch.no_grad():
        program = torch.export.export(module, example, strict=False)
    return to_edge(program).to_executorch().buffer


@dataclass
class PersonalizationBuild:
    frozen: bytes
    training: bytes
    head: bytes
    parameter_names: list[str]  # the training program's order (its FQN method), also the head's inputs
    parameter_shapes: dict[str, list[int]]
    hidden: int
    batch: int
    loss_difference: float
    logit_difference: float
    frozen_difference: float


def build_personalization(
    front_end: FrontEnd,
    input_shape: tuple[int, int, int],
    num_classes: int,
    max_batch: int,
    samples: torch.Tensor,
) -> PersonalizationBuild:
    """The three programs of a tier, each checked against eager PyTorch on `samples` (images)."""
    frozen_module = FrozenPart(copy.deepcopy(front_end)).eval()
    frozen = build_pte(frozen_module, input_shape, "fp32", max_batch=max_batch).buffer
    frozen_difference = _frozen_difference(frozen, frozen_module, samples[:max_batch])
    images = samples[:TRAIN_BATCH]
    images = images.repeat((TRAIN_BATCH + len(images) - 1) // len(images), 1, 1, 1)[:TRAIN_BATCH]
    hidden = trained_part_inputs(front_end, SHIPPED_SCOPE, images)
    part = TrainedPart(front_end, SHIPPED_SCOPE)
    training = training_program(part, hidden, num_classes)
    module = load_training_program(training)
    labels = torch.arange(TRAIN_BATCH) % num_classes
    loss = module.forward_backward(TRAINING_METHOD, (hidden, labels))[0]
    named = module.named_parameters()
    names = list(named)
    with torch.no_grad():
        loss_difference = abs(float(loss) - float(part(hidden, labels)[0]))
    head = head_program(
        part.classifier, [n.removeprefix("classifier.") for n in names], hidden.shape[1], max_batch
    )
    logit_difference = _head_difference(head, part, hidden[:max_batch], [named[n] for n in names])
    if (
        loss_difference > MAX_LOSS_DIFFERENCE
        or logit_difference > MAX_LOGIT_DIFFERENCE
        or frozen_difference > MAX_FROZEN_DIFFERENCE
    ):
        raise ExportError(
            f"personalization programs differ from eager PyTorch: loss by {loss_difference:.3g} "
            f"(limit {MAX_LOSS_DIFFERENCE}), head logits by {logit_difference:.3g} (limit {MAX_LOGIT_DIFFERENCE}), "
            f"frozen outputs by {frozen_difference:.3g} (limit {MAX_FROZEN_DIFFERENCE})"
        )
    return PersonalizationBuild(
        frozen=frozen,
        training=training,
        head=head,
        parameter_names=names,
        parameter_shapes={n: list(named[n].shape) for n in names},
        hidden=int(hidden.shape[1]),
        batch=TRAIN_BATCH,
        loss_difference=loss_difference,
        logit_difference=logit_difference,
        frozen_difference=frozen_difference,
    )


def _frozen_difference(frozen: bytes, module: FrozenPart, images: torch.Tensor) -> float:
    from harmony_mobile.export.steps import load_method

    method = load_method(frozen)
    batch = method.metadata.input_tensor_meta(0).sizes()[0]
    padded = torch.cat([images, torch.zeros(batch - len(images), *images.shape[1:])])
    outputs = method.execute([padded])
    with torch.no_grad():
        expected = module(images)
    return max(float((o[: len(images)] - e).abs().max()) for o, e in zip(outputs, expected, strict=True))


def _head_difference(head: bytes, part: TrainedPart, hidden: torch.Tensor, parameters: list) -> float:
    from harmony_mobile.export.steps import load_method

    method = load_method(head)
    padded = torch.cat(
        [hidden, torch.zeros(method.metadata.input_tensor_meta(0).sizes()[0] - len(hidden), hidden.shape[1])]
    )
    logits = method.execute([padded, *parameters])[0][: len(hidden)]
    with torch.no_grad():
        return float((logits - part.classifier(hidden)).abs().max())


# --------------------------------------------------------------------------- into an export directory

DEFAULT_LEARNING_RATE = 0.01  # 0.05 made SGD on the resnet tiers' exit features (up to ~140) unstable


def calibration_target(info) -> float | None:
    """The local-exit accuracy target the run (its `run_dir.RunInfo`) calibrated tau with (None: its
    algorithm does not calibrate a max-softmax threshold)."""
    from harmony_mobile.algorithms.registry import run_exit_gate

    rule, target = run_exit_gate(info)
    return target if rule == "max_softmax" else None


def write_personalization(build: PersonalizationBuild, directory, tier_dir: str, target: float | None):
    """Write the three programs under `directory/tier_dir` and return the manifest entry."""
    from pathlib import Path

    from harmony_mobile.export.manifest import Personalization, ProgramFile, path_digest

    files = {}
    for name, data in ((FROZEN_FILE, build.frozen), (TRAINING_FILE, build.training), (HEAD_FILE, build.head)):
        relpath = f"{tier_dir}/{name}"
        path = Path(directory) / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        sha, size = path_digest(path)
        files[name] = ProgramFile(path=relpath, sha256=sha, size=size)
    return Personalization(
        frozen_program=files[FROZEN_FILE],
        training_program=files[TRAINING_FILE],
        head_program=files[HEAD_FILE],
        method=TRAINING_METHOD,
        batch=build.batch,
        hidden=build.hidden,
        parameter_names=build.parameter_names,
        parameter_shapes=[build.parameter_shapes[n] for n in build.parameter_names],
        learning_rate=DEFAULT_LEARNING_RATE,
        calibration_target=target,
    )
