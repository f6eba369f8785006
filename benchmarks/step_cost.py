"""Cost of one training step of each model family: forward and backward of the full-depth model (four
stages and the depth-4 exit head) on a batch of 28x28 images, one torch thread, as a benchmark run trains.
The families (and memory formats) are timed in turns (round-robin, median of the rounds), so a load that comes and goes
hits them alike. Also counts multiply-accumulates per sample, to show how far the time follows them.

    .venv/bin/python benchmarks/step_cost.py                 # widths 1.0 and 0.5, batch 64
    .venv/bin/python benchmarks/step_cost.py --widths 1.0 --rounds 5

Each model is timed in PyTorch's default (contiguous, NCHW) memory format and in channels_last, side
by side in the same turns, so the ratio of the two is not a comparison of two machine states.

Writes benchmarks/results/step_cost.md and .json. What the numbers are for: a `standard` benchmark
run spends most of its time in these steps, so they bound how much cheaper the profile can get
without changing what it trains.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from torch import nn

from harmony_mobile.models.families import FAMILIES, NUM_STAGES
from harmony_mobile.models.family_model import FamilyModel

RESULTS = Path(__file__).parent / "results"


def full_depth_model(family: str, width: float) -> nn.Module:
    """The full-depth model of a family as the no-split baselines train it (`FamilyModel.classify_full`:
    the four stages, then the depth-4 exit head), without the heads and connectors it does not run."""
    model = FamilyModel(family, in_channels=1, input_size=28, num_classes=10, width=width)
    return nn.Sequential(*model.stages, model.exits[str(NUM_STAGES)])


def macs_per_sample(model: nn.Module) -> int:
    """Multiply-accumulates of one forward pass of one 28x28 sample (convolutions and linear layers)."""
    total = 0

    def count(module: nn.Module, _inputs, output: torch.Tensor) -> None:
        nonlocal total
        if isinstance(module, nn.Conv2d):
            per_output = module.in_channels // module.groups * module.kernel_size[0] * module.kernel_size[1]
            total += output[0].numel() * per_output
        elif isinstance(module, nn.Linear):
            total += module.in_features * module.out_features

    hooks = [m.register_forward_hook(count) for m in model.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
    with torch.no_grad():
        model(torch.zeros(1, 1, 28, 28))
    for hook in hooks:
        hook.remove()
    return total


MEMORY_FORMATS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}


def step_seconds(model: nn.Module, batch: int, steps: int, layout: str = "contiguous") -> float:
    """Mean wall time of `steps` forward + backward passes (the optimizer's update is negligible here),
    the weights and the images in the memory format named `layout`."""
    memory_format = MEMORY_FORMATS[layout]
    model.to(memory_format=memory_format)
    images = torch.randn(batch, 1, 28, 28).contiguous(memory_format=memory_format)
    labels = torch.randint(0, 10, (batch,))
    started = time.perf_counter()
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(images), labels).backward()
    return (time.perf_counter() - started) / steps


def measure(widths: list[float], batch: int, steps: int, rounds: int, formats: list[str]) -> list[dict]:
    models = {(f, w): full_depth_model(f, w) for w in widths for f in FAMILIES}
    timed = [(family, width, layout) for family, width in models for layout in formats]
    for family, width, layout in timed:
        step_seconds(models[family, width], batch, 2, layout)  # warm-up: allocations, kernel choice
    times: dict[tuple, list[float]] = {key: [] for key in timed}
    for _ in range(rounds):
        for family, width, layout in timed:
            times[family, width, layout].append(step_seconds(models[family, width], batch, steps, layout))
    return [
        {
            "family": family,
            "width": width,
            "memory_format": layout,
            "parameters": sum(p.numel() for p in models[family, width].parameters()),
            "macs_per_sample": macs_per_sample(models[family, width]),
            "step_ms": 1000 * statistics.median(times[family, width, layout]),
            "step_ms_rounds": [1000 * t for t in times[family, width, layout]],
        }
        for family, width, layout in timed
    ]


def report(rows: list[dict], args: argparse.Namespace) -> str:
    lines = [
        "# One training step per model family",
        "",
        f"Made by `benchmarks/step_cost.py`: forward + backward of the full-depth model (4 stages + the "
        f"depth-4 exit head, as `local` and `fedavg` train it), batch {args.batch}, 28x28 inputs, 1 torch thread; median over {args.rounds} rounds of "
        f"{args.steps} steps, the families and memory formats timed in turns. torch {torch.__version__}, {platform.processor() or platform.machine()}.",
        "",
        "| family | width | memory format | parameters | MACs per sample | ms per step | ns per MAC | vs contiguous |",
        "|---|---|---|---|---|---|---|---|",
    ]
    contiguous = {(r["family"], r["width"]): r["step_ms"] for r in rows if r["memory_format"] == "contiguous"}
    for row in rows:
        per_mac = row["step_ms"] * 1e6 / (3 * row["macs_per_sample"] * args.batch)  # backward ~ 2x forward
        base = contiguous.get((row["family"], row["width"]))
        ratio = f"{row['step_ms'] / base:.2f}" if base else "–"
        lines.append(
            f"| {row['family']} | {row['width']} | {row['memory_format']} | {row['parameters']:,} "
            f"| {row['macs_per_sample'] / 1e6:.2f} M | {row['step_ms']:.1f} | {per_mac:.2f} | {ratio} |"
        )
    lines += [
        "",
        "ns per MAC counts forward + backward as 3 forward passes' MACs: how efficiently each family's "
        "layers run on this CPU, not a hardware figure. *vs contiguous*: this row's median time over the "
        "same model's in the default memory format, timed in the same turns.",
        "",
    ]
    return "\n".join(lines)


def width_list(text: str) -> list[float]:
    """'1.0,0.5' -> [1.0, 0.5]; argparse turns the ValueError into a usage error naming the flag."""
    widths = [float(part) for part in text.split(",")]
    if not all(w > 0 for w in widths):
        raise ValueError(f"widths must be positive: {text}")
    return widths


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--widths", type=width_list, default="1.0,0.5", help="comma-separated width multipliers"
    )
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5, help="steps per timing")
    parser.add_argument(
        "--rounds", type=int, default=21, help="timings per family and memory format (the median is kept)"
    )
    parser.add_argument(
        "--memory-formats",
        default="contiguous,channels_last",
        help=f"comma-separated, of {', '.join(MEMORY_FORMATS)}",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "step_cost")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    formats = list(dict.fromkeys(args.memory_formats.split(",")))  # a format named twice is timed once
    unknown = sorted(set(formats) - set(MEMORY_FORMATS))
    if unknown:
        parser.error(f"unknown memory format(s) {', '.join(unknown)}; known: {', '.join(MEMORY_FORMATS)}")
    rows = measure(args.widths, args.batch, args.steps, args.rounds, formats)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(
        json.dumps({"config": vars(args) | {"out": str(args.out)}, "rows": rows}, indent=2)
    )
    text = report(rows, args)
    args.out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
