"""What the demo shows and writes: a table per phase while it runs, the summary and drift/recovery
tables, demo-report.json, demo-report.md and the plots."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from harmony_mobile.demo.config import PHASE_TITLES, PHASES


def _pct(value: float) -> str:
    return "n/a" if value != value else f"{100 * value:.1f}%"


def _exit_and_accuracy_cells(r: dict) -> list[str]:
    """The cells the live table and the summary share: where answers came from and how right they were."""
    return [
        _pct(r["exit_rate"]),
        _pct(r["fallback_rate"]),
        _pct(r["accuracy_without_ood"]),
        _pct(r["accuracy_with_ood"]),
        _pct(r["exit_only_accuracy_with_ood"]),
    ]


def show_phase(console: Console, results: dict, phase: str) -> None:
    table = Table(title=PHASE_TITLES[phase])
    columns = (
        "tier",
        "local exit",
        "fallback",
        "acc. w/o OOD",
        "acc. with OOD",
        "exit-only with OOD",
        "server on fallback",
        "server on ID / OOD",
    )
    for column in columns:
        table.add_column(column, justify="right" if column != "tier" else "left")
    for tier, phases in results.items():
        r = phases[phase]
        table.add_row(
            tier,
            *_exit_and_accuracy_cells(r),
            _pct(r["server_fallback_accuracy"]),
            f"{_pct(r['server_accuracy_id'])} / {_pct(r['server_accuracy_ood'])}",
        )
    console.print(table)


SUMMARY_COLUMNS = (
    "tier",
    "phase",
    "local exit",
    "fallback",
    "acc. w/o OOD",
    "acc. with OOD",
    "exit-only with OOD",
    "server acc. on OOD",
    "median .pte ms",
    "KiB sent (infer + upload)",
)


def summary_rows(report: dict) -> list[list[str]]:
    rows = []
    for tier, phases in report["results"].items():
        for phase in PHASES:
            if phase not in phases:
                continue
            r = phases[phase]
            uploaded = report["uploads"][tier].get(phase, {}).get("upload_bytes", 0)
            rows.append(
                [
                    tier,
                    phase,
                    *_exit_and_accuracy_cells(r),
                    _pct(r["server_accuracy_ood"]),
                    f"{r['median_latency_ms']:.3f}",
                    f"{r['infer_bytes'] / 1024:.0f} + {uploaded / 1024:.0f}",
                ]
            )
    return rows


RECOVERY_COLUMNS = (
    "tier",
    "server acc. on the phone's features: deployed -> drifted -> aligned",
    "drift loss",
    "recovered",
    "server acc. on OOD",
    "exit tau: deployed -> drifted",
    "local exit: deployed -> drifted",
    "acc. with OOD",
)


def _recovered(a: float, b: float, c: float) -> str:
    """Share of the drift loss won back; a loss under one point is within sampling noise."""
    if a - b < 0.01:
        return "no drift loss"
    return _pct((c - b) / (a - b)) if c <= a else f"all, {100 * (c - a):+.1f} pts beyond"


def recovery_rows(report: dict) -> list[list[str]]:
    rows = []
    for tier, phases in report["results"].items():
        if not all(p in phases for p in PHASES):
            continue
        # the fallback accuracy drift costs and alignment wins back, independent of the exit threshold
        a, b, c = (phases[p]["server_accuracy"] for p in PHASES)
        drift = report["drift"].get(tier, {})
        tau = (drift.get(k, float("nan")) for k in ("threshold_deployed", "threshold_drifted"))
        rows.append(
            [
                tier,
                f"{_pct(a)} -> {_pct(b)} -> {_pct(c)}",
                f"{100 * (a - b):+.1f} pts",
                _recovered(a, b, c),
                " -> ".join(_pct(phases[p]["server_accuracy_ood"]) for p in PHASES),
                " -> ".join(f"{v:.4f}" for v in tau),
                f"{_pct(phases['deployed']['exit_rate'])} -> {_pct(phases['drifted']['exit_rate'])}",
                " -> ".join(_pct(phases[p]["accuracy_with_ood"]) for p in PHASES),
            ]
        )
    return rows


def write_demo_report(out: Path, report: dict, console: Console) -> None:
    (out / "demo-report.json").write_text(json.dumps(report, indent=2, default=str))
    plots = make_plots(out, report)
    table = Table(title="harmony demo: per tier, before drift / after drift / after alignment (p = 0.5 OOD)")
    for column in SUMMARY_COLUMNS:
        table.add_column(column, justify="left" if column in ("tier", "phase") else "right")
    for row in summary_rows(report):
        table.add_row(*row)
    console.print(table)
    recovery = Table(title="drift and recovery of the server's accuracy on each phone's features (ID + OOD)")
    for column in RECOVERY_COLUMNS:
        recovery.add_column(column, justify="left" if column == "tier" else "right")
    for row in recovery_rows(report):
        recovery.add_row(*row)
    console.print(recovery)
    alignment = report.get("alignment") or {}
    console.print(
        f"alignment round: {alignment.get('status')} -> {alignment.get('new_version')}; "
        f"wall time {report['timings']['total']:.0f} s; report: {out / 'demo-report.md'}"
    )
    (out / "demo-report.md").write_text(markdown_report(report, plots))


def _md_table(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def markdown_report(report: dict, plots: list[str]) -> str:
    """demo-report.md: one section per stage's numbers, then the plots and where the files are."""
    parts = [
        *_md_header(report),
        *_md_drift_and_recovery(report),
        _md_alignment(report),
        "",
        *_md_outage(report),
        *_md_training_and_export(report),
        "## Wall time",
        "",
        _md_table(("stage", "seconds"), [[k, f"{v:.0f}"] for k, v in report["timings"].items()]),
        "",
    ]
    if plots:
        parts += ["## Plots", ""] + [f"![{Path(p).stem}]({p})" for p in plots] + [""]
    parts += [
        "## Where things are",
        "",
        "`run/` training run, `export/` signed export (manifest.json, .pte, .mlpackage, backend), "
        "`keys/` the export's signing keys (owner-only), `server/` server data dir (SQLite store, "
        "back-end versions), `server.log`, `phones/<tier>/` upload queue and the parameters personalized "
        "on device (`personalized_parameters.npz`), `demo-report.json` every number above.",
        "",
    ]
    return "\n".join(parts)


def _md_header(report: dict) -> list[str]:
    config = report["config"]
    return [
        "# harmony demo report",
        "",
        f"Data set `{config['dataset']}`, {config['rounds']} training rounds, {config['clients_per_tier']} "
        f"clients per tier, seed {config['seed']}. One simulated phone per tier (the tier's exported "
        f"client) runs the signed `{config['quantization']}` .pte on the ExecuTorch runtime over its own "
        f"test data: its ID test samples plus OOD samples (classes it never held) at p = "
        f"{config['ood_fraction']}. Model version `{report['export']['model_version']}`.",
        "",
        "## Summary",
        "",
        _md_table(SUMMARY_COLUMNS, summary_rows(report)),
        "",
        "*local exit / fallback*: share of test images answered by the phone's exit / sent to the server. "
        "*exit-only*: accuracy if the phone never fell back. *KiB sent*: binary infer bodies + sealed "
        "uploads of confirmed samples. *median .pte ms*: the front-end on this machine's CPU.",
        "",
    ]


def _md_drift_and_recovery(report: dict) -> list[str]:
    config, drift = report["config"], report["drift"]
    return [
        "## Drift and recovery",
        "",
        _md_table(RECOVERY_COLUMNS, recovery_rows(report)),
        "",
        "*server acc. on the phone's features*: the server's answer on the features of every test image "
        "of the phone (ID and OOD), i.e. the fallback accuracy, whatever the exit threshold; drift loss "
        "and recovery are measured on it. *acc. with OOD* also moves with the recalibrated tau.",
        "",
        f"Drift: each phone personalized on device: {config['drift_steps']} SGD steps (lr "
        f"{config['drift_lr']}) of its exit classifier on its own labelled samples (labels as exit "
        "positions through its secret), run through the export's ExecuTorch training program ("
        + ", ".join(f"{t} `{d['trained_through']}`" for t, d in drift.items())
        + "; TrainingModule + SGD, the frozen stages through the XNNPACK personalize_frozen.pte), "
        "then it answered with the trained parameters (personalize_head.pte) and recalibrated its exit "
        "threshold tau on its own validation samples: the smallest tau whose local-exit accuracy on them "
        "reaches training's calibration target ("
        + ", ".join(
            f"{t} {d['calibration_target']:g} on {d['val_samples']} samples" for t, d in drift.items()
        )
        + "; a threshold fixed by the tier is kept). Steps/s through the .pte vs the same steps in eager "
        "PyTorch (same rows, same seed, this machine): "
        + ", ".join(
            f"{t} {d['steps_per_second_pte']:.0f} vs {d['steps_per_second_eager']:.0f} "
            f"({d['pte_vs_eager_speed']:.2f}x eager; loss {d['final_exit_loss']:.4f} vs "
            f"{d['final_exit_loss_eager']:.4f})"
            for t, d in drift.items()
        )
        + ". tau deployed (manifest, calibrated on the fp32 model) / of the deployed .pte on the same "
        "samples / after personalization: "
        + ", ".join(
            f"{t} "
            + " / ".join(
                f"{d[k]:.4f}" for k in ("threshold_deployed", "threshold_deployed_pte", "threshold_drifted")
            )
            for t, d in drift.items()
        )
        + ". Relative change of the interface features (the trained classifier does not touch them; "
        "the phone moved from its deployed variant to the fp32 frozen program): "
        + ", ".join(f"{t} {d['feature_shift']:.0%}" for t, d in drift.items())
        + ".",
        "",
    ]


def _md_alignment(report: dict) -> str:
    alignment = report.get("alignment") or {}
    metrics = alignment.get("metrics") or {}
    return (
        f"Alignment round: status **{alignment.get('status')}**, new back-end `{alignment.get('new_version')}`, "
        f"slot cross-entropy + SupCon on {metrics.get('rows')} new stored rows ({metrics.get('train_rows')} train / "
        f"{metrics.get('holdout_rows')} held out), distillation to the previous version on "
        f"{metrics.get('replay_rows')} replay rows ({metrics.get('replay_shipped_rows')} shipped with the "
        f"back-end, {metrics.get('replay_stored_rows')} stored; {metrics.get('replay_holdout_rows')} held out). "
        f"Held-out replay agreement with the previous version {metrics.get('replay_agreement', float('nan')):.3f} "
        f"(check: {metrics.get('replay_check')}), held-out slot accuracy of the new rows "
        f"{metrics.get('holdout_slot_accuracy_before', float('nan')):.3f} -> "
        f"{metrics.get('holdout_slot_accuracy_after', float('nan')):.3f}, slots "
        f"{metrics.get('slots_before')} -> {metrics.get('slots_after')}"
        + (f"; rejected because {metrics['rejected_because']}" if metrics.get("rejected_because") else "")
        + f". Parameters: `{json.dumps(report['config']['alignment'])}` (empty: the server's defaults)."
    )


def _md_outage(report: dict) -> list[str]:
    metrics = (report.get("alignment") or {}).get("metrics") or {}
    return [
        "## Server outage",
        "",
        "The server was stopped after the drift; each phone answered test images (a failed fallback "
        "answers with the local exit) and sealed its confirmed uploads into its durable queue, then the "
        "server was restarted and the queues flushed: "
        + "; ".join(
            f"{t}: {o['local_after_server_failure']} of {o['answered']} answered locally after a failed "
            f"fallback, {o['queued_uploads']} uploads queued, {o.get('delivered_after_restart')} delivered"
            for t, o in (report.get("outage") or {}).items()
        )
        + f". The alignment round found {metrics.get('rows')} stored rows: every confirmed row exactly once.",
        "",
    ]


def _md_training_and_export(report: dict) -> list[str]:
    train = (report.get("train") or {}).get("summary") or {}
    return [
        "## Training and export",
        "",
        f"Training (in-process evaluation, all clients): accuracy without OOD "
        f"{train.get('accuracy_without_ood', float('nan')):.3f}, with OOD {train.get('accuracy_with_ood', float('nan')):.3f}, "
        f"exit-only with OOD {train.get('exit_only_accuracy_with_ood', float('nan')):.3f}.",
        "",
        _md_table(
            ("tier", "artifact sizes (bytes)"),
            [
                [tier, ", ".join(f"{q} {s:,}" for q, s in sizes.items())]
                for tier, sizes in report["export"]["tiers"].items()
            ],
        ),
        "",
    ]


def make_plots(out: Path, report: dict) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (out / "plots").mkdir(exist_ok=True)
    tiers = list(report["results"])
    x = np.arange(len(tiers))
    width = 0.2
    fig, ax = plt.subplots(figsize=(8, 4))
    exit_only = [report["results"][t]["deployed"]["exit_only_accuracy_with_ood"] for t in tiers]
    ax.bar(x - 1.5 * width, exit_only, width, label="exit only (deployed)", color="#bbbbbb")
    colors = {"deployed": "#1f77b4", "drifted": "#d62728", "aligned": "#2ca02c"}
    for i, phase in enumerate(PHASES):
        values = [report["results"][t].get(phase, {}).get("accuracy_with_ood", np.nan) for t in tiers]
        ax.bar(x + (i - 0.5) * width, values, width, label=phase, color=colors[phase])
    ax.set_xticks(x, tiers)
    ax.set_ylim(0, 1)
    ax.set_ylabel(f"accuracy with OOD (p = {report['config']['ood_fraction']})")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title("phones: exit only vs hybrid, before drift, after drift, after alignment")
    fig.tight_layout()
    fig.savefig(out / "plots" / "accuracy.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4))
    for i, phase in enumerate(PHASES):
        values = [report["results"][t].get(phase, {}).get("server_fallback_accuracy", np.nan) for t in tiers]
        ax.bar(x + (i - 1) * width, values, width, label=phase, color=colors[phase])
    ax.set_xticks(x, tiers)
    ax.set_ylim(0, 1)
    ax.set_ylabel("server accuracy on fallback samples")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "plots" / "fallback.png", dpi=120)
    plt.close(fig)
    return ["plots/accuracy.png", "plots/fallback.png"]
