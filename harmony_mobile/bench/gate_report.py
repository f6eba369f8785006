"""The benchmark report's exit-gate section: each split method's accuracy against its fallback
rate (bench/gates.py), at the points the comparison is made, with HARMONY's curve minus each
baseline's paired by seed, the gate's OOD AUROC, the oracle gate and the server answering
everything; and the curves as a plot.

Curves are read on test samples at the OOD fractions of bench/gates.py, averaged over them, for the
score each method exits by (`gate_rule`), so every method is compared at the same fallback rates.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from harmony_mobile.algorithms.registry import ALGORITHMS
from harmony_mobile.bench.gates import FALLBACK_GRID
from harmony_mobile.bench.stats import paired_ci

COMPARED_RATES = (0.1, 0.2, 0.3, 0.5)


def gate_rule(run: dict) -> str:
    """The score a run's method exits by (what its calibrated threshold is on)."""
    return (run.get("gates") or {}).get("exit_rule", "max_softmax")


def study_rows(run: dict, on: str) -> list[dict]:
    """The run's gate study rows on `on` ("test" or "val"), one per OOD fraction (none for a run
    without a gate)."""
    study = (run.get("gates") or {}).get(on) or {}
    return [row for key, row in study.items() if key.startswith("p=") and row]


def run_curve(run: dict, rule: str | None = None) -> np.ndarray | None:
    """Mean over the OOD fractions of the run's test curve for `rule` (its own by default)."""
    rows = study_rows(run, "test")
    if not rows:
        return None
    rule = rule or gate_rule(run)
    return np.mean([row["curve"][rule] for row in rows], axis=0)


def _run_extra(run: dict, key: str) -> float:
    """Mean over the OOD fractions of the run's `auroc` (for its own rule), `oracle` or `server_only`."""
    rows = study_rows(run, "test")
    if not rows:
        return float("nan")
    if key == "auroc":
        return float(np.mean([row["auroc"][gate_rule(run)] for row in rows]))
    return float(np.mean([row[key] for row in rows]))


def curve_table(results: dict, setting: str, methods: list[str]) -> list[str]:
    rows = curve_rows(results, setting, methods)
    if not rows:
        return []
    method = ((results.get("profile") or {}).get("targets") or {}).get("method", "harmony")
    return [
        f"### Accuracy vs fallback rate ({setting})",
        "",
        "Test accuracy with OOD (mean of p = 0.2 and 0.5) when each phone sends the given share of its "
        "samples to the server, lowest gate score first; mean over seeds.",
        "",
        *rows,
        *gate_score_table(results, setting, method),
    ]


def curve_rows(results: dict, setting: str, methods: list[str]) -> list[str]:
    """Each method's curve by the score it exits by, then HARMONY's minus each other's."""
    runs = [r for r in results["runs"] if r["setting"] == setting and run_curve(r) is not None]
    if not runs:
        return []
    index = [FALLBACK_GRID.index(rate) for rate in COMPARED_RATES]
    header = " | ".join(f"at {rate:.0%} fallback" for rate in COMPARED_RATES)
    lines = [
        f"| method | gate | {header} | OOD AUROC | oracle gate | server only |",
        "|---|---|" + "---|" * (len(COMPARED_RATES) + 3),
    ]
    for method in methods:
        mine = [r for r in runs if r["method"] == method]
        if not mine:
            continue
        curves = np.array([run_curve(r) for r in mine])
        cells = [f"{100 * curves[:, i].mean():.1f}" for i in index]
        extras = [np.nanmean([_run_extra(r, k) for r in mine]) for k in ("auroc", "oracle", "server_only")]
        lines.append(
            f"| {method} | {gate_rule(mine[0])} | "
            + " | ".join(cells)
            + f" | {extras[0]:.3f} | {100 * extras[1]:.1f} | {100 * extras[2]:.1f} |"
        )
    return lines + [""] + curve_gap_lines(runs, methods)


def gate_score_table(results: dict, setting: str, method: str = "harmony") -> list[str]:
    """`method`'s phones gated by each score the gate study records (its own and the others), on
    validation, where a gate would be picked, and on test: accuracy at the compared fallback rates
    and OOD AUROC, mean over seeds."""
    runs = [r for r in results["runs"] if r["setting"] == setting and r["method"] == method]
    runs = [r for r in runs if study_rows(r, "val") and study_rows(r, "test")]
    if not runs:
        return []
    index = [FALLBACK_GRID.index(rate) for rate in COMPARED_RATES]
    # scores every run recorded (records made before a score existed lack it)
    rows = [row for r in runs for on in ("val", "test") for row in study_rows(r, on)]
    rules = [rule for rule in rows[0]["curve"] if all(rule in row["curve"] for row in rows)]
    header = " | ".join(f"{rate:.0%}" for rate in COMPARED_RATES)
    lines = [
        f"`{method}`'s phones gated by each score (its own: `{gate_rule(runs[0])}`), accuracy with OOD at "
        f"each fallback rate and OOD AUROC, mean over {len(runs)} seeds; validation is where a gate would "
        "be picked:",
        "",
        f"| score | on | {header} | OOD AUROC |",
        "|---|---|" + "---|" * (len(COMPARED_RATES) + 1),
    ]
    for rule in rules:
        for on in ("val", "test"):
            curves = np.array(
                [np.mean([row["curve"][rule] for row in study_rows(r, on)], axis=0) for r in runs]
            )
            auroc = np.nanmean([row["auroc"][rule] for r in runs for row in study_rows(r, on)])
            cells = " | ".join(f"{100 * curves[:, i].mean():.1f}" for i in index)
            lines.append(f"| {rule} | {on} | {cells} | {auroc:.3f} |")
    return lines + [""]


def _curves_by_seed(runs: list[dict], method: str) -> dict[int, np.ndarray]:
    """Seed -> test curve of `method`'s runs that have one."""
    curves = {r["seed"]: run_curve(r) for r in runs if r["method"] == method}
    return {seed: curve for seed, curve in curves.items() if curve is not None}


def curve_gap_lines(runs: list[dict], methods: list[str]) -> list[str]:
    """HARMONY's curve minus each other split method's, paired by seed, at each compared rate."""
    harmony = _curves_by_seed(runs, "harmony")
    if not harmony:
        return []
    lines = ["| harmony - method | " + " | ".join(f"{r:.0%}" for r in COMPARED_RATES) + " |"]
    lines.append("|---|" + "---|" * len(COMPARED_RATES))
    for method in methods:
        if method == "harmony":
            continue
        other = _curves_by_seed(runs, method)
        seeds = sorted(set(harmony) & set(other))
        if not seeds:
            continue
        cells = []
        for rate in COMPARED_RATES:
            i = FALLBACK_GRID.index(rate)
            gap = paired_ci([100 * (harmony[s][i] - other[s][i]) for s in seeds])
            mark = "**" if gap["excludes_zero"] else ""
            cells.append(f"{mark}{gap['mean']:+.1f} [{gap['low']:+.1f}, {gap['high']:+.1f}]{mark}")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    if len(lines) == 2:
        return []
    return lines + ["", "Paired by seed, 95 % t interval; bold: the interval excludes 0.", ""]


# the target's "fallback rates 10-50 %": every rate of the grid in that range
TARGET_RATES = tuple(rate for rate in FALLBACK_GRID if 0.1 <= rate <= 0.5)
SERVER_ONLY_TOLERANCE = 0.02  # the hybrid at most 2 points below the server answering everything


def _uses_split(method: str) -> bool:
    entry = ALGORITHMS.get(method)
    return bool(entry and entry[0].uses_split)


def curve_targets(runs: list[dict], method: str, baselines: list[str]) -> dict | None:
    """Whether `method`'s curve lies above every split baseline's at every target rate (the mean
    over seeds paired with it; a split baseline with fewer than 2 paired seeds leaves the target not
    met, as unmeasured), with the smallest gap and its CI; and whether the hybrid at 50 % fallback is
    at most SERVER_ONLY_TOLERANCE below its own back-end answering everything."""
    mine = _curves_by_seed(runs, method)
    if not mine:
        return None
    gaps, unmeasured, seeds_paired = {}, [], {}
    split_baselines = [b for b in baselines if b != method and _uses_split(b)]
    for baseline in split_baselines:
        other = _curves_by_seed(runs, baseline)
        seeds = sorted(set(mine) & set(other))
        seeds_paired[baseline] = len(seeds)
        if len(seeds) < 2:
            unmeasured.append(baseline)
            continue
        for rate in TARGET_RATES:
            i = FALLBACK_GRID.index(rate)
            gaps[(baseline, rate)] = paired_ci([mine[s][i] - other[s][i] for s in seeds])
    worst = None
    if gaps:
        (baseline, rate), gap = min(gaps.items(), key=lambda item: item[1]["mean"])
        worst = {"baseline": baseline, "rate": rate, "gap": gap, "seeds": seeds_paired[baseline]}
    half = FALLBACK_GRID.index(0.5)
    at_half = float(np.mean([curve[half] for curve in mine.values()]))
    own = [r for r in runs if r["method"] == method and r["seed"] in mine]
    server_only = float(np.mean([_run_extra(r, "server_only") for r in own]))
    return {
        "above": {
            "met": bool(worst is not None and not unmeasured and worst["gap"]["mean"] > 0),
            "named": bool(split_baselines),  # a study of HARMONY alone compares with none
            "compared": sorted({baseline for baseline, _ in gaps}),
            "unmeasured": unmeasured,
            "worst": worst,
        },
        "server_only": {
            "hybrid_at_half": at_half,
            "server_only": server_only,
            "met": bool(at_half >= server_only - SERVER_ONLY_TOLERANCE),
        },
    }


def curve_target_lines(setting: str, method: str, entry: dict, verdict: dict) -> list[str]:
    above, server, w = entry["above"], entry["server_only"], entry["above"]["worst"]
    head = f"- {setting}: `{method}`'s accuracy-vs-fallback curve above every split baseline's at fallback 10-50 %"
    parts = []
    if w is not None:
        parts.append(
            f"closest `{w['baseline']}` at {w['rate']:.0%}, {100 * w['gap']['mean']:+.1f} points (mean over "
            f"{w['seeds']} paired seeds; CI [{100 * w['gap']['low']:+.1f}, {100 * w['gap']['high']:+.1f}])"
        )
    if above["unmeasured"]:
        parts.append(f"fewer than 2 seeds paired with `{method}`: {', '.join(above['unmeasured'])}")
    first = f"{head}: {'; '.join(parts) or 'no split baseline ran'} -> {verdict[above['met']]}"
    second = (
        f"- {setting}: `{method}`'s hybrid at 50 % fallback at most {100 * SERVER_ONLY_TOLERANCE:g} points "
        f"below its back-end answering everything: {100 * server['hybrid_at_half']:.1f} vs "
        f"{100 * server['server_only']:.1f} -> {verdict[server['met']]}"
    )
    return [first, second] if above.get("named", True) else [second]


def plot_gate_curves(results: dict, path: Path, colors: dict) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = [s["name"] for s in results["profile"]["settings"]]
    by_setting = {
        s: [r for r in results["runs"] if r["setting"] == s and run_curve(r) is not None] for s in settings
    }
    settings = [s for s in settings if by_setting[s]]
    if not settings:
        return False
    fig, axes = plt.subplots(1, len(settings), figsize=(5.5 * len(settings), 4.2), squeeze=False)
    for ax, setting in zip(axes[0], settings, strict=True):
        for method in results["profile"]["methods"]:
            curves = [run_curve(r) for r in by_setting[setting] if r["method"] == method]
            if curves:
                ax.plot(
                    FALLBACK_GRID,
                    100 * np.mean(curves, axis=0),
                    label=method,
                    color=colors.get(method),
                    linewidth=2.5 if method == "harmony" else 1.2,
                )
        ax.set_title(setting)
        ax.set_xlabel("fallback rate (share of samples sent to the server)")
        ax.set_ylabel("accuracy with OOD (%)")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
