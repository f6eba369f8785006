"""The knob screen's tables: validation accuracy with OOD of each variant's runs beside `base`'s,
paired by setting and seed (what a pick is made on), then the test numbers of the variants run on
every seed (`python compare.py > comparison.md`, from this folder)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from scipy import stats

HERE = Path(__file__).resolve().parent
PAIRS = [(s, seed) for s in ("fashion-family", "fashion-dirichlet-0.3") for seed in (101, 102, 104, 105)]
# `base` at seeds 104 and 105: the fashion-one-variant probe's records of the same configuration,
# made on the same CPU model (at 101 and 102 this folder's base reproduced the budget check's
# records exactly)
BASE_ELSEWHERE = HERE.parent / "fashion-one-variant/work-harmony-48"


def record_of(variant: str, setting: str, seed: int) -> Path:
    record = HERE / f"work-{variant}/eval/{setting}/harmony/seed-{seed}/bench.json"
    if variant == "base" and not record.is_file():
        return BASE_ELSEWHERE / f"eval/{setting}/harmony/seed-{seed}/bench.json"
    return record


def validation(variant: str) -> dict:
    scores = {}
    for setting, seed in PAIRS:
        record = record_of(variant, setting, seed)
        if record.is_file():
            scores[setting, seed] = 100 * json.loads(record.read_text())["validation"]["accuracy_with_ood"]
    return scores


def main() -> None:
    base = validation("base")
    header = " | ".join(f"{s.removeprefix('fashion-')} {seed}" for s, seed in PAIRS)
    print(f"| variant | {header} | mean | variant - base (paired 95 % t) |")
    print("|---" * (len(PAIRS) + 3) + "|")
    for work in sorted(HERE.glob("work-*")):
        variant = work.name.removeprefix("work-")
        scores = validation(variant)
        if not scores:
            continue
        cells = " | ".join(f"{scores[p]:.1f}" if p in scores else "–" for p in PAIRS)
        d = np.array([scores[p] - base[p] for p in PAIRS if p in scores])
        half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d)) if d.any() else 0.0
        diff = f"{d.mean():+.2f} [{d.mean() - half:+.2f}, {d.mean() + half:+.2f}]"
        print(f"| {variant} | {cells} | {np.mean(list(scores.values())):.1f} ({len(d)}) | {diff} |")


def test_numbers(variant: str, setting: str) -> list[float]:
    """Test accuracy with OOD and without, the hybrid at 50 % fallback, the server answering
    everything, mean over the setting's seeds, percent."""
    rows = []
    for seed in sorted({seed for s, seed in PAIRS if s == setting}):
        record = json.loads(record_of(variant, setting, seed).read_text())
        gates = record["gates"]["test"]
        at = gates["fallback_grid"].index(0.5)
        mixes = ("p=0.2", "p=0.5")
        rows.append(
            [
                record["summary"]["accuracy_with_ood"],
                record["summary"]["accuracy_without_ood"],
                np.mean([gates[p]["curve"]["slot_margin"][at] for p in mixes]),
                np.mean([gates[p]["server_only"] for p in mixes]),
            ]
        )
    return list(100 * np.mean(rows, axis=0))


def test_table() -> None:
    complete = [w.name.removeprefix("work-") for w in sorted(HERE.glob("work-*"))]
    complete = ["base"] + [v for v in complete if v != "base" and len(validation(v)) == len(PAIRS)]
    print()
    print("| setting | variant | test acc with OOD | acc p=0 | hybrid at 50 % fallback | server only | gap |")
    print("|---|---|---|---|---|---|---|")
    for setting in dict.fromkeys(s for s, _ in PAIRS):
        for variant in complete:
            with_ood, without, at_50, server = test_numbers(variant, setting)
            print(
                f"| {setting.removeprefix('fashion-')} | {variant} | {with_ood:.1f} | {without:.1f} "
                f"| {at_50:.1f} | {server:.1f} | {server - at_50:.1f} |"
            )


if __name__ == "__main__":
    main()
    test_table()
