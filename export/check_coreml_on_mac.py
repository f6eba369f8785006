"""Numeric parity of the exported Core ML packages; run on a Mac (Core ML predictions need macOS).

    python -m harmony_mobile.export.check_coreml_on_mac EXPORT_DIR [--run RUN_DIR] [--public-key FILE]
                                                        [--report coreml_parity.json]

1. verifies the signed manifest (hashes and signature) first;
2. reference outputs: with `--run`, the eager PyTorch front-end of the tier's exported client on
   that client's ID test images (exactly what verification.json used for the .pte files);
   without it, the fp32 `.pte` of the tier run with `executorch.runtime` on 64 seeded random
   normalized images (needs the executorch wheel for macOS);
3. runs every `.mlpackage` with `MLModel.predict` (compute units: CPU_ONLY by default, so the
   numbers are reproducible; `--compute-units ALL` to include the GPU/ANE) and compares
   `exit_logits` and `features`: max abs diff, relative L2 error, top-1 agreement;
4. writes the report (outside the export directory, which must stay exactly as signed) and exits
   non-zero when a variant exceeds its tolerance.

CI does not run this file (Linux has no Core ML runtime: `MLModel.predict` raises there).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

# (max relative L2 error of logits and features, min top-1 agreement) per variant
TOLERANCES = {
    "coreml-fp16": (0.01, 0.99),
    "coreml-int8": (0.05, 0.98),
    "coreml-palette4": (0.15, 0.95),
}


def reference_outputs(export_dir: Path, tier, run_dir: Path | None, samples: int):
    import torch

    if run_dir is not None:
        from harmony_mobile.run_dir import RunDir

        run = RunDir(run_dir)
        client = next(c for c in run.clients() if c.client_id == tier.client_id)
        images = run.dataset().images[client.test_idx[:samples]]
        front_end = run.front_end(client)
        with torch.no_grad():
            logits, features = front_end(images)
        return (
            images.numpy(),
            logits.numpy(),
            features.numpy(),
            f"eager front-end of client {client.client_id}",
        )
    from executorch.runtime import Runtime

    fp32 = next(a for a in tier.artifacts if a.quantization == "fp32")
    method = Runtime.get().load_program(str(export_dir / fp32.path)).load_method("forward")
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(samples, *tier.input.shape[1:], generator=generator)
    outs = [method.execute([images[i : i + 1].contiguous()]) for i in range(samples)]
    logits = torch.cat([o[0] for o in outs]).numpy()
    features = torch.cat([o[1] for o in outs]).numpy()
    return images.numpy(), logits, features, f"{fp32.path} (executorch runtime), random inputs"


def compare(ref_logits, ref_features, logits, features) -> dict:
    def rel(a, b):
        return float(np.linalg.norm(b - a) / max(np.linalg.norm(a), 1e-12))

    return {
        "max_abs_logits": float(np.abs(logits - ref_logits).max()),
        "max_abs_features": float(np.abs(features - ref_features).max()),
        "rel_l2_logits": rel(ref_logits, logits),
        "rel_l2_features": rel(ref_features, features),
        "top1_agreement": float((logits.argmax(1) == ref_logits.argmax(1)).mean()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export_dir", type=Path)
    parser.add_argument("--run", type=Path, default=None, help="the run directory the export came from")
    parser.add_argument("--public-key", type=Path, default=None, help="pinned signing_key.pub")
    parser.add_argument("--report", type=Path, default=Path("coreml_parity.json"))
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument(
        "--compute-units", default="CPU_ONLY", choices=["CPU_ONLY", "CPU_AND_GPU", "CPU_AND_NE", "ALL"]
    )
    args = parser.parse_args(argv)

    if sys.platform != "darwin":
        print("Core ML predictions need macOS; run this script on a Mac.", file=sys.stderr)
        return 2
    import coremltools as ct
    from harmony_mobile.export.manifest import verify_manifest

    manifest = verify_manifest(args.export_dir, args.public_key)
    report, failures = {"model_version": manifest.model_version, "tiers": []}, []
    for tier in manifest.tiers:
        packages = [a for a in tier.artifacts if a.format == "mlpackage"]
        if not packages:
            continue
        images, ref_logits, ref_features, source = reference_outputs(
            args.export_dir, tier, args.run, args.samples
        )
        tier_report = {"tier": tier.name, "reference": source, "samples": len(images), "variants": []}
        for artifact in packages:
            model = ct.models.MLModel(
                str(args.export_dir / artifact.path),
                compute_units=getattr(ct.ComputeUnit, args.compute_units),
            )
            outs = [model.predict({"image": images[i : i + 1]}) for i in range(len(images))]
            logits = np.concatenate([o["exit_logits"] for o in outs]).astype(np.float32)
            features = np.concatenate([o["features"] for o in outs]).astype(np.float32)
            stats = compare(ref_logits, ref_features, logits, features)
            max_rel, min_agree = TOLERANCES[artifact.quantization]
            stats["pass"] = (
                max(stats["rel_l2_logits"], stats["rel_l2_features"]) <= max_rel
                and stats["top1_agreement"] >= min_agree
            )
            tier_report["variants"].append({"quantization": artifact.quantization, **stats})
            print(f"{tier.name:16} {artifact.quantization:16} {json.dumps(stats)}")
            if not stats["pass"]:
                failures.append(f"{tier.name}/{artifact.quantization}")
        report["tiers"].append(tier_report)
    args.report.write_text(json.dumps(report, indent=2) + "\n")
    if failures:
        print(f"Core ML parity FAILED for: {', '.join(failures)} (report: {args.report})", file=sys.stderr)
        return 1
    print(f"Core ML parity OK (report: {args.report})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
