"""Aggregate benchmark runs over seeds and write the report: report.md (a table per setting, paired
comparisons with confidence intervals, the targets, the convergence line, the latency trade-off and
the tuning trials), results.json (every number, per run and aggregated) and the plots
(accuracy_vs_ood.png, unseen_classes.png, features.png)."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np

from harmony_mobile.algorithms.registry import effective_config
from harmony_mobile.bench.gate_report import curve_table, curve_target_lines, curve_targets, plot_gate_curves
from harmony_mobile.bench.latency import latency_table
from harmony_mobile.bench.profile import own_or_parents, parent_method, repo_relative
from harmony_mobile.bench.stats import paired_ci, sum_known

OOD_FRACTIONS = ("p=0", "p=0.2", "p=0.5")
# (key, column header, format); the row value is read by `metric_value`
COLUMNS = (
    ("acc_p0", "acc p=0", "pct"),
    ("acc_p0.2", "acc p=0.2", "pct"),
    ("acc_p0.5", "acc p=0.5", "pct"),
    ("acc_with_ood", "acc with OOD", "pct"),
    ("exit_rate", "exit rate", "pct"),
    ("fallback_rate", "fallback rate", "pct"),
    ("server_fallback_accuracy", "server fallback acc", "pct"),
    ("exit_only_id", "exit-only acc p=0", "pct"),
    ("server_id", "server acc p=0", "pct"),
    ("alignment_score", "alignment", "pct"),
    ("unseen_family", "family-unseen acc", "pct"),
    ("unseen_client", "client-unseen acc", "pct"),
    ("upload_bytes_per_sample", "upload B/sample", "bytes"),
    ("wall_seconds", "wall s", "seconds"),
)
FAMILY_MARKERS = {"cnn": "o", "mobilenet": "^", "resnet": "s"}
# what each ablation is judged on besides the headline: what the back-end answers for a family's
# unseen classes and how well it aligns the families' features (docs/ALGORITHM.md, "7. Baselines and ablations")
BACKEND_KEYS = (("unseen_family", "family-unseen acc"), ("alignment_score", "alignment"))


def study_of(results: dict) -> dict:
    """The results' mechanism study (`{}` for a profile without one, or results from before studies)."""
    return results.get("mechanism_study") or {}


def metric_value(run: dict, key: str) -> float:
    mean, summary = run["mean"], run["summary"]
    if key.startswith("acc_p"):
        return mean[f"p={key[5:]}"]["accuracy"]
    if key == "acc_with_ood":
        return summary["accuracy_with_ood"]
    if key in ("exit_rate", "fallback_rate", "server_fallback_accuracy"):
        return mean["p=0.5"].get(key, math.nan)  # the hardest mix: half the queries are OOD
    if key in ("exit_only_id", "server_id"):  # each half of the hybrid on the client's own ID samples
        field = "exit_only_accuracy" if key == "exit_only_id" else "server_accuracy"
        return mean["p=0"].get(field, math.nan)
    if key == "alignment_score":
        return summary.get("alignment_score", math.nan)
    if key == "val_acc_with_ood":
        return run.get("validation", {}).get("accuracy_with_ood", math.nan)
    if key == "unseen_family":
        return _defined(run.get("unseen", {}).get("family_mean"))
    if key == "unseen_client":
        return _defined(run.get("unseen", {}).get("client_mean"))
    return float(run.get(key, math.nan))


def _defined(value) -> float:
    return math.nan if value is None else float(value)


def _mean_std(values: list[float]) -> dict:
    array = np.array([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    if len(array) == 0:
        return {"mean": math.nan, "std": math.nan, "n": 0}
    std = float(array.std(ddof=1)) if len(array) > 1 else 0.0
    return {"mean": float(array.mean()), "std": std, "n": int(len(array))}


def aggregate(results: dict) -> dict:
    """setting -> method -> metric -> {mean, std, n} over seeds (sample std); "trained_by": the
    methods whose runs' files the method's runs were evaluated from (training twins), if any."""
    keys = [c[0] for c in COLUMNS] + ["val_acc_with_ood"]
    table: dict[str, dict[str, dict]] = {}
    parents: dict[tuple[str, str], set[str]] = {}
    for run in results["runs"]:
        table.setdefault(run["setting"], {}).setdefault(run["method"], {k: [] for k in keys})
        for key in keys:
            table[run["setting"]][run["method"]][key].append(metric_value(run, key))
        if run.get("trained_by"):
            parents.setdefault((run["setting"], run["method"]), set()).add(run["trained_by"]["method"])
    return {
        setting: {
            method: {k: _mean_std(v) for k, v in metrics.items()}
            | {"trained_by": sorted(parents.get((setting, method), ()))}
            for method, metrics in methods.items()
        }
        for setting, methods in table.items()
    }


def paired_gap(
    results: dict,
    setting: str,
    method: str,
    reference: str,
    key: str = "acc_with_ood",
    confidence: float = 0.95,
) -> dict:
    """method - reference on `key`, paired by seed, with a t confidence interval over seeds."""
    by_seed: dict[int, dict[str, float]] = {}
    for run in results["runs"]:
        if run["setting"] == setting and run["method"] in (method, reference):
            by_seed.setdefault(run["seed"], {})[run["method"]] = metric_value(run, key)
    diffs = [v[method] - v[reference] for _, v in sorted(by_seed.items()) if method in v and reference in v]
    return paired_ci(diffs, confidence)


def _format(stat: dict, kind: str) -> str:
    if stat["n"] == 0:
        return "–"
    m, s = stat["mean"], stat["std"]
    if kind == "pct":
        return f"{100 * m:.1f} ± {100 * s:.1f}"
    if kind == "bytes":
        return f"{m:,.0f}" if s < 0.5 else f"{m:,.0f} ± {s:,.0f}"
    return f"{m:.0f} ± {s:.0f}"


def markdown_table(aggregated: dict, setting: str, methods: list[str]) -> str:
    header = "| method | " + " | ".join(c[1] for c in COLUMNS) + " | val acc with OOD |"
    lines = [header, "|" + "---|" * (len(COLUMNS) + 2)]
    for method in methods:
        if method not in aggregated.get(setting, {}):
            continue
        stats = aggregated[setting][method]
        cells = [_format(stats[key], kind) for key, _, kind in COLUMNS]
        if stats["trained_by"]:  # its wall time is an evaluation of another method's weights
            wall = [key for key, _, _ in COLUMNS].index("wall_seconds")
            cells[wall] += f" (evaluation of {', '.join(stats['trained_by'])}'s runs)"
        cells.append(_format(stats["val_acc_with_ood"], "pct"))
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def method_colors(methods: list[str]) -> dict[str, tuple]:
    """One colour per method, the same in every plot. matplotlib's default cycle has 10 colours, so
    a 12-method profile drew two pairs of methods alike; tab20's ten dark hues come first, then
    its light ones."""
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    order = [*range(0, 20, 2), *range(1, 20, 2)]
    return {method: cmap(order[i % 20]) for i, method in enumerate(methods)}


def plot_accuracy_vs_ood(results: dict, aggregated: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = [s["name"] for s in results["profile"]["settings"] if s["name"] in aggregated]
    methods = results["profile"]["methods"]
    colors = method_colors(methods)
    fig, axes = plt.subplots(1, len(settings), figsize=(5.5 * len(settings), 4.2), squeeze=False)
    xs = [float(p[2:]) for p in OOD_FRACTIONS]
    for ax, setting in zip(axes[0], settings, strict=True):
        for method in methods:
            if method not in aggregated[setting]:
                continue
            stats = aggregated[setting][method]
            means = [100 * stats[f"acc_p{x:g}"]["mean"] for x in xs]
            stds = [100 * stats[f"acc_p{x:g}"]["std"] for x in xs]
            style = "-" if method.startswith("harmony") or method == "splitgp" else "--"
            width = 2.5 if method == "harmony" else 1.3
            ax.errorbar(
                xs,
                means,
                yerr=stds,
                label=method,
                color=colors[method],
                linestyle=style,
                linewidth=width,
                marker="o",
                markersize=3,
                capsize=3,
            )
        ax.set_title(setting)
        ax.set_xlabel("OOD fraction p of each client's test set")
        ax.set_ylabel("mean client accuracy (%)")
        ax.set_xticks(xs)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_unseen(results: dict, aggregated: dict, path: Path) -> bool:
    """Per setting, the accuracy on each family's unseen classes (classes no client of the family
    holds): the server's for split methods, the full model's otherwise; mean over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = _unseen_by_family(results)
    settings = [s["name"] for s in results["profile"]["settings"] if table.get(s["name"])]
    if not settings:
        return False
    colors = method_colors(results["profile"]["methods"])
    fig, axes = plt.subplots(1, len(settings), figsize=(5.5 * len(settings), 4.2), squeeze=False)
    for ax, setting in zip(axes[0], settings, strict=True):
        methods = [m for m in results["profile"]["methods"] if m in table[setting]]
        families = sorted({f for m in methods for f in table[setting][m]})
        width = 0.8 / max(1, len(methods))
        for i, method in enumerate(methods):
            values = [100 * table[setting][method].get(f, math.nan) for f in families]
            ax.bar(np.arange(len(families)) + i * width, values, width, label=method, color=colors[method])
        ax.set_xticks(np.arange(len(families)) + 0.4 - width / 2, families)
        ax.set_title(setting)
        ax.set_ylabel("accuracy on the family's unseen classes (%)")
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3, axis="y")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _unseen_by_family(results: dict) -> dict:
    """setting -> method -> family -> mean over seeds (families with no unseen class left out)."""
    values: dict = {}
    for run in results["runs"]:
        for family, entry in run.get("unseen", {}).get("family", {}).items():
            accuracy = _defined(entry.get("accuracy"))
            if not math.isnan(accuracy):
                cell = values.setdefault(run["setting"], {}).setdefault(run["method"], {})
                cell.setdefault(family, []).append(accuracy)
    return {
        setting: {m: {f: float(np.mean(v)) for f, v in fams.items()} for m, fams in methods.items()}
        for setting, methods in values.items()
    }


def plot_features(projections: dict, path: Path) -> bool:
    """Back-end features of ID + OOD test samples, PCA (and t-SNE when computed): colour = class,
    marker = family. Same-class points of different families together = aligned extractors."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = projections.get("methods", {})
    if not methods:
        return False
    views = [("x", "y", "PCA")]
    if all("tsne_x" in points for points in methods.values()):
        views.append(("tsne_x", "tsne_y", "t-SNE"))
    fig, axes = plt.subplots(
        len(views), len(methods), figsize=(5.5 * len(methods), 5 * len(views)), squeeze=False
    )
    cmap = plt.get_cmap("tab10")
    for row, (kx, ky, title) in enumerate(views):
        for ax, (method, points) in zip(axes[row], methods.items(), strict=True):
            x, y = np.array(points[kx]), np.array(points[ky])
            classes, families = np.array(points["class"]), np.array(points["family"])
            for family in sorted(set(families.tolist())):
                mine = families == family
                ax.scatter(
                    x[mine],
                    y[mine],
                    c=[cmap(c % 10) for c in classes[mine]],
                    marker=FAMILY_MARKERS.get(family, "x"),
                    s=12,
                    alpha=0.7,
                    linewidths=0,
                )
            ax.set_title(f"{method}: back-end features ({title})")
            ax.set_xticks([])
            ax.set_yticks([])
    handles = [
        plt.Line2D([], [], color="gray", marker=m, linestyle="", label=f) for f, m in FAMILY_MARKERS.items()
    ]
    handles += [plt.Line2D([], [], color=cmap(c), marker="o", linestyle="", label=str(c)) for c in range(10)]
    fig.legend(handles=handles, loc="center right", fontsize=7, title="family / class")
    fig.suptitle(
        f"{projections.get('setting')}, seed {projections.get('seed')}: ID + OOD test samples of every client "
        "(colour = class, marker = family)",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0, 0.9, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _code_line(code: dict | None, runs: list[dict], runs_named: str) -> str:
    """The producing invocation's commit, and the commits that made the runs (of every stage) when
    they differ from it (a profile resumed across commits; records of older code did not keep one)."""
    if not code or not code.get("commit"):
        return ""
    line = f"Code: commit {_commit_text(code)}"
    made = Counter(_commit_text(run.get("code")) for run in runs)
    if set(made) != {_commit_text(code)}:
        line += f"; {runs_named} made at " + _tally(made)
    return line + "."


def _tally(counts: Counter) -> str:
    """`a (3 runs), b (1 run)`: each thing with the number of runs it counts, the most common first."""
    return ", ".join(
        f"{thing} ({count} run{'' if count == 1 else 's'})" for thing, count in counts.most_common()
    )


def _summed(seconds: float) -> str:
    """A sum of run times: in hours once it is one, else in minutes."""
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def _cpu_clause(runs: list[dict], runs_named: str) -> str:
    """Which CPUs made the runs, once any run recorded its CPU (the same run on another CPU model
    can round differently and end points apart)."""
    made = Counter(_cpu_text(run.get("cpu")) for run in runs)
    if set(made) == {_cpu_text(None)}:
        return ""  # results of older code recorded none
    return f" CPUs: {runs_named} made on {_tally(made)}."


def _cpu_text(cpu: dict | None) -> str:
    if not cpu:
        return "an unrecorded CPU"
    return f"{cpu['cpu_model']} (torch kernels {cpu['torch_cpu_capability']})"


def _runs_with_provenance(stages: dict[str, list[dict]]) -> tuple[list[dict], str]:
    """Every run of `runs_by_stage`, and what to call them (results of older code kept provenance
    for the evaluation runs only)."""
    named = "evaluation runs" if list(stages) == ["evaluation"] else "runs"
    return [run for runs in stages.values() for run in runs], named


def runs_by_stage(results: dict) -> dict[str, list[dict]]:
    """Each stage that has runs, with them (tuning and budget-check runs as their provenance only;
    results of older code kept none, a profile without those stages has none)."""
    stages = {
        "evaluation": results["runs"],
        "tuning": (results.get("tuning") or {}).get("run_provenance", []),
        "budget check": (results.get("budget_check") or {}).get("run_provenance", []),
        "mechanism study": study_of(results).get("runs", []),
    }
    return {name: runs for name, runs in stages.items() if runs}


def _commit_text(code: dict | None) -> str:
    """A `code_version()` as the report names it."""
    if not code or not code.get("commit"):
        return "an unrecorded commit"
    changed = code.get("uncommitted")
    return f"`{code['commit']}`" + (
        " with uncommitted changes in " + ", ".join(f"`{f}`" for f in changed) if changed else ""
    )


def _json_safe(value):
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


# what each method is, printed for the methods a report holds (a key covers every method named
# like it: `harmony` its ablations and variants, `splitgp` splitgp-restricted)
METHOD_NOTES = {
    "harmony": """\
- `harmony`: docs/ALGORITHM.md (simulated extractors: the meta-weights with weight noise and
  channel drop at a random split depth; the server's CE for a client a softmax over that client's
  own slots (restricted softmax), on features whose statistics it mixes across families (style
  mixing); final personalization; the phone exits by the slot margin, its nearest own slot
  prototype against the nearest other, calibrated on val; `harmony-max-softmax` exits by max
  softmax instead). Meta-adaptation's inner loop
  (`harmony-with-meta`) and supervised contrastive alignment over label-token slots
  (`harmony-with-contrastive`) are off by default and measured turned on.
  Each ablation turns off exactly one mechanism, same hyper-parameters otherwise (its one changed
  field is shown in the configuration table).""",
    "splitgp": """\
- `splitgp`: loss gamma CE(exit) + (1 - gamma) CE(server); client model lambda own + (1 - lambda)
  average; entropy-threshold fallback calibrated on val to the same local-exit accuracy target as
  HARMONY. `splitgp-restricted`: the same with HARMONY's restricted server softmax.""",
    "fedproto": "- `fedproto`: prototype exchange (per-class feature means shared through the server).",
    "multi-exit": "- `multi-exit`: SplitGP with lambda = 0 (no personalization mixing).",
    "fedavg": "- `fedavg`: FedAvg per family on full 4-stage models, no split, no personalization.",
    "local": "- `local`: each client trains its own full 4-stage model on its own data, nothing uploaded.",
    "centralized": """\
- `centralized`: the reference; per family one full model trained on the pooled raw data of all
  clients, with its own stated budget (the raw data upload counts in its upload bytes).""",
}
NO_SPLIT_NOTE = "- No-split methods answer every query with their full model: exit rate 100 %, no fallback."


def method_notes(methods: list[str]) -> str:
    """The notes on the methods this report holds, in the notes' order."""
    kept = [note for key, note in METHOD_NOTES.items() if any(m.startswith(key) for m in methods)]
    if any(m in ("fedavg", "local", "centralized") for m in methods):
        kept.append(NO_SPLIT_NOTE)
    return "\n".join(kept) + "\n"


def _setting_rounds_text(setting: dict, methods: list[str]) -> str:
    """The methods that train for more rounds in `setting` (an ablation takes its parent's)."""
    by_rounds: dict[int, list[str]] = {}
    for method in methods:
        if rounds := own_or_parents(method, setting.get("method_rounds") or {}):
            by_rounds.setdefault(rounds, []).append(method)
    if not by_rounds:
        return ""
    groups = [f"{', '.join(f'`{m}`' for m in names)} {rounds} rounds" for rounds, names in by_rounds.items()]
    return f"; in {setting['name']}: {' and '.join(groups)} of their budget"


def _ci_text(gap: dict, digits: int = 1) -> str:
    """Mean [low, high] in points; more decimals (up to 4) where one would print a bound that is not
    zero as +0.0, which would hide which side of zero the interval ends on."""
    if gap["n"] == 0:
        return "–"
    bounds = [100 * gap[k] for k in ("low", "high") if gap.get(k) is not None]
    while digits < 4 and any(b != 0 and round(b, digits) == 0 for b in bounds):
        digits += 1
    if gap["n"] < 2:
        return f"{100 * gap['mean']:+.{digits}f} (1 seed, no CI)"
    return (
        f"{100 * gap['mean']:+.{digits}f} [{100 * gap['low']:+.{digits}f}, {100 * gap['high']:+.{digits}f}]"
    )


def _digits_to_decide(value: float, threshold: float) -> int:
    """One decimal, or two where one would print a missed threshold as reached (+4.96 as +5.0)."""
    return 2 if f"{value:.1f}" == f"{threshold:.1f}" else 1


def comparisons(results: dict, setting: str, confidence: float = 0.95) -> dict:
    """Paired accuracy-with-OOD gaps: HARMONY minus every other method, each ablation minus HARMONY."""
    methods = [m for m in results["profile"]["methods"] if m != "harmony"]
    if "harmony" not in results["profile"]["methods"]:
        return {"harmony_vs": {}, "ablations": {}}
    ablations = [m for m in methods if m.startswith("harmony-")]
    return {
        "harmony_vs": {
            m: paired_gap(results, setting, "harmony", m, confidence=confidence)
            for m in methods
            if m not in ablations
        },
        "ablations": {
            m: paired_gap(results, setting, m, "harmony", confidence=confidence) for m in ablations
        },
        "backend": {
            m: {
                key: paired_gap(results, setting, m, "harmony", key=key, confidence=confidence)
                for key, _ in BACKEND_KEYS
            }
            for m in ablations
        },
    }


def comparison_lines(gaps: dict, confidence: float) -> list[str]:
    level = f"{100 * confidence:g} %"
    lines = [
        f"Paired by seed, accuracy with OOD, points, mean [{level} t CI]:",
        "",
        "| comparison | difference | CI excludes 0 |",
        "|---|---|---|",
    ]
    for method, gap in gaps["harmony_vs"].items():
        lines.append(f"| harmony - {method} | {_ci_text(gap)} | {'yes' if gap['excludes_zero'] else 'no'} |")
    for method, gap in gaps["ablations"].items():
        lines.append(f"| {method} - harmony | {_ci_text(gap)} | {'yes' if gap['excludes_zero'] else 'no'} |")
    return [*lines, "", *backend_lines(gaps.get("backend", {}), level)]


def backend_lines(backend: dict, level: str) -> list[str]:
    """Each ablation's paired effect on the back-end's answers for unseen classes and on alignment
    (ablations without paired runs in this setting left out)."""
    backend = {m: by_key for m, by_key in backend.items() if any(g["n"] for g in by_key.values())}
    if not backend:
        return []
    lines = [
        f"Each ablation on the back-end, off − on, paired by seed, points, mean [{level} t CI] "
        "(bold: the CI excludes 0):",
        "",
        "| comparison | " + " | ".join(header for _, header in BACKEND_KEYS) + " |",
        "|---|" + "---|" * len(BACKEND_KEYS),
    ]
    for method, by_key in backend.items():
        cells = [_bold_if(_ci_text(by_key[key]), by_key[key]["excludes_zero"]) for key, _ in BACKEND_KEYS]
        lines.append(f"| {method} - harmony | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _bold_if(text: str, condition: bool) -> str:
    return f"**{text}**" if condition else text


def evaluate_targets(results: dict, aggregated: dict, gaps: dict, mechanism_gaps: dict | None = None) -> dict:
    """Per setting: the margin over the best baseline, the fraction of the reference, the gate
    curves against the baselines' and server-only; per mechanism whether turning it off costs
    accuracy with a CI below zero (from `mechanism_gaps`, the mechanism study's, when given)."""
    targets = results["profile"].get("targets")
    if not targets:
        return {}
    out: dict = {"settings": {}, "mechanisms": {}}
    for setting, table in aggregated.items():
        entry: dict = {}
        present = [b for b in targets["baselines"] if b in table]
        if targets["method"] in table and present:
            best = max(present, key=lambda b: table[b]["acc_with_ood"]["mean"])
            gap = gaps[setting]["harmony_vs"].get(best) or paired_gap(
                results, setting, targets["method"], best
            )
            entry["margin"] = {
                "best_baseline": best,
                "gap": gap,
                "met": bool(gap["n"] > 1 and gap["mean"] >= targets["margin"] and gap["low"] > 0),
            }
        reference = targets["reference"]
        if targets["method"] in table and reference in table:
            ratio = (
                table[targets["method"]]["acc_with_ood"]["mean"] / table[reference]["acc_with_ood"]["mean"]
            )
            entry["reference"] = {"ratio": ratio, "met": bool(ratio >= targets["fraction_of_reference"])}
        setting_runs = [r for r in results["runs"] if r["setting"] == setting]
        curves = curve_targets(setting_runs, targets["method"], targets["baselines"])
        if curves is not None:
            entry["curves"] = curves
        out["settings"][setting] = entry
    studied = study_of(results).get("methods", []) if mechanism_gaps else []
    # a run narrowed to some seeds or methods may leave an ablation (or the study) out
    narrowed = any((results.get("narrowed") or {}).get(flag) for flag in ("seeds", "methods"))
    for ablation, mechanism in targets["ablations"].items():
        source = mechanism_gaps if ablation in studied else gaps
        per_setting = {s: g["ablations"][ablation] for s, g in source.items() if ablation in g["ablations"]}
        helps = [s for s, g in per_setting.items() if g["n"] > 1 and g["high"] < 0]
        out["mechanisms"][ablation] = {
            "mechanism": mechanism,
            "study_seeds": len(results["mechanism_study"]["seeds"]) if ablation in studied else None,
            "settings_where_it_helps": helps,
            "settings_where_ci_excludes_zero": [s for s, g in per_setting.items() if g["excludes_zero"]],
            "met": bool(helps),
            "measured": any(g["n"] > 1 for g in per_setting.values()),
            "narrowed": narrowed,
            "backend": _backend_effects(source, ablation),
        }
    return out


def _backend_effects(gaps: dict, ablation: str) -> dict[str, dict[str, list[str]]]:
    """Per back-end measure, the settings where turning the mechanism off lowers it (CI below 0)
    and those where its CI excludes 0 either way."""
    measured = {s: g["backend"][ablation] for s, g in gaps.items() if ablation in g.get("backend", {})}
    return {
        key: {
            "lowers": [
                s for s, by_key in measured.items() if by_key[key]["n"] > 1 and by_key[key]["high"] < 0
            ],
            "excludes_zero": [s for s, by_key in measured.items() if by_key[key]["excludes_zero"]],
        }
        for key, _ in BACKEND_KEYS
    }


def target_lines(targets: dict, spec: dict) -> list[str]:
    if not targets:
        return []
    verdict = {True: "**met**", False: "**not met**"}
    lines = ["## Targets", ""]
    for setting, entry in targets["settings"].items():
        if "margin" in entry:
            m = entry["margin"]
            digits = _digits_to_decide(100 * m["gap"]["mean"], 100 * spec["margin"])
            lines.append(
                f"- {setting}: {spec['method']} with OOD at least {100 * spec['margin']:g} points above the best "
                f"baseline (`{m['best_baseline']}`) with the paired CI above 0: {_ci_text(m['gap'], digits)} -> "
                f"{verdict[m['met']]}"
            )
        if "reference" in entry:
            r = entry["reference"]
            lines.append(
                f"- {setting}: {spec['method']} with OOD at least {100 * spec['fraction_of_reference']:g} % of "
                f"`{spec['reference']}`: {100 * r['ratio']:.1f} % -> {verdict[r['met']]}"
            )
        if "curves" in entry:
            lines += curve_target_lines(setting, spec["method"], entry["curves"], verdict)
    for ablation, entry in targets["mechanisms"].items():
        lines.append(_mechanism_line(ablation, entry, verdict))
    return [*lines, ""]


def _mechanism_line(ablation: str, entry: dict, verdict: dict) -> str:
    head = f"- mechanism *{entry['mechanism']}* (`{ablation}`): "
    if entry.get("study_seeds"):
        head += f"at {entry['study_seeds']} seeds (the mechanism study), "
    if not entry.get("measured", True):  # results of older code did not say
        why = "no setting has paired runs of it"
        if entry.get("narrowed"):
            why += "; this run was narrowed with --seeds or --methods, which leaves it out"
        return head + f"not measured ({why}) -> **not measured**"
    where = ", ".join(entry["settings_where_it_helps"]) or "no setting"
    excludes = ", ".join(entry["settings_where_ci_excludes_zero"]) or "none"
    return (
        head + f"turning it off costs accuracy with OOD with a CI below 0 in {where} (CI excludes 0 in: "
        f"{excludes}) -> {verdict[entry['met']]}" + _backend_clause(entry.get("backend", {}))
    )


def _backend_clause(effects: dict[str, dict[str, list[str]]]) -> str:
    """What the headline verdict leaves out: what turning the mechanism off does to the back-end."""
    if not effects:
        return ""
    headers = dict(BACKEND_KEYS)
    parts = [
        f"{headers[key]} with a CI below 0 in {', '.join(e['lowers']) or 'no setting'} "
        f"(CI excludes 0 in: {', '.join(e['excludes_zero']) or 'none'})"
        for key, e in effects.items()
    ]
    return "; on the back-end, turning it off lowers " + "; ".join(parts)


def convergence_lines(results: dict, aggregated: dict) -> list[str]:
    check = results["profile"].get("convergence")
    if not check:
        return []
    method, floor = check["method"], check["min_accuracy"]
    lines = []
    for setting in results["profile"]["settings"]:
        stats = aggregated.get(setting["name"], {}).get(method)
        if setting["dataset"] not in check["datasets"] or stats is None:
            continue
        accuracy = stats["acc_p0"]["mean"]
        ok = accuracy >= floor
        lines.append(
            # two decimals: at one, a mean just under the line prints as the threshold itself
            f"Convergence ({setting['name']}): `{method}` without OOD {100 * accuracy:.2f} % "
            f"(threshold {100 * floor:g} %): **{'converged' if ok else 'FAIL: not converged'}**."
        )
    return [*lines, ""] if lines else []


def latency_lines(results: dict, setting: str, methods: list[str]) -> list[str]:
    latency = results.get("latency")
    if not latency:
        return []
    if "tiers" not in latency:
        return [f"Latency not measured: {latency.get('error')}", ""]
    rows = latency_table(results, setting, methods)
    if not rows:
        return []
    tiers = list(latency["tiers"])
    head = " | ".join(f"{t} ({latency['tiers'][t]['device_ms']:.2f} ms)" for t in tiers)
    lines = [
        f"Expected ms per query at p=0.2 (exit rate x t_device + fallback rate x (t_device + "
        f"{latency['rtt_ms']:g} ms RTT + {latency['server_ms']:.2f} ms server)), per tier (t_device):",
        "",
        f"| method | {head} | mean over tiers |",
        "|---|" + "---|" * (len(tiers) + 1),
    ]
    for row in rows:
        cells = [
            f"{row['tiers'][t]['expected_ms']:.1f} (exit {100 * row['tiers'][t]['exit_rate']:.0f} %)"
            for t in tiers
        ]
        lines.append(f"| {row['method']} | " + " | ".join(cells) + f" | {row['mean_ms']:.1f} |")
    return [*lines, ""]


def untuned_sentence(methods: list[str], tuned: dict[str, int]) -> str:
    """The end of the tuning paragraph: which methods run the profile's configuration untuned."""
    untuned = [m for m in methods if parent_method(m) == m and m not in tuned]
    if not untuned:
        return "; every other method is tuned."
    return "; not tuned (the profile's configuration): " + ", ".join(f"`{m}`" for m in untuned) + "."


def tuning_lines(results: dict) -> list[str]:
    tuning = results.get("tuning") or {}
    trials = tuning.get("trials") or []
    if not trials:
        return []
    spec = results["profile"].get("tuning") or {}
    per_method: dict[str, int] = {}
    for row in trials:
        if row.get("setting") in (None, trials[0].get("setting")):  # a per-setting pick's rows: once
            per_method[row["method"]] = per_method.get(row["method"], 0) + 1
    where = "each setting's own pick, " if spec.get("per_setting") else ""
    setting = "setting | " if spec.get("per_setting") else ""
    lines = [
        "## Tuning (validation only)",
        "",
        f"Seeds {spec.get('seeds')}, settings {spec.get('settings') or 'all'}; score = mean validation accuracy "
        f"with OOD ({where}clients' val splits + OOD from other clients' val splits; never the test split). "
        "Trials per method: " + ", ".join(f"`{m}` {n}" for m, n in per_method.items()) + ". Ablations and "
        "multi-exit take their parent's pick" + untuned_sentence(results["profile"]["methods"], per_method),
        "",
        f"| {setting}method | trial | params | val acc with OOD | val acc p=0 | chosen |",
        "|---" * (6 + bool(setting)) + "|",
    ]
    for row in trials:
        lines.append(
            f"| {row['setting'] + ' | ' if setting else ''}{row['method']} | {row['trial']} | `{json.dumps(row['params'])}` | "
            f"{100 * row['val_acc_with_ood']:.1f} | {100 * row['val_acc_without_ood']:.1f} | "
            f"{'**yes**' if row.get('chosen') else ''} |"
        )
    return [*lines, ""]


def method_config_lines(results: dict) -> list[str]:
    """The table of what each method trains with (in each setting, when the profile tunes per setting)."""
    by_setting = results.get("method_configs_by_setting")
    if by_setting is None:
        lines = ["## Method configurations", "", "| method | config |", "|---|---|"]
        configs = results.get("method_configs", {})
        return [*lines, *(f"| {m} | `{json.dumps(effective_config(m, c))}` |" for m, c in configs.items())]
    lines = ["## Method configurations", "", "| setting | method | config |", "|---|---|---|"]
    for setting, configs in by_setting.items():
        lines += [f"| {setting} | {m} | `{json.dumps(effective_config(m, c))}` |" for m, c in configs.items()]
    return lines


def _rows_name_settings(check: dict) -> bool:
    """Whether the check's rows are of more than one setting (rows of older code name none: they
    were of one setting, or pooled several)."""
    return len({row.get("setting") for row in check["rows"]} - {None}) > 1


def budget_verdict_lines(results: dict) -> list[str]:
    check = results.get("budget_check")
    if not check:
        return []
    several = _rows_name_settings(check)
    improving = [
        f"{row['method']} ({row['setting']})" if several else row["method"]
        for row in check["rows"]
        if not row["stopped_improving"]
    ]
    verdict = "met" if not improving else f"**not met**: still improving: {', '.join(improving)}"
    return [
        f"Budget: every checked method has stopped improving on validation at its budget (see the budget "
        f"check): {verdict}.",
        "",
    ]


def budget_check_lines(results: dict) -> list[str]:
    check = results.get("budget_check")
    if not check:
        return []
    longer = sorted({int(r) for row in check["rows"] for r in row["val_acc_with_ood"]})
    several = _rows_name_settings(check)
    lines = [
        "## Budget check (validation only)",
        "",
        f"Has each method stopped improving at the budget it is compared at? Its tuned config trained again "
        f"for longer on {', '.join(check['settings'])}, seeds {check['seeds']}; mean validation accuracy "
        f"with OOD. Stopped = no longer budget gains {100 * check['tolerance']:g} or more points"
        + (", per setting." if several else "."),
        "",
        ("| setting " if several else "")
        + "| method | "
        + " | ".join(f"{r} rounds" for r in longer)
        + " | best gain | stopped improving |",
        "|" + "---|" * (several + len(longer) + 3),
    ]
    for row in check["rows"]:
        scores = {int(r): v for r, v in row["val_acc_with_ood"].items()}  # JSON keys are strings
        cells = [f"{100 * scores[r]:.1f}" if r in scores else "–" for r in longer]
        verdict = f"yes, at {row['rounds']} rounds" if row["stopped_improving"] else "**no**"
        lines.append(
            (f"| {row['setting']} " if several else "")
            + f"| {row['method']} | "
            + " | ".join(cells)
            + f" | {100 * row['gain']:+.1f} | {verdict} |"
        )
    return [*lines, ""]


# per-round training metrics that show whether a mechanism does anything, over the rounds and seeds
# of a method: how far the simulated extractors are from theta, how much a class's features move
# across them, and how large the contrastive gradient at z is next to the CE's. The gradient ratio is
# summarized by its median over the rounds' values (each round's own median over its steps; runs of
# older code logged the round's mean): where the CE is fit its gradient nears zero and the ratio
# explodes, so one such round would set the mean
DIAGNOSTICS = (
    ("path_norm", "path ‖θ′−θ‖", np.mean),
    ("noise_norm", "weight noise ‖θ·ε‖", np.mean),
    ("path_to_noise", "path / noise", np.mean),
    ("variant_spread", "feature spread across variants", np.mean),
    ("contrastive_grad_ratio", "‖∇z SupCon‖ / ‖∇z CE‖ (median)", np.median),
)


def retrained_lines(results: dict) -> list[str]:
    """Which recorded runs were trained again for the model files latency and the projections read."""
    retrained = [run for run in results["runs"] if run.get("files_retrained")]
    if not retrained:
        return []

    def percent(value) -> str:  # NaN comes back from results.json as null
        return "–" if value is None or value != value else f"{100 * value:.1f}"

    each = "; ".join(
        f"{run['setting']} `{run['method']}` seed {run['seed']}: "
        f"{percent(run['files_retrained'].get('accuracy_with_ood'))} retrained, "
        f"{percent(run['summary'].get('accuracy_with_ood'))} recorded"
        for run in retrained
    )
    return [
        "Latency and the feature projections read model files, which a checkout does not hold: these "
        "recorded runs were trained again from their configuration for them, and every table keeps "
        f"their records (accuracy with OOD): {each}.",
        "",
    ]


def diagnostic_lines(results: dict, setting: str, methods: list[str]) -> list[str]:
    rows = []
    for method in methods:
        values = {key: [] for key, _, _ in DIAGNOSTICS}
        for run in results["runs"]:
            if run["setting"] != setting or run["method"] != method:
                continue
            for row in run.get("round_metrics", []):
                for key in values:
                    if key in row and row[key] is not None:
                        values[key].append(float(row[key]))
        if any(values.values()):
            cells = [f"{summary(values[key]):.3g}" if values[key] else "–" for key, _, summary in DIAGNOSTICS]
            rows.append(f"| {method} | " + " | ".join(cells) + " |")
    if not rows:
        return []
    header = "| method | " + " | ".join(title for _, title, _ in DIAGNOSTICS) + " |"
    return [
        "Mechanism diagnostics (training metrics over rounds and seeds: means, the gradient ratio's median):",
        "",
        header,
        "|---|" + "---|" * len(DIAGNOSTICS),
        *rows,
        "",
    ]


def budget_line(results: dict) -> str:
    profile = results["profile"]
    budget = profile["budget"]
    text = (
        f"Shared budget: {budget['rounds']} rounds x {budget['local_steps']} local steps x "
        f"{budget['samples_per_step']} samples drawn per step per client (HARMONY: support + query halves)"
    )
    methods = [*profile["methods"], *study_of(results).get("methods", [])]
    own = [  # a method without its own budget trains for its parent's
        f"`{m}` {b['rounds']} x {b['local_steps']} x {b['samples_per_step']}"
        for m in methods
        if (b := own_or_parents(m, profile.get("budgets", {})))
    ]
    if own:
        text += "; methods with their own stated budget instead of the shared one: " + ", ".join(own)
    for setting in profile["settings"]:
        text += _setting_rounds_text(setting, methods)
    return text + f". Shared training settings: `{json.dumps(repo_relative(profile.get('train', {})))}`."


def bench_command(results: dict, argument: str | None = None) -> str:
    """`harmony bench --profile P`: P is `argument` if given (an invocation's own), else the one the
    results were made with."""
    # results of older code did not keep the --profile argument: a profile file's path is not known
    profile = argument or results.get("profile_argument") or results["profile"]["name"]
    return f"harmony bench --profile {profile}"


def command_line(results: dict) -> str:
    """The command that made the report, with the options that narrowed the profile (a partial
    benchmark must say what it left out)."""
    command = bench_command(results)
    for option, values in (results.get("narrowed") or {}).items():
        if values:
            command += f" --{option} {','.join(str(v) for v in values)}"
    return command


def _stages(results: dict) -> dict[str, dict]:
    """The studies beside the evaluation, by name (a profile without one has an empty entry)."""
    return {
        "tuning": results["tuning"],
        "budget check": results.get("budget_check") or {},
        "mechanism study": study_of(results),
    }


def time_line(results: dict) -> str:
    """How long the profile's runs take, from their own wall and CPU times (kept in the run records,
    so a profile finished over several resumed invocations still counts every run), against its
    time goal. The goal covers every run, or with `time_goal_covers: evaluation` the evaluation runs
    alone: a profile whose studies' records (tuning, budget check, mechanism study) are committed
    and read back, not rerun, states the studies' time beside the goal instead."""
    jobs = results.get("machine", {}).get("jobs", 1)
    runs = results["runs"]
    evaluation_only = results["profile"].get("time_goal_covers", "all") == "evaluation"
    stages = [] if evaluation_only else list(_stages(results).values())
    wall = sum(stage.get("run_wall_seconds", 0.0) for stage in stages) + sum(r["wall_seconds"] for r in runs)
    cpu = sum_known(
        [*(stage.get("run_cpu_seconds", 0.0 if not stage else None) for stage in stages)]
        + [r.get("cpu_seconds") for r in runs]
    )
    which = "evaluation runs" if evaluation_only else "training runs"
    text = f"The {which} took {_summed(wall)} summed, about {wall / 60 / jobs:.0f} min with {jobs} job(s)"
    if cpu is not None:  # each run uses one thread: with `jobs` idle cores, its CPU time is its wall time
        text += (
            f"; their CPU time, {cpu / 60:.0f} min summed, is about {cpu / 60 / jobs:.0f} min with {jobs} job(s) "
            "on otherwise idle cores (wall times also count other work sharing the machine)"
        ) + _cpu_time_by_model(runs)
    text += _goal_clause(
        results, (wall if cpu is None else cpu) / 60 / jobs, cpu is not None, evaluation_only
    )
    return (
        text
        + "."
        + _twins_line(runs, "the evaluation's")
        + (" " + studies_time_line(results, jobs) if evaluation_only else "")
    )


def _cpu_time_by_model(runs: list[dict]) -> str:
    """The evaluation runs' CPU time per CPU model, once they were made on more than one: the same
    run costs a different number of CPU seconds on another CPU model, so a sum over several is
    no one machine's time."""
    seconds: Counter = Counter()
    counts: Counter = Counter()
    for run in runs:
        model = _cpu_text(run.get("cpu"))
        seconds[model] += run["cpu_seconds"]
        counts[model] += 1
    if len(counts) < 2:
        return ""
    by_model = Counter({f"{model}: {_summed(seconds[model])}": count for model, count in counts.items()})
    return "; the evaluation runs' CPU time, made on several CPU models, by model: " + _tally(by_model)


def _twins_line(runs: list[dict], whose: str) -> str:
    """Runs that trained nothing: another run's weights evaluated by their own exit gate."""
    twins = Counter(
        f"`{run['method']}` from `{run['trained_by']['method']}`" for run in runs if run.get("trained_by")
    )
    if not twins:
        return ""
    count = sum(twins.values())
    verb = "trains" if count == 1 else "train"
    return (
        f" {count} of the runs {verb} exactly what another run trains, differing only in how the exit "
        f"gate is set, so they are that run's files evaluated again ({_tally(twins)}): their time is "
        f"{whose}."
    )


def _goal_clause(results: dict, minutes: float, on_cpu: bool, evaluation_only: bool) -> str:
    limit = results["profile"].get("time_limit_minutes")
    if not limit:
        return ""
    # results of older code kept neither the narrowing nor the tuning's run time: not judged either
    recorded = "narrowed" in results and (evaluation_only or "run_wall_seconds" in results["tuning"])
    if not (recorded and not any(results["narrowed"].values())):
        return f" (the {limit:.0f}-minute goal is for the whole profile, not judged on a partial run)"
    verdict = "met" if minutes <= limit else "**not met**"
    return f" (goal: within {limit:.0f} min{', judged on CPU time' if on_cpu else ''}: {verdict})"


def studies_time_line(results: dict, jobs: int) -> str:
    """The studies' run time: made once, then read back from their records."""
    parts = []
    for name, study in _stages(results).items():
        if "run_wall_seconds" in study:
            cpu = study.get("run_cpu_seconds")
            seconds, kind = (study["run_wall_seconds"], "wall") if cpu is None else (cpu, "CPU")
            parts.append(
                f"{name} {_summed(seconds)} of {kind} time summed ({seconds / 60 / jobs:.0f} min with {jobs} job(s))"
            )
    if not parts:
        return ""
    return "The studies whose records the profile reads back, outside the goal: " + "; ".join(parts) + "."


def mechanism_view(results: dict) -> dict | None:
    """The mechanism study as results of their own: the target method's runs at the study's seeds
    (the evaluation's where it made them) and the ablations'. None without a study."""
    study = results.get("mechanism_study")
    if not study:
        return None
    method = results["profile"]["targets"]["method"]
    evaluated = [r for r in results["runs"] if r["method"] == method and r["seed"] in study["seeds"]]
    profile = {**results["profile"], "methods": [method, *study["methods"]], "seeds": study["seeds"]}
    return {**results, "profile": profile, "runs": evaluated + study["runs"]}


def mechanism_study_lines(study: dict, gaps: dict, confidence: float) -> list[str]:
    """The study's section: per setting, the target method and its ablations at the study's seeds,
    and each ablation's paired gaps (the mechanism targets are judged on these)."""
    seeds = study["profile"]["seeds"]
    lines = [
        f"## Mechanisms ({len(seeds)} seeds)",
        "",
        f"The mechanism study: `{study['profile']['methods'][0]}` and its ablations on seeds {seeds} "
        "(the evaluation's runs at its seeds, trained once for the others), the only runs the mechanism "
        "targets are judged on.",
        "",
    ]
    aggregated = aggregate(study)
    for setting in study["profile"]["settings"]:
        name = setting["name"]
        if name in aggregated:
            lines += [f"### {name}", "", markdown_table(aggregated, name, study["profile"]["methods"]), ""]
            lines += comparison_lines({**gaps[name], "harmony_vs": {}}, confidence)
            lines += diagnostic_lines(study, name, study["profile"]["methods"])
    twins = _twins_line(study["mechanism_study"]["runs"], "the study's").strip()
    return [*lines, twins, ""] if twins else lines


def extended(results: dict) -> bool:
    """Whether the results were made a setting at a time (`--extend`), by several invocations."""
    return len(results.get("invocations") or []) > 1


def invocation_line(results: dict) -> str:
    """The wall time of the benchmark invocation that produced these results (`--report-only`
    keeps it); with `--resume` part of its runs were read back from earlier invocations, so it can
    be far below the runs' own summed time."""
    if extended(results):
        invocations = results["invocations"]
        text = f"The {len(invocations)} invocations that produced these results took " + " + ".join(
            f"{i['wall_seconds'] / 60:.1f} min (`{i['command']}`)" for i in invocations
        )
    else:
        text = f"The invocation that produced these results took {results['total_wall_seconds'] / 60:.1f} min"
    stages = runs_by_stage(results)
    reused = {name: sum(1 for r in runs if r.get("reused")) for name, runs in stages.items()}
    if any(reused.values()):
        every, named = _runs_with_provenance(stages)
        text += f" ({sum(reused.values())} of {len(every)} {named} read back from earlier invocations with `--resume`"
        if len(stages) > 1:
            text += ": " + ", ".join(f"{name} {reused[name]} of {len(runs)}" for name, runs in stages.items())
        text += _copied_clause(results) + ")"
    return text


def _copied_clause(results: dict) -> str:
    """Which evaluation (and mechanism study) runs were copied from other reports' records
    (`--reuse-runs-from`)."""
    study = results.get("mechanism_study")
    runs = [*results["runs"], *(study["runs"] if study else [])]
    copied = Counter(f"`{run['copied_from']}`" for run in runs if run.get("copied_from"))
    if not copied:
        return ""
    return (
        f"; {sum(copied.values())} of them {'evaluation or study' if study else 'evaluation'} runs copied "
        f"from the records of {_tally(copied)} with "
        "`--reuse-runs-from`, their wall times as measured where they were made"
    )


def header_lines(results: dict) -> list[str]:
    profile = results["profile"]
    machine = results.get("machine", {})
    runs, runs_named = _runs_with_provenance(runs_by_stage(results))
    return [
        f"# Benchmark `{profile['name']}`",
        "",
        profile.get("description", "").strip(),
        "",
        f"Produced by `{command_line(results)}`"
        + (", run a setting at a time with `--extend`" if extended(results) else "")
        + f". Evaluation seeds {profile['seeds']}; every "
        "method gets the same partition and tiers per seed. "
        + budget_line(results)
        + " "
        + invocation_line(results)
        + f" on {machine.get('cpu_count')} CPUs, {machine.get('jobs', 1)} parallel job(s) of 1 torch "
        "thread. " + time_line(results),
        "",
        _code_line(machine.get("code"), runs, runs_named) + _cpu_clause(runs, runs_named),
        "",
        "Columns: accuracy = mean over clients of the phone's answer (local exit when confident, else the "
        "server back-end), each client's test set = its ID test samples plus a fraction p of OOD samples "
        "(classes it does not hold); *with OOD* = mean of p=0.2 and p=0.5. Exit rate, fallback rate and "
        "server fallback accuracy (accuracy of the back-end on the queries that fell back) at p=0.5. "
        "Exit-only and server acc p=0: each half of the hybrid alone on the client's ID test samples (the "
        "exit head's answer for every sample; the back-end's answer for every sample, fallen back or not). "
        "Alignment = cross-family kNN accuracy of back-end features. Family-unseen acc = accuracy on the "
        "classes no client of the family holds (the server's for split methods, the full model's otherwise), "
        "mean over families that miss a class; client-unseen acc = the same on the classes the client "
        "itself lacks. Upload B/sample = every byte a phone sends during training divided by the number of "
        "training samples. Val acc with OOD = the same accuracy on validation data only, the only number "
        "tuning looks at. Mean ± sample std over seeds; percentages.",
        "",
    ]


def write_bench_report(results: dict, out_dir: Path, notes: str = "") -> Path:
    """Write report.md, results.json and the PNG plots into `out_dir`; returns the report path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    aggregated = aggregate(results)
    profile = results["profile"]
    methods = profile["methods"]
    confidence = (profile.get("targets") or {}).get("confidence", 0.95)
    gaps = {setting: comparisons(results, setting, confidence) for setting in aggregated}
    study = mechanism_view(results)
    study_gaps = (
        {setting: comparisons(study, setting, confidence) for setting in aggregated} if study else None
    )
    targets = evaluate_targets(results, aggregated, gaps, study_gaps)
    study_lines = mechanism_study_lines(study, study_gaps, confidence) if study else []
    plot_accuracy_vs_ood(results, aggregated, out_dir / "accuracy_vs_ood.png")
    has_unseen = plot_unseen(results, aggregated, out_dir / "unseen_classes.png")
    has_features = plot_features(results.get("projections", {}), out_dir / "features.png")
    has_gates = plot_gate_curves(results, out_dir / "gate_curves.png", method_colors(methods))
    (out_dir / "results.json").write_text(
        json.dumps(
            _json_safe(
                {**results, "aggregated": aggregated, "gaps": gaps, "targets_evaluated": targets}
                | ({"mechanism_gaps": study_gaps} if study else {})
            ),
            indent=1,
        )
    )
    lines = header_lines(results) + target_lines(targets, profile.get("targets") or {})
    lines += convergence_lines(results, aggregated) + budget_verdict_lines(results)
    for setting_spec in profile["settings"]:
        setting = setting_spec["name"]
        if setting not in aggregated:
            continue
        lines += [f"## {setting}", "", markdown_table(aggregated, setting, methods), ""]
        if gaps[setting]["harmony_vs"] or gaps[setting]["ablations"]:
            lines += comparison_lines(gaps[setting], confidence)
        lines += curve_table(results, setting, methods)
        lines += diagnostic_lines(results, setting, methods)
        lines += latency_lines(results, setting, methods)
    lines += [*study_lines, "## Plots", "", "![accuracy vs OOD fraction](accuracy_vs_ood.png)", ""]
    if has_unseen:
        lines += ["![accuracy on each family's unseen classes](unseen_classes.png)", ""]
    if has_features:
        lines += ["![back-end features](features.png)", ""]
    lines += retrained_lines(results)
    if has_gates:
        lines += ["![accuracy vs fallback rate](gate_curves.png)", ""]
    lines += tuning_lines(results)
    lines += budget_check_lines(results)
    lines += method_config_lines(results)
    lines += ["", "## Methods", "", method_notes([*methods, *(study["profile"]["methods"] if study else [])])]
    notes = "\n\n".join(n.strip() for n in (profile.get("notes", ""), notes) if n and n.strip())
    if notes:
        lines += ["## Notes", "", notes, ""]
    report = out_dir / "report.md"
    report.write_text("\n".join(lines))
    return report
