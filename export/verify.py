"""The verification report: every .pte run with the ExecuTorch Python runtime against eager PyTorch.

Per .pte, on the gate images (pipeline.gate_indices: the representative client's held-out ID images
first, then other images the client never trained on, up to GATE_SAMPLES):
  * max abs diff of exit logits and features vs the eager fp32 front-end, top-1 agreement,
    exit accuracy (fp32 and int8), relative L2 error;
  * for int8 also vs the PT2E eager simulation (the converted module), which must match closely:
    a lowering that drops the quantization scales (torchao weight-only int8 does this silently) shows up here at once;
  * size in bytes, delegate count, median batch-1 latency of .pte and eager in the same process
    with the thread count set explicitly, and their ratio.
Core ML packages: spec inputs/outputs and sizes only; numeric parity runs on a Mac
(`python -m harmony_mobile.export.check_coreml_on_mac EXPORT_DIR`).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from harmony_mobile.export.steps import ExportError

# fp32 .pte vs eager: XNNPACK reorders float sums; anything above this is a real bug.
FP32_MAX_ABS = 1e-4
# Quality targets for int8: reported per tier; the pipeline fails only on the gross check below.
INT8_MIN_AGREEMENT = 0.98
INT8_MAX_ACC_DROP = 0.01
INT8_MAX_SIZE_RATIO = 0.5
INT8_SIZE_RULE_MIN_PARAMS = 100_000
# Gross int8 sanity (always enforced): relative L2 error of the outputs vs fp32 eager. Correct PT2E
# int8 is ~1-5 %; ignored scales or a wrong zero point give errors of order 100 % or more.
INT8_MAX_REL_L2 = 0.25
# int8 .pte vs its own PT2E eager simulation (same arithmetic; small rounding differences only).
INT8_SIM_MAX_REL_L2 = 0.05
# The agreement check must resolve 1 point: the 95 % Wilson interval of the agreement is at most
# +-1 point wide around the 98 % target from samples_to_resolve() = 753 images on; GATE_SAMPLES
# is what the export asks for (on 98-142 images one flipped image moved agreement by ~1 point).
AGREEMENT_RESOLUTION = 0.01
CONFIDENCE_Z = 1.96
GATE_SAMPLES = 1000


def wilson_interval(successes: int, samples: int, z: float = CONFIDENCE_Z) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95 % for z = 1.96)."""
    if samples <= 0:
        return 0.0, 1.0
    p = successes / samples
    denominator = 1 + z * z / samples
    centre = (p + z * z / (2 * samples)) / denominator
    half = z * math.sqrt(p * (1 - p) / samples + z * z / (4 * samples * samples)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def samples_to_resolve(
    proportion: float = INT8_MIN_AGREEMENT, half_width: float = AGREEMENT_RESOLUTION, z: float = CONFIDENCE_Z
) -> int:
    """Samples for a normal-approximation interval of +-half_width around `proportion`."""
    return math.ceil(z * z * proportion * (1 - proportion) / (half_width * half_width))


@dataclass
class Parity:
    samples: int
    top1_agreements: int  # images whose top-1 output equals the reference's
    labelled_samples: int  # images of the client's own classes, which the accuracies are over
    max_abs_logits: float
    max_abs_features: float
    rel_l2_logits: float
    rel_l2_features: float
    top1_agreement: float
    accuracy_reference: float | None
    accuracy_candidate: float | None


def _rel_l2(reference: torch.Tensor, candidate: torch.Tensor) -> float:
    return float((candidate - reference).norm() / reference.norm().clamp_min(1e-12))


def compare_outputs(
    reference: tuple[torch.Tensor, torch.Tensor],
    candidate: tuple[torch.Tensor, torch.Tensor],
    labels: torch.Tensor | None = None,
) -> Parity:
    """Compare (exit_logits, features) of a candidate (e.g. a .pte) with a reference (e.g. eager).

    `labels` < 0 mark images outside the client's classes: counted for agreement, not for accuracy."""
    (ref_logits, ref_features), (logits, features) = reference, candidate
    if ref_logits.shape != logits.shape or ref_features.shape != features.shape:
        raise ExportError(
            f"output shapes differ: reference {tuple(ref_logits.shape)}/{tuple(ref_features.shape)}, "
            f"candidate {tuple(logits.shape)}/{tuple(features.shape)}"
        )
    ref_top1, top1 = ref_logits.argmax(1), logits.argmax(1)
    known = None if labels is None else labels >= 0
    accuracy_reference = accuracy_candidate = None
    if known is not None and bool(known.any()):
        accuracy_reference = float((ref_top1 == labels)[known].float().mean())
        accuracy_candidate = float((top1 == labels)[known].float().mean())
    return Parity(
        samples=len(logits),
        top1_agreements=int((ref_top1 == top1).sum()),
        labelled_samples=0 if known is None else int(known.sum()),
        max_abs_logits=float((logits - ref_logits).abs().max()),
        max_abs_features=float((features - ref_features).abs().max()),
        rel_l2_logits=_rel_l2(ref_logits, logits),
        rel_l2_features=_rel_l2(ref_features, features),
        top1_agreement=float((ref_top1 == top1).float().mean()),
        accuracy_reference=accuracy_reference,
        accuracy_candidate=accuracy_candidate,
    )


def check_fp32(parity: Parity, what: str) -> None:
    worst = max(parity.max_abs_logits, parity.max_abs_features)
    if worst > FP32_MAX_ABS:
        raise ExportError(f"{what}: fp32 .pte differs from eager by {worst:.3g} (> {FP32_MAX_ABS:g})")


def check_int8_not_broken(parity: Parity, what: str, limit: float = INT8_MAX_REL_L2) -> None:
    """Fail loudly when int8 outputs are far from fp32 (e.g. scales ignored), instead of shipping them."""
    worst = max(parity.rel_l2_logits, parity.rel_l2_features)
    if not worst <= limit:  # also catches NaN
        raise ExportError(
            f"{what}: int8 output is wrong: relative L2 error {worst:.3g} vs the reference (limit {limit:g}); "
            "quantization scales may have been ignored"
        )


# --------------------------------------------------------------------------- running


def run_eager(module, images: torch.Tensor, batch: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs of an eager module (or PT2E GraphModule) over `images`, `batch` at a time."""
    logits, features = [], []
    with torch.no_grad():
        for start in range(0, len(images), batch):
            out = module(images[start : start + batch])
            logits.append(out[0])
            features.append(out[1])
    return torch.cat(logits), torch.cat(features)


def run_pte(method, images: torch.Tensor, batch: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs of a loaded .pte `forward` method over `images`, `batch` at a time."""
    logits, features = [], []
    for start in range(0, len(images), batch):
        out = method.execute([images[start : start + batch].contiguous()])
        logits.append(out[0].clone())
        features.append(out[1].clone())
    return torch.cat(logits), torch.cat(features)


def median_latency_ms(call, example: torch.Tensor, warmup: int = 10, runs: int = 50) -> float:
    for _ in range(warmup):
        call(example)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call(example)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def latency_pair(module, method, example: torch.Tensor, runs: int = 50) -> dict:
    """Median batch-1 latency of eager and .pte, interleaved in the same process."""

    def eager(x):
        with torch.inference_mode():
            module(x)

    def pte(x):
        method.execute([x])

    eager_ms = median_latency_ms(eager, example, runs=runs)
    pte_ms = median_latency_ms(pte, example, runs=runs)
    return {
        "eager_ms": round(eager_ms, 4),
        "pte_ms": round(pte_ms, 4),
        "pte_over_eager": round(pte_ms / eager_ms, 3),
        "speedup": round(eager_ms / pte_ms, 2),
        "runs": runs,
        "threads": torch.get_num_threads(),
    }


def verify_pte(
    pte_path: str | Path,
    eager_fp32,
    images: torch.Tensor,
    labels: torch.Tensor,
    quantization: str,
    *,
    simulation=None,
    max_batch: int,
    latency_runs: int,
) -> dict:
    """Run one .pte over the test images and return its report row; raises ExportError on a broken artifact."""
    from harmony_mobile.export.steps import load_method

    method = load_method(pte_path)
    planned = tuple(method.metadata.input_tensor_meta(0).sizes())
    if planned[0] != max_batch:
        raise ExportError(f"{pte_path}: planned batch {planned[0]}, expected {max_batch}")
    reference = run_eager(eager_fp32, images)
    outputs = run_pte(method, images)
    parity = compare_outputs(reference, outputs, labels)
    what = str(Path(pte_path).name)
    row: dict = {"quantization": quantization, "size": Path(pte_path).stat().st_size, "max_batch": max_batch}
    row["vs_eager_fp32"] = asdict(parity)
    if quantization == "fp32":
        check_fp32(parity, what)
    else:
        check_int8_not_broken(parity, what)
        if simulation is not None:
            sim = compare_outputs(run_eager(simulation, images), outputs, labels)
            row["vs_pt2e_simulation"] = asdict(sim)
            check_int8_not_broken(sim, f"{what} vs its PT2E simulation", INT8_SIM_MAX_REL_L2)
    if max_batch > 1:  # the dynamic .pte at its max batch, too
        batch = images[:max_batch]
        if len(batch) == max_batch:
            big = compare_outputs(run_eager(eager_fp32, batch, max_batch), run_pte(method, batch, max_batch))
            row["at_max_batch"] = asdict(big)
    row["latency_batch1"] = latency_pair(eager_fp32, method, images[:1].contiguous(), latency_runs)
    return row


# --------------------------------------------------------------------------- quality checks + report


def agreement_interval(parity: dict) -> tuple[float, float]:
    """The 95 % Wilson interval of a parity row's top-1 agreement."""
    return wilson_interval(parity["top1_agreements"], parity["samples"])


def tier_checks(tier_report: dict) -> dict[str, bool | None]:
    """The quality checks for one tier (None = not applicable). Names start with the variant they
    judge (fp32_, int8_); fully_delegated judges every .pte."""
    rows = {r["quantization"]: r for r in tier_report.get("pte", [])}
    checks: dict[str, bool | None] = {"fully_delegated": all(r["undelegated"] == [] for r in rows.values())}
    if "fp32" in rows:
        p = rows["fp32"]["vs_eager_fp32"]
        checks["fp32_max_abs_le_1e-4"] = max(p["max_abs_logits"], p["max_abs_features"]) <= FP32_MAX_ABS
    if "int8" in rows:
        p = rows["int8"]["vs_eager_fp32"]
        low, high = agreement_interval(p)
        checks["int8_top1_agreement_ge_98"] = p["top1_agreements"] >= INT8_MIN_AGREEMENT * p["samples"]
        checks["int8_agreement_resolves_1pt"] = (high - low) / 2 <= AGREEMENT_RESOLUTION
        checks["int8_exit_acc_within_1pt"] = (
            None
            if p["accuracy_reference"] is None
            else abs(p["accuracy_reference"] - p["accuracy_candidate"]) <= INT8_MAX_ACC_DROP + 1e-9
        )
        if "fp32" in rows and tier_report["parameters"] > INT8_SIZE_RULE_MIN_PARAMS:
            checks["int8_size_le_half_fp32"] = (
                rows["int8"]["size"] <= INT8_MAX_SIZE_RATIO * rows["fp32"]["size"]
            )
        else:
            checks["int8_size_le_half_fp32"] = None
    return checks


def variant_verdicts(tier_report: dict) -> dict[str, tuple[str, list[str]]]:
    """quantization -> (verdict, failed checks) for every variant of a tier: a .pte passes when none
    of its checks failed; a Core ML package is "not_checked" (its parity runs on a Mac)."""
    checks = tier_report["checks"]
    verdicts: dict[str, tuple[str, list[str]]] = {}
    for row in tier_report.get("pte", []):
        quantization = row["quantization"]
        failed = [
            name
            for name, ok in checks.items()
            if ok is False and (name == "fully_delegated" or name.startswith(f"{quantization}_"))
        ]
        verdicts[quantization] = ("fail" if failed else "pass", failed)
    for row in tier_report.get("coreml", []):
        verdicts[row["quantization"]] = ("not_checked", [])
    return verdicts


def _agreement_text(p: dict) -> str:
    """96/98 = 97.96 %: the count beside a percentage with enough digits that a FAIL never reads as 98."""
    return f"{p['top1_agreements']}/{p['samples']} = {100 * p['top1_agreements'] / p['samples']:.2f} %"


def measured(tier: dict, check: str) -> str:
    """What a check measured, in the units its threshold is stated in."""
    rows = {r["quantization"]: r for r in tier.get("pte", [])}
    row = rows.get(check.split("_", 1)[0])
    if row is None:
        return "–"
    p = row["vs_eager_fp32"]
    if check == "int8_top1_agreement_ge_98":
        return _agreement_text(p)
    if check == "int8_agreement_resolves_1pt":
        low, high = agreement_interval(p)
        return (
            f"95 % Wilson [{100 * low:.2f}, {100 * high:.2f}] %, +-{50 * (high - low):.2f} points "
            f"({samples_to_resolve()} images resolve 1 point at 98 %)"
        )
    if check == "int8_exit_acc_within_1pt" and p["accuracy_reference"] is not None:
        drop = 100 * (p["accuracy_candidate"] - p["accuracy_reference"])
        return f"{p['accuracy_reference']:.4f} -> {p['accuracy_candidate']:.4f} ({drop:+.2f} points, {p['labelled_samples']} labelled)"
    if check == "int8_size_le_half_fp32" and "fp32" in rows:
        return f"{row['size']:,} / {rows['fp32']['size']:,} B"
    if check == "fp32_max_abs_le_1e-4":
        return _fmt(max(p["max_abs_logits"], p["max_abs_features"]))
    return "–"


def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def render_markdown(report: dict) -> str:
    """verification.md: the .pte table, the checks table, the Core ML table, the back-end line."""
    lines = _pte_section(report) + _checks_section(report) + _coreml_section(report)
    lines += [
        "",
        f"Back-end: `{report['backend']['exported_program_file']}` matches eager "
        f"(max abs {_fmt(report['backend']['max_abs_vs_eager'])}).",
        "",
    ]
    return "\n".join(lines)


def _pte_section(report: dict) -> list[str]:
    lines = [
        f"# Export verification — model version {report['model_version']}",
        "",
        f"Run `{report['run']}`, dataset `{report['dataset']}`, torch threads {report['threads']}, "
        f"latency = median of {report['latency_runs']} batch-1 calls after 10 warm-up, eager and .pte in the same "
        "process. Parity on the representative client's held-out ID images: its test split plus its "
        "validation split (neither is used for training or int8 calibration).",
        "",
        "## ExecuTorch (.pte, XNNPACK)",
        "",
        "| tier | variant | size B | delegates | max abs logits | max abs features | top-1 agree | exit acc "
        "(eager fp32 → .pte) | vs PT2E sim rel-L2 | eager ms | .pte ms | .pte/eager |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for tier in report["tiers"]:
        for row in tier.get("pte", []):
            p, lat = row["vs_eager_fp32"], row["latency_batch1"]
            sim = row.get("vs_pt2e_simulation")
            sim_text = "–" if sim is None else _fmt(max(sim["rel_l2_logits"], sim["rel_l2_features"]))
            lines.append(
                f"| {tier['tier']} | {row['quantization']} | {row['size']:,} | {row['delegates']} | "
                f"{_fmt(p['max_abs_logits'])} | {_fmt(p['max_abs_features'])} | {_agreement_text(p)} | "
                f"{_fmt(p['accuracy_reference'], 4)} → {_fmt(p['accuracy_candidate'], 4)} | {sim_text} | "
                f"{lat['eager_ms']:.3f} | {lat['pte_ms']:.3f} | {lat['pte_over_eager']:.2f} |"
            )
    kept = sorted(
        {layer for t in report["tiers"] for r in t.get("pte", []) for layer in r.get("float_layers", [])}
    )
    if kept:
        lines += [
            "",
            f"int8 keeps in fp32: {', '.join(f'`{k}`' for k in kept)}, the layer computing `exit_logits`: "
            "int8-rounded logits turn near-ties into exact ties (export/README.md, int8).",
        ]
    return lines


def _checks_section(report: dict) -> list[str]:
    lines = [
        "",
        "## Checks",
        "",
        "| tier | parameters | images (test + val + other) | check | measured | result |",
        "|---|---|---|---|---|---|",
    ]
    for tier in report["tiers"]:
        split = tier.get("verification_images")
        images = f"{tier['test_samples']}" + (
            f" ({split['test']} + {split['val']} + {split.get('other', 0)})" if split else ""
        )
        for name, ok in tier["checks"].items():
            result = "n/a" if ok is None else ("pass" if ok else "**FAIL**")
            lines.append(
                f"| {tier['tier']} | {tier['parameters']:,} | {images} | {name} | {measured(tier, name)} | {result} |"
            )
    verdicts = [
        f"{tier['tier']} {quantization}: {verdict}"
        for tier in report["tiers"]
        for quantization, (verdict, _) in variant_verdicts(tier).items()
    ]
    if verdicts:
        lines += [
            "",
            f"Variant verdicts (in the manifest; apps prefer a passing variant): {'; '.join(verdicts)}.",
        ]
    return lines


def _coreml_section(report: dict) -> list[str]:
    coreml = [(t["tier"], c) for t in report["tiers"] for c in t.get("coreml", [])]
    if not coreml:
        return []
    lines = [
        "",
        "## Core ML (.mlpackage)",
        "",
        "Spec checked here (names, shapes, ML Program, iOS 16+). Numeric parity needs macOS: run "
        "`python -m harmony_mobile.export.check_coreml_on_mac EXPORT_DIR` on a Mac (CI does not).",
        "",
        "| tier | variant | size B | weights B | spec | inputs | outputs |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, c in coreml:
        io_in = ", ".join(f"{i['name']} {i['shape']}" for i in c["inputs"])
        io_out = ", ".join(f"{o['name']} {o['shape']}" for o in c["outputs"])
        lines.append(
            f"| {name} | {c['quantization']} | {c['size']:,} | {c['weights_size']:,} | "
            f"v{c['specification_version']} | {io_in} | {io_out} |"
        )
    return lines


def write_verification_report(directory: str | Path, report: dict) -> list[str]:
    """verification.json + verification.md in `directory`; returns their relative paths."""
    directory = Path(directory)
    (directory / "verification.json").write_text(json.dumps(report, indent=2) + "\n")
    (directory / "verification.md").write_text(render_markdown(report))
    return ["verification.json", "verification.md"]
