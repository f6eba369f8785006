"""The benchmark report writer on a small synthetic results dict, and the profile's budget rules."""

import json
import math

import numpy as np
import pytest
import yaml
from pydantic import ValidationError
from scipy import stats

from harmony_mobile.bench.latency import expected_latency_ms
from harmony_mobile.bench.profile import REPO_ROOT, BenchProfile, load_profile
from harmony_mobile.bench.report import aggregate, paired_gap, repo_relative, write_bench_report
from harmony_mobile.bench.runner import budget_specs, evaluation_specs
from harmony_mobile.bench.stats import paired_ci

METHODS = ["harmony", "harmony-full-softmax", "splitgp", "fedavg", "centralized"]
SEEDS = (0, 1, 2, 3, 4)
# per-seed noise, so that paired differences have a spread (and a CI of non-zero width)
NOISE = {0: 0.0, 1: 0.01, 2: -0.01, 3: 0.02, 4: 0.005}
BASE = {"harmony": 0.9, "harmony-full-softmax": 0.85, "splitgp": 0.7, "fedavg": 0.6, "centralized": 0.93}
TIERS = ("entry-android", "flagship")


def fake_run(method: str, seed: int, accuracy: float, split: bool = True) -> dict:
    mean = {}
    for p in ("p=0", "p=0.2", "p=0.5"):
        row = {"accuracy": accuracy - (0.1 if p != "p=0" else 0.0), "exit_rate": 0.6 if split else 1.0}
        if split:
            row |= {"fallback_rate": 0.4, "server_fallback_accuracy": 0.7}
        mean[p] = row
    summary = {"accuracy_without_ood": accuracy, "accuracy_with_ood": accuracy - 0.1}
    if split:
        summary["alignment_score"] = 0.5
    rates = {p: {"exit_rate": 0.6 if split else 1.0, "fallback_rate": 0.4 if split else 0.0} for p in mean}
    return {
        "setting": "toy-family",
        "method": method,
        "seed": seed,
        "summary": summary,
        "mean": mean,
        "wall_seconds": 10.0 + seed,
        "upload_bytes_per_sample": 1234.0,
        "uplink": {"total": 1234},
        "validation": {"accuracy_with_ood": accuracy - 0.05, "accuracy_without_ood": accuracy},
        "unseen": {
            "family": {"cnn": {"accuracy": accuracy / 2, "classes": [8, 9]}, "resnet": {"accuracy": None}},
            "family_mean": accuracy / 2,
            "client_mean": accuracy / 3,
        },
        "per_tier": {tier: rates for tier in TIERS},
        "round_metrics": [
            {"round": 0, "path_to_noise": 0.5, "contrastive_grad_ratio": 0.2},
            {"round": 1, "path_to_noise": 1.5, "contrastive_grad_ratio": 0.3},
            # a round where the CE is fit: the ratio's outlier
            {"round": 2, "path_to_noise": 1.0, "contrastive_grad_ratio": 9e6},
        ]
        if method == "harmony"
        else [{"round": 0, "loss": 1.0}],
    }


def synthetic_results(centralized: float = 0.93) -> dict:
    base = {**BASE, "centralized": centralized}
    runs = [
        fake_run(m, seed, base[m] + NOISE[seed] * (m == "harmony"), split=m not in ("fedavg", "centralized"))
        for seed in SEEDS
        for m in METHODS
    ]
    points = {
        "x": [0.0, 1.0, 2.0, 3.0],
        "y": [1.0, 0.0, 1.0, 2.0],
        "tsne_x": [0.0, 1.0, 2.0, 3.0],
        "tsne_y": [3.0, 0.0, 1.0, 2.0],
        "class": [0, 1, 2, 3],
        "family": ["cnn", "mobilenet", "resnet", "cnn"],
        "ood": [False, False, True, False],
    }
    return {
        "profile": {
            "name": "toy",
            "description": "a synthetic profile",
            "seeds": list(SEEDS),
            "settings": [{"name": "toy-family", "dataset": "mnist5k", "partition": "family"}],
            "methods": METHODS,
            "budget": {"rounds": 2, "local_steps": 3, "samples_per_step": 32},
            "budgets": {"centralized": {"rounds": 9, "local_steps": 8, "samples_per_step": 64}},
            "train": {"clients_per_tier": 2},
            "notes": "tuned on validation only",
            "tuning": {"seeds": [100], "settings": None, "grids": {}},
            "convergence": {"method": "centralized", "datasets": ["mnist5k"], "min_accuracy": 0.95},
            "targets": {
                "method": "harmony",
                "baselines": ["splitgp", "fedavg"],
                "margin": 0.05,
                "reference": "centralized",
                "fraction_of_reference": 0.9,
                "ablations": {"harmony-full-softmax": "restricted server softmax"},
                "confidence": 0.95,
            },
        },
        "method_configs": {m: {"local_steps": 3} for m in METHODS},
        "machine": {"cpu_count": 2, "jobs": 2},
        "total_wall_seconds": 123.0,
        "runs": runs,
        "tuning": {
            "chosen": {"harmony": {"lr": 0.003}},
            "trials": [
                {
                    "method": "harmony",
                    "trial": 0,
                    "params": {"lr": 0.003},
                    "val_acc_with_ood": 0.8,
                    "val_acc_without_ood": 0.9,
                    "runs": 1,
                    "chosen": True,
                },
                {
                    "method": "harmony",
                    "trial": 1,
                    "params": {"lr": 0.01},
                    "val_acc_with_ood": 0.7,
                    "val_acc_without_ood": 0.85,
                    "runs": 1,
                    "chosen": False,
                },
            ],
        },
        "latency": {
            "tiers": {"entry-android": {"device_ms": 1.0}, "flagship": {"device_ms": 3.0}},
            "server_ms": 2.0,
            "rtt_ms": 50.0,
        },
        "projections": {
            "setting": "toy-family",
            "seed": 0,
            "methods": {"splitgp": points, "harmony": points},
        },
    }


def test_paired_ci_is_the_student_t_interval_and_says_when_it_excludes_zero():
    diffs = [0.01, 0.03, -0.01, 0.05, 0.02]
    ci = paired_ci(diffs)
    low, high = stats.t.interval(0.95, df=4, loc=np.mean(diffs), scale=stats.sem(diffs))
    assert ci["low"] == pytest.approx(low) and ci["high"] == pytest.approx(high)
    assert ci["n"] == 5 and not ci["excludes_zero"]  # low < 0 < high
    assert paired_ci([0.05, 0.06, 0.07])["excludes_zero"]
    assert paired_ci([-0.05, -0.06, -0.07])["excludes_zero"]
    one = paired_ci([0.2])
    assert math.isnan(one["low"]) and not one["excludes_zero"]  # one seed: no interval, no claim
    constant = paired_ci([0.2, 0.2, float("nan"), 0.2])
    assert constant["n"] == 3 and constant["excludes_zero"]
    assert constant["low"] == pytest.approx(0.2) and constant["high"] == pytest.approx(0.2)


def test_aggregate_gives_mean_and_sample_std_over_seeds():
    results = synthetic_results()
    aggregated = aggregate(results)
    harmony = aggregated["toy-family"]["harmony"]
    assert harmony["acc_p0"]["mean"] == pytest.approx(0.9 + np.mean(list(NOISE.values())))
    assert harmony["acc_p0"]["std"] == pytest.approx(np.std(list(NOISE.values()), ddof=1))
    assert harmony["acc_with_ood"]["n"] == 5
    assert harmony["unseen_family"]["mean"] == pytest.approx(harmony["acc_p0"]["mean"] / 2)
    assert math.isnan(aggregated["toy-family"]["fedavg"]["alignment_score"]["mean"])
    gap = paired_gap(results, "toy-family", "harmony", "splitgp")
    assert gap["per_seed"] == pytest.approx([0.2 + NOISE[s] for s in SEEDS])
    assert gap["low"] > 0.15 and gap["excludes_zero"]


def test_a_training_twins_wall_time_says_it_evaluated_another_methods_runs(tmp_path):
    results = synthetic_results()
    for run in results["runs"]:
        if run["method"] == "harmony-full-softmax":
            run["trained_by"] = {"method": "harmony", "cpu_seconds": 200.0, "code": None, "cpu": None}
    aggregated = aggregate(results)
    assert aggregated["toy-family"]["harmony-full-softmax"]["trained_by"] == ["harmony"]
    assert aggregated["toy-family"]["harmony"]["trained_by"] == []
    rows = write_bench_report(results, tmp_path).read_text().splitlines()
    twin = next(line for line in rows if line.startswith("| harmony-full-softmax |"))
    trained = next(line for line in rows if line.startswith("| harmony |"))
    assert "(evaluation of harmony's runs)" in twin and "evaluation of" not in trained


def test_expected_latency_weighs_device_and_fallback_time():
    assert expected_latency_ms(1.0, 2.0, 5.0, 50.0) == pytest.approx(2.0)  # everything exits
    assert expected_latency_ms(0.0, 2.0, 5.0, 50.0) == pytest.approx(57.0)  # everything falls back
    assert expected_latency_ms(0.6, 2.0, 5.0, 50.0) == pytest.approx(0.6 * 2 + 0.4 * 57)
    assert math.isnan(expected_latency_ms(float("nan"), 2.0, 5.0, 50.0))


def test_report_has_tables_cis_targets_convergence_latency_tuning_and_plots(tmp_path):
    results = synthetic_results()
    report = write_bench_report(results, tmp_path)
    text = report.read_text()
    assert "## toy-family" in text
    assert "| method | acc p=0 | acc p=0.2 | acc p=0.5 | acc with OOD |" in text
    harmony_row = next(line for line in text.splitlines() if line.startswith("| harmony |"))
    assert "1,234" in harmony_row  # upload bytes per sample
    fedavg_row = next(line for line in text.splitlines() if line.startswith("| fedavg |"))
    assert "–" in fedavg_row  # no fallback / alignment for a no-split method
    gap = paired_ci([0.2 + NOISE[s] for s in SEEDS])
    expected = f"| harmony - splitgp | +{100 * gap['mean']:.1f} [+{100 * gap['low']:.1f}, +{100 * gap['high']:.1f}] | yes |"
    assert expected in text
    ablation_row = next(
        line for line in text.splitlines() if line.startswith("| harmony-full-softmax - harmony")
    )
    assert ablation_row.endswith("| yes |")  # -5 points on every seed up to the harmony noise
    # targets: +20 over the best baseline (splitgp), 0.80 / 0.83 of centralized, the mechanism helps
    assert "above the best baseline (`splitgp`)" in text and "-> **met**" in text
    ratio = (0.8 + np.mean(list(NOISE.values()))) / 0.83  # 0.97 >= 0.9
    assert f"90 % of `centralized`: {100 * ratio:.1f} % -> **met**" in text
    assert "*restricted server softmax* (`harmony-full-softmax`)" in text
    assert (
        "Convergence (toy-family): `centralized` without OOD 93.00 % (threshold 95 %): **FAIL: not converged**"
        in text
    )
    # latency: exit 60 %: 0.6 * 1 + 0.4 * (1 + 50 + 2) = 21.8 ms on entry-android
    assert (
        "21.8 (exit 60 %)" in text
        and "| fedavg |" not in text.split("Expected ms per query")[1].split("##")[0]
    )
    assert '| harmony | 0 | `{"lr": 0.003}` | 80.0 | 90.0 | **yes** |' in text
    # the methods without trials are named from the results (the ablation takes harmony's pick)
    assert "not tuned (the profile's configuration): `splitgp`, `fedavg`, `centralized`." in text
    assert "methods with their own stated budget instead of the shared one: `centralized` 9 x 8 x 64" in text
    diagnostics = text.split("Mechanism diagnostics")[1].split("\n\n")[1].splitlines()
    # path / noise: the mean of 0.5, 1.5 and 1.0; the gradient ratio: the median, not the outlier's mean
    assert diagnostics[2] == "| harmony | – | – | 1 | – | 0.3 |"
    assert len(diagnostics) == 3  # methods that log none of the diagnostics have no row
    assert "tuned on validation only" in text
    # an ablation's configuration shows the one field that defines it, not only the profile's values
    assert '| harmony-full-softmax | `{"local_steps": 3, "own_classes_only": false}` |' in text
    assert '| harmony | `{"local_steps": 3}` |' in text
    for png in ("accuracy_vs_ood.png", "unseen_classes.png", "features.png"):
        data = (tmp_path / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
        assert f"]({png})" in text
    loaded = json.loads((tmp_path / "results.json").read_text())
    assert loaded["runs"] == json.loads(json.dumps(results["runs"]))
    assert loaded["aggregated"]["toy-family"]["fedavg"]["alignment_score"]["mean"] is None  # NaN -> null
    assert loaded["targets_evaluated"]["mechanisms"]["harmony-full-softmax"]["met"] is True
    # the report re-renders from its own results.json (NaN stored as null) with the same tables
    rerendered = write_bench_report(loaded, tmp_path / "again").read_text()
    assert rerendered.split("## Plots")[0] == text.split("## Plots")[0]


def test_the_targets_judge_the_gate_curves_of_the_split_runs(tmp_path):
    from harmony_mobile.bench.gates import FALLBACK_GRID

    results = synthetic_results()
    for run in results["runs"]:
        if run["method"] in ("harmony", "splitgp"):
            shift = 0.1 if run["method"] == "harmony" else 0.0
            curve = [0.5 + 0.3 * r + shift + NOISE[run["seed"]] for r in FALLBACK_GRID]
            row = {
                "curve": {"max_softmax": curve},
                "auroc": {"max_softmax": 0.7},
                "oracle": 0.9,
                "server_only": 0.95,
            }
            run["gates"] = {"test": {"p=0.2": row, "p=0.5": row}, "exit_rule": "max_softmax"}
    text = write_bench_report(results, tmp_path).read_text()
    targets = text.split("## Targets")[1].split("\n## ")[0]
    assert "curve above every split baseline's at fallback 10-50 %: closest `splitgp`" in targets
    assert "+10.0 points (mean over 5 paired seeds" in targets
    # harmony at 50 %: 0.5 + 0.15 + 0.1 + mean noise 0.005 = 75.5 against 95.0
    assert "at most 2 points below its back-end answering everything: 75.5 vs 95.0 -> **not met**" in targets


def test_a_margin_missed_by_less_than_the_rounding_is_printed_with_the_digit_that_decides():
    from harmony_mobile.bench.report import target_lines

    def line(mean: float) -> str:
        gap = {"n": 5, "mean": mean, "low": 0.026, "high": 0.073, "excludes_zero": True}
        entry = {"margin": {"best_baseline": "fedavg", "gap": gap, "met": mean >= 0.05}}
        targets = {"settings": {"s": entry}, "mechanisms": {}}
        return target_lines(targets, {"method": "harmony", "margin": 0.05})[2]

    assert line(0.0496).endswith("+4.96 [+2.60, +7.30] -> **not met**")
    assert line(0.0504).endswith("+5.04 [+2.60, +7.30] -> **met**")
    assert line(0.0480).endswith("+4.8 [+2.6, +7.3] -> **not met**")


def test_an_interval_bound_near_zero_shows_its_side_of_zero():
    from harmony_mobile.bench.report import _ci_text

    def ci(low: float, high: float) -> str:
        return _ci_text({"n": 10, "mean": -0.013, "low": low, "high": high})

    assert ci(-0.027, 0.0003) == "-1.30 [-2.70, +0.03]"  # "+0.0" would hide that it reaches zero
    assert ci(-0.027, -0.0003) == "-1.30 [-2.70, -0.03]"
    assert ci(-0.027, -0.006) == "-1.3 [-2.7, -0.6]"
    assert _ci_text({"n": 5, "mean": 0.0, "low": 0.0, "high": 0.0}) == "+0.0 [+0.0, +0.0]"  # a twin's gap


def test_each_ablation_is_judged_on_the_back_end_too(tmp_path):
    text = write_bench_report(synthetic_results(), tmp_path).read_text()
    # family-unseen acc (half the accuracy in fake_run) falls on every seed without the restricted
    # softmax; alignment (0.5 for every split run) does not move
    unseen = paired_ci([(0.85 - 0.9 - NOISE[s]) / 2 for s in SEEDS])
    unseen_text = f"{100 * unseen['mean']:+.1f} [{100 * unseen['low']:+.1f}, {100 * unseen['high']:+.1f}]"
    backend_row = text.split("Each ablation on the back-end")[1].split("\n\n")[1].splitlines()[2]
    assert backend_row == f"| harmony-full-softmax - harmony | **{unseen_text}** | +0.0 [+0.0, +0.0] |"
    assert (
        "on the back-end, turning it off lowers family-unseen acc with a CI below 0 in toy-family "
        "(CI excludes 0 in: toy-family); alignment with a CI below 0 in no setting (CI excludes 0 in: none)"
        in text
    )


def test_a_back_end_measure_that_rises_without_the_mechanism_is_named_too(tmp_path):
    results = synthetic_results()
    for run in results["runs"]:
        if run["method"] == "harmony-full-softmax":  # alignment up by 0.1 + noise on every seed
            run["summary"]["alignment_score"] = 0.6 + NOISE[run["seed"]]
    text = write_bench_report(results, tmp_path).read_text()
    assert "alignment with a CI below 0 in no setting (CI excludes 0 in: toy-family)" in text


def test_a_mechanism_whose_ablation_was_not_run_is_not_measured_rather_than_not_met(tmp_path):
    results = synthetic_results()
    results["runs"] = [r for r in results["runs"] if r["method"] != "harmony-full-softmax"]
    text = write_bench_report(results, tmp_path).read_text()
    line = next(line for line in text.splitlines() if "(`harmony-full-softmax`)" in line)
    assert line.endswith("not measured (no setting has paired runs of it) -> **not measured**")
    assert "Each ablation on the back-end" not in text
    results["narrowed"] = {"settings": None, "seeds": [0, 1], "methods": None}
    text = write_bench_report(results, tmp_path / "narrowed").read_text()
    line = next(line for line in text.splitlines() if "(`harmony-full-softmax`)" in line)
    assert "this run was narrowed with --seeds or --methods, which leaves it out) -> **not measured**" in line


def test_the_report_says_whether_the_profile_kept_its_time_goal(tmp_path):
    results = synthetic_results()
    results["profile"]["time_limit_minutes"] = 1.0
    results["tuning"]["run_wall_seconds"] = 60.0
    results["narrowed"] = {"settings": None, "seeds": None, "methods": None}  # the whole profile
    # runs: 10 + seed seconds each, 5 methods x seeds 0-4 = 300 s; (300 + 60) / 2 jobs = 3 min
    text = write_bench_report(results, tmp_path).read_text()
    assert "6 min summed, about 3 min with 2 job(s) (goal: within 1 min: **not met**)" in text
    results["profile"]["time_limit_minutes"] = 3.0
    assert "(goal: within 3 min: met)" in write_bench_report(results, tmp_path / "again").read_text()


def test_the_time_goal_is_judged_on_cpu_time_when_every_run_kept_it(tmp_path):
    """Wall times count other work sharing the machine; one-thread runs' CPU time does not."""
    results = synthetic_results()
    results["profile"]["time_limit_minutes"] = 2.0
    results["tuning"] |= {"run_wall_seconds": 60.0, "run_cpu_seconds": 30.0}
    results["narrowed"] = {"settings": None, "seeds": None, "methods": None}
    for run in results["runs"]:  # wall 10 + seed s, of which 5 s were the run's own CPU
        run["cpu_seconds"] = 5.0
    # CPU: 30 + 25 runs x 5 = 155 s = 0.04 h, / 2 jobs = 1.3 min: within 2 min; wall 3 min is not
    text = write_bench_report(results, tmp_path).read_text()
    assert "6 min summed, about 3 min with 2 job(s); their CPU time, 3 min summed, is about 1 min" in text
    assert "(goal: within 2 min, judged on CPU time: met)" in text
    del results["runs"][0]["cpu_seconds"]  # a record of older code: judged on wall time again
    text = write_bench_report(results, tmp_path / "wall").read_text()
    assert "their CPU time" not in text and "(goal: within 2 min: **not met**)" in text


def test_cpu_time_made_on_several_cpu_models_is_also_stated_per_model(tmp_path):
    """The same run costs different CPU seconds on another CPU: a mixed sum is named as one."""
    results = synthetic_results()
    results["profile"] |= {"time_limit_minutes": 2.0, "time_goal_covers": "evaluation"}
    results["narrowed"] = {"settings": None, "seeds": None, "methods": None}
    xeon = {"cpu_model": "Intel Xeon", "torch_cpu_capability": "AVX512"}
    epyc = {"cpu_model": "AMD EPYC", "torch_cpu_capability": "AVX2"}
    for run in results["runs"]:
        run |= {"cpu_seconds": 6.0, "cpu": xeon}
    assert "by model" not in write_bench_report(results, tmp_path / "one").read_text()
    for run in results["runs"][:4]:
        run |= {"cpu_seconds": 60.0, "cpu": epyc}
    total = len(results["runs"])
    text = write_bench_report(results, tmp_path / "two").read_text()
    assert (
        "by model: Intel Xeon (torch kernels AVX512): "
        f"{(total - 4) * 6 / 60:.0f} min ({total - 4} runs), AMD EPYC (torch kernels AVX2): 4 min (4 runs)"
        " (goal: within 2 min, judged on CPU time: **not met**)"
    ) in text


def test_a_profile_whose_studies_are_read_back_judges_its_evaluation_runs_alone(tmp_path):
    """`time_goal_covers: evaluation`: tuning and the budget check are stated, not judged."""
    results = synthetic_results()
    results["profile"] |= {"time_limit_minutes": 2.0, "time_goal_covers": "evaluation"}
    results["tuning"]["run_wall_seconds"] = 6000.0
    results["narrowed"] = {"settings": None, "seeds": None, "methods": None}  # the whole profile
    for run in results["runs"]:
        run["wall_seconds"] = 14.0
    # 5 methods x seeds 0-4 x 14 s = 350 s; / 2 jobs = 2.9 min
    text = write_bench_report(results, tmp_path).read_text()
    assert (
        "The evaluation runs took 6 min summed, about 3 min with 2 job(s) (goal: within 2 min: **not met**)"
        in text
    )
    assert "outside the goal: tuning 1.7 h of wall time summed (50 min with 2 job(s))." in text
    results["profile"]["time_limit_minutes"] = 3.0
    assert "(goal: within 3 min: met)" in write_bench_report(results, tmp_path / "again").read_text()


def test_a_resumed_report_says_its_runs_were_read_back_not_timed_by_this_invocation(tmp_path):
    results = synthetic_results()
    assert (
        "The invocation that produced these results took 2.0 min on"
        in write_bench_report(results, tmp_path).read_text()
    )
    for run in results["runs"][:7]:
        run["reused"] = True
    text = write_bench_report(results, tmp_path / "resumed").read_text()
    total = len(results["runs"])
    assert (
        f"took 2.0 min (7 of {total} evaluation runs read back from earlier invocations with `--resume`)"
        in text
    )
    # tuning and budget-check runs read back count too, per stage
    results["tuning"]["run_provenance"] = [{"reused": True, "code": None}, {"reused": False, "code": None}]
    results["budget_check"] = {
        **{"rows": [], "settings": ["toy"], "seeds": [101], "tolerance": 0.01},
        "run_provenance": [{"reused": True, "code": None}] * 4,
    }
    text = write_bench_report(results, tmp_path / "stages").read_text()
    assert (
        f"(12 of {total + 6} runs read back from earlier invocations with `--resume`: "
        f"evaluation 7 of {total}, tuning 1 of 2, budget check 4 of 4)"
    ) in text


def test_the_code_line_names_the_cpus_that_made_the_runs_once_any_run_recorded_one(tmp_path):
    results = synthetic_results()
    results["machine"]["code"] = {"commit": "bbb2222", "uncommitted": []}
    assert "CPUs:" not in write_bench_report(results, tmp_path / "older").read_text()  # none recorded
    epyc = {"cpu_model": "AMD EPYC", "torch_cpu_capability": "AVX512"}
    for run in results["runs"][1:]:
        run["cpu"] = epyc
    results["tuning"]["run_provenance"] = [{"reused": True, "code": None, "cpu": epyc}]
    text = write_bench_report(results, tmp_path / "now").read_text()
    total = len(results["runs"])
    assert (
        f"CPUs: runs made on AMD EPYC (torch kernels AVX512) ({total} runs), an unrecorded CPU (1 run)."
        in text
    )


def test_the_code_line_names_the_commits_that_made_the_runs_when_they_differ(tmp_path):
    results = synthetic_results()
    results["machine"]["code"] = {"commit": "bbb2222", "uncommitted": []}
    for run in results["runs"]:
        run["code"] = {"commit": "bbb2222", "uncommitted": []}
    assert "Code: commit `bbb2222`.\n" in write_bench_report(results, tmp_path).read_text()
    total = len(results["runs"])
    for run in results["runs"][:3]:
        run["code"] = {"commit": "aaa1111", "uncommitted": []}
    del results["runs"][3]["code"]  # a record of older code
    results["runs"][4]["code"] = {"commit": "bbb2222", "uncommitted": ["harmony_mobile/training.py"]}
    text = write_bench_report(results, tmp_path / "mixed").read_text()
    assert (
        f"Code: commit `bbb2222`; evaluation runs made at `bbb2222` ({total - 5} runs), `aaa1111` (3 runs)"
        in text
    )
    # with the other stages' provenance kept, their runs are named too
    results["tuning"]["run_provenance"] = [{"reused": True, "code": {"commit": "ccc3333", "uncommitted": []}}]
    text = write_bench_report(results, tmp_path / "stages").read_text()
    assert (
        f"Code: commit `bbb2222`; runs made at `bbb2222` ({total - 5} runs), `aaa1111` (3 runs), "
        "an unrecorded commit (1 run), `bbb2222` with uncommitted changes in `harmony_mobile/training.py` "
        "(1 run), `ccc3333` (1 run)."
    ) in text


def test_a_narrowed_benchmark_names_what_it_ran_in_its_command(tmp_path):
    results = synthetic_results()
    assert "Produced by `harmony bench --profile toy`." in write_bench_report(results, tmp_path).read_text()
    results["narrowed"] = {"settings": ["toy-family"], "seeds": [0, 1], "methods": None}
    results["profile"]["time_limit_minutes"] = 120.0
    text = write_bench_report(results, tmp_path / "narrowed").read_text()
    assert "Produced by `harmony bench --profile toy --settings toy-family --seeds 0,1`." in text
    assert "(the 120-minute goal is for the whole profile, not judged on a partial run)" in text


def test_a_report_made_from_a_profile_file_names_that_file_in_its_command(tmp_path):
    from harmony_mobile.bench.runner import REPO_ROOT, profile_argument

    probe = REPO_ROOT / "benchmarks" / "results" / "split-budget-probe" / "profile-96.yaml"
    assert profile_argument(probe) == "benchmarks/results/split-budget-probe/profile-96.yaml"
    assert profile_argument("standard") == "standard"
    assert profile_argument(tmp_path / "mine.yaml") == str(tmp_path / "mine.yaml")  # outside the repository
    results = synthetic_results()
    results["profile_argument"] = "benchmarks/results/split-budget-probe/profile-96.yaml"
    text = write_bench_report(results, tmp_path).read_text()
    assert (
        "Produced by `harmony bench --profile benchmarks/results/split-budget-probe/profile-96.yaml`." in text
    )


def test_the_report_names_a_tiers_file_of_the_repository_relative_to_it(tmp_path):
    from harmony_mobile.bench.profile import CONFIG_DIR

    results = synthetic_results()
    results["profile"]["train"]["tiers_file"] = str(CONFIG_DIR / "tiers-standard.yaml")
    text = write_bench_report(results, tmp_path).read_text()
    assert '"tiers_file": "benchmarks/configs/tiers-standard.yaml"' in text
    results["profile"]["train"]["tiers_file"] = "/elsewhere/tiers.yaml"  # outside: kept as it is
    assert '"tiers_file": "/elsewhere/tiers.yaml"' in write_bench_report(results, tmp_path / "b").read_text()


def test_every_method_of_a_twelve_method_profile_has_its_own_colour():
    from harmony_mobile.bench.report import method_colors

    methods = load_profile("standard").methods
    assert len(methods) == 12 and len(set(method_colors(methods).values())) == 12


def test_results_of_older_code_are_not_judged_against_the_time_goal(tmp_path):
    results = synthetic_results()  # no "narrowed", no tuning run time: written before they were kept
    results["profile"]["time_limit_minutes"] = 120.0
    text = write_bench_report(results, tmp_path).read_text()
    assert "not judged on a partial run" in text and "met)" not in text


def test_a_learning_rate_decay_must_span_the_methods_rounds():
    data = load_profile("standard").model_dump()
    data["algorithm_config"]["centralized"] = {"decay_rounds": 10}
    with pytest.raises(ValidationError, match="decay_rounds 10 must equal its budget's rounds"):
        BenchProfile(**data)


def test_a_converged_reference_passes_the_convergence_line(tmp_path):
    just_under = write_bench_report(synthetic_results(centralized=0.9496), tmp_path / "under").read_text()
    assert "without OOD 94.96 % (threshold 95 %): **FAIL: not converged**" in just_under
    text = write_bench_report(synthetic_results(centralized=0.97), tmp_path).read_text()
    assert "`centralized` without OOD 97.00 % (threshold 95 %): **converged**" in text


def test_profiles_share_one_budget_and_pass_hyper_parameters_to_relatives():
    profile = BenchProfile(
        name="t",
        seeds=[0],
        settings=[{"name": "s"}],
        methods=["harmony", "harmony-full-softmax", "splitgp", "multi-exit", "fedavg", "centralized"],
        budget={"rounds": 2, "local_steps": 5, "samples_per_step": 64},
        budgets={"centralized": {"rounds": 30, "local_steps": 8, "samples_per_step": 64}},
        algorithm_config={"harmony": {"lr": 0.01}, "splitgp": {"gamma": 0.3, "mix_lambda": 0.5}},
    )
    assert profile.method_config("harmony") == {"local_steps": 5, "batch_size": 32, "lr": 0.01}
    assert profile.method_config("harmony-full-softmax") == {"local_steps": 5, "batch_size": 32, "lr": 0.01}
    assert profile.method_config("multi-exit") == {"local_steps": 5, "batch_size": 64, "gamma": 0.3}
    assert profile.method_config("fedavg") == {"local_steps": 5, "batch_size": 64}
    assert profile.method_config("centralized") == {"local_steps": 8, "batch_size": 64}
    assert profile.method_budget("centralized").rounds == 30 and profile.method_budget("fedavg").rounds == 2
    # a tuned value overrides the fixed one and reaches the ablation too
    tuned = {"harmony": {"lr": 0.001, "temperature": 0.2}}
    assert profile.method_config("harmony-full-softmax", tuned)["lr"] == 0.001
    assert profile.method_config("harmony-full-softmax", tuned)["temperature"] == 0.2
    with pytest.raises(ValidationError):
        BenchProfile(**{**profile.model_dump(), "methods": ["nope"]})
    for name in ("quick", "standard", "full"):
        assert load_profile(name).name == name


def test_tuning_grids_must_be_fair_and_kept_off_the_evaluation_seeds():
    base = {
        "name": "t",
        "seeds": [0, 1],
        "settings": [{"name": "s"}],
        "methods": ["harmony", "splitgp"],
        "budget": {"rounds": 2, "local_steps": 5, "samples_per_step": 64},
    }
    ok = BenchProfile(
        **base,
        tuning={"seeds": [9], "grids": {"harmony": [{}, {"lr": 0.01}], "splitgp": [{}, {"gamma": 0.3}]}},
    )
    assert ok.tuning.trials == 2
    with pytest.raises(ValidationError, match="same"):  # 2 trials for one method, 1 for another
        BenchProfile(**base, tuning={"seeds": [9], "grids": {"harmony": [{}, {"lr": 0.01}], "splitgp": [{}]}})
    with pytest.raises(ValidationError, match="also evaluation seeds"):
        BenchProfile(**base, tuning={"seeds": [1], "grids": {"harmony": [{}]}})
    with pytest.raises(ValidationError, match="parent"):  # an ablation is tuned through HARMONY
        BenchProfile(**base, tuning={"seeds": [9], "grids": {"harmony-full-softmax": [{}]}})
    with pytest.raises(ValidationError, match="not settings"):
        BenchProfile(**base, tuning={"seeds": [9], "settings": ["other"], "grids": {"harmony": [{}]}})


def test_the_standard_profile_is_the_benchmark_the_readme_quotes():
    profile = load_profile("standard")
    datasets = {
        (s.dataset, s.partition, s.alpha if s.partition == "dirichlet" else None) for s in profile.settings
    }
    for dataset in ("mnist5k", "digits"):
        assert (dataset, "family", None) in datasets and (dataset, "dirichlet", 0.1) in datasets
    assert profile.train["clients_per_tier"] >= 2  # 8 clients over 4 tiers: every family federates
    assert len(profile.seeds) >= 5
    assert "centralized" in profile.budgets and "centralized" in profile.methods
    assert profile.convergence.min_accuracy == 0.95 and "mnist5k" in profile.convergence.datasets
    assert profile.latency.rtt_ms == 50
    assert profile.tuning is not None and profile.tuning.trials >= 2
    tuned = {"harmony", "splitgp", "splitgp-restricted", "fedproto", "fedavg", "local"}
    assert tuned <= set(profile.tuning.grids) and tuned <= set(profile.methods)
    assert profile.targets.margin == 0.05 and profile.targets.fraction_of_reference == 0.9
    assert {"splitgp-restricted", "fedproto"} <= set(profile.targets.baselines)
    ablations = {"harmony-fixed-depth", "harmony-full-softmax"}
    assert set(profile.targets.ablations) == ablations and ablations <= set(profile.methods)
    # meta-adaptation and SupCon, off by default, stay measured
    assert {"harmony-with-meta", "harmony-with-contrastive"} <= set(profile.methods)


def test_a_renamed_ablation_in_a_profile_is_refused_with_its_new_name():
    with pytest.raises(ValidationError, match="harmony-with-meta"):
        BenchProfile(
            name="t",
            seeds=[0],
            settings=[{"name": "s"}],
            methods=["harmony", "harmony-meta"],
            budget={"rounds": 1, "local_steps": 1, "samples_per_step": 8},
        )


PROFILE = {
    "name": "t",
    "seeds": [0, 1],
    "settings": [{"name": "s"}],
    "methods": ["harmony", "harmony-no-style-mixing", "fedavg", "centralized"],
    "budget": {"rounds": 1, "local_steps": 1, "samples_per_step": 8},
}


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        ({"seeds": [0, 0]}, r"seeds \[0, 0\] repeat an entry"),
        ({"methods": ["fedavg", "fedavg"]}, "methods .* repeat an entry"),
        (
            {"algorithm_config": {"fedavg": {"personalize_epochs": 1}}},
            "algorithm_config.fedavg: personalize_epochs: not a setting of fedavg",
        ),
        (
            {"algorithm_config": {"harmony": {"personalize_epochs": -1}}},
            r"algorithm_config.harmony: personalize_epochs: .*greater than or equal to 0 \(got -1\)",
        ),
        (
            {"algorithm_config": {"splitgp": {"gama": 0.5}}},
            "algorithm_config.splitgp: gama: not a setting of splitgp",
        ),
        (
            {"algorithm_config": {"harmony-no-style-mixing": {"style_mixing": 0.5}}},
            "defined by style_mixing = 0.0; leave it out",
        ),
        (
            {"algorithm_config": {"harmony": {"stochastic_depth": 1}}},
            r"algorithm_config.harmony: 'stochastic_depth' is not a HARMONY setting",
        ),
        ({"tuning": {"seeds": [5, 5], "grids": {"fedavg": [{}]}}}, r"tuning: seeds \[5, 5\] repeat an entry"),
        (  # fedavg's default rate is 0.003: the trial repeats `{}`, a tuned method a trial short
            {"tuning": {"seeds": [5], "grids": {"fedavg": [{}, {"lr": 0.003}]}}},
            r"tuning.grids.fedavg: trial 1 \{'lr': 0.003\} trains what trial 0 \{\} trains",
        ),
        (  # the profile's own algorithm_config is part of what a trial trains
            {
                "algorithm_config": {"harmony": {"style_mixing": 1.0}},
                "tuning": {"seeds": [5], "grids": {"harmony": [{}, {"style_mixing": 1.0}]}},
            },
            "tuning.grids.harmony: trial 1",
        ),
        (  # an invalid trial is refused when the profile loads, not when its run starts
            {"tuning": {"seeds": [5], "grids": {"fedavg": [{}, {"lrr": 0.01}]}}},
            r"tuning.grids.fedavg: trial 1 \{'lrr': 0.01\}: lrr: not a setting of fedavg",
        ),
        (
            {"tuning": {"seeds": [5], "grids": {"harmony": [{"personalize_epochs": -1}]}}},
            r"tuning.grids.harmony: trial 0 .*personalize_epochs: .*greater than or equal to 0",
        ),
        (  # and so is the budget: 1 local step is what every trial of this profile trains
            {"tuning": {"seeds": [5], "grids": {"fedavg": [{}, {"local_steps": 1}]}}},
            "tuning.grids.fedavg: trial 1",
        ),
    ],
)
def test_a_profiles_mistakes_are_refused_naming_the_entry(change, refusal):
    with pytest.raises(ValidationError, match=refusal):
        BenchProfile(**{**PROFILE, **change})


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        ({"targets": {"baselines": ["fedavgg"]}}, r"targets: \['fedavgg'\] are not methods"),
        ({"targets": {"ablations": {"harmony-no-stylemixing": "x"}}}, "targets: .*harmony-no-stylemixing"),
        ({"pca": {"setting": "ss"}}, r"settings \['ss'\] are not in profile"),
        ({"pca": {"methods": ["splitgp"]}}, r"pca: \['splitgp'\] are not methods"),
        ({"latency": {"method": "harmny"}}, "LatencySpec: 'harmny' is not a method"),
    ],
)
def test_a_target_or_plot_naming_what_the_profile_lacks_is_refused(tmp_path, change, refusal):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({**PROFILE, **change}))
    with pytest.raises(ValueError, match=refusal):
        load_profile(path)


def test_the_default_plot_may_name_a_method_the_profile_does_not_run(tmp_path):
    """The default plot names splitgp, which a profile need not run: only a named list is checked."""
    path = tmp_path / "plain.yaml"
    path.write_text(yaml.safe_dump(PROFILE))
    assert load_profile(path).pca.methods == ["splitgp", "harmony"]


def test_narrowing_flags_that_repeat_or_misname_are_refused_naming_the_flag():
    from harmony_mobile.bench.runner import narrowed

    profile = BenchProfile(**PROFILE)
    with pytest.raises(ValueError, match="--seeds 0,0 repeats an entry"):
        narrowed(profile, [0, 0], None, None)
    with pytest.raises(ValueError, match="--methods: unknown algorithm 'harmoy'"):
        narrowed(profile, None, ["harmoy"], None)


def test_a_client_holding_every_class_is_evaluated_without_ood():
    """Dirichlet alpha 0.5 (the full profile) gives some clients every class: no OOD exists for them."""
    import torch

    from harmony_mobile.data import load_dataset
    from harmony_mobile.data.partition import make_partition
    from harmony_mobile.evaluation import BackendWithSlots, EvaluationSetting, evaluate
    from harmony_mobile.models import Backend, InterfaceSpec, load_tiers
    from harmony_mobile.protocol.label_tokens import class_tokens, epoch_key
    from harmony_mobile.training import TrainConfig, build_clients

    dataset = load_dataset("digits")
    tiers = load_tiers().with_input_shape(dataset.input_shape)
    partition = make_partition("dirichlet", dataset.labels.numpy(), 12, 0, alpha=0.5)
    everything = [c.client_id for c in partition.clients if len(c.classes) == 10]
    assert everything  # seed 0 has such a client
    clients = build_clients(
        TrainConfig(clients_per_tier=3), tiers, dataset, partition, InterfaceSpec(), b"S" * 32, "e-test"
    )
    served = BackendWithSlots(
        Backend(InterfaceSpec(), 10).eval(),
        list(class_tokens(epoch_key(b"S" * 32, "e-test"), dataset.class_names)),
    )
    results = evaluate(clients, served, EvaluationSetting(dataset.images, dataset.labels, partition, 0))
    name = clients[everything[0]].name
    assert results["per_client"][name]["p=0.5"]["accuracy"] == results["per_client"][name]["p=0"]["accuracy"]
    assert torch.isfinite(torch.tensor(results["summary"]["accuracy_with_ood"]))


def test_a_budget_check_must_compare_longer_budgets_on_validation_seeds():
    data = load_profile("standard").model_dump()
    rounds = data["budget"]["rounds"]
    ok = {"methods": ["harmony"], "rounds": [2 * rounds], "seeds": [101]}
    assert BenchProfile(**{**data, "budget_check": ok}).budget_check.rounds == [2 * rounds]
    for change, message in (
        ({"rounds": [rounds]}, "not longer than harmony's budget"),
        ({"seeds": [0]}, "are evaluation or tuning seeds"),
        ({"seeds": [100]}, "are evaluation or tuning seeds"),  # the tuning seed: its score is a maximum
        ({"seeds": [101, 101]}, "repeat an entry"),
        ({"rounds": [2 * rounds, 2 * rounds]}, "repeat an entry"),
        ({"methods": ["centralized"], "rounds": [50]}, "decay_rounds is tied to its budget's rounds"),
        ({"methods": ["no-such-method"]}, "no-such-method"),
        ({"settings": ["cifar-family"]}, r"settings \['cifar-family'\] are not in profile"),
        ({"settings": ["digits-family", "digits-family"]}, "repeat an entry"),
    ):
        with pytest.raises(ValidationError, match=message):
            BenchProfile(**{**data, "budget_check": {**ok, **change}})
    without_fedproto = [m for m in data["methods"] if m != "fedproto"]
    with pytest.raises(ValidationError, match="not methods of this profile"):
        BenchProfile(**{**data, "methods": without_fedproto, "budget_check": {**ok, "methods": ["fedproto"]}})
    with pytest.raises(ValidationError, match="needs a tuning section"):
        BenchProfile(**{**data, "tuning": None, "budget_check": ok})


def _with_rounds_in_first_setting(data: dict, method_rounds: dict) -> dict:
    first, *others = data["settings"]
    return {**data, "settings": [{**first, "method_rounds": method_rounds}, *others]}


def test_a_setting_can_give_a_method_and_its_ablations_more_rounds():
    data = {**load_profile("standard").model_dump(), "budget_check": None}
    shared = data["budget"]["rounds"]
    profile = BenchProfile(**_with_rounds_in_first_setting(data, {"harmony": 2 * shared}))
    here, elsewhere = profile.settings[0], profile.settings[1]
    assert profile.method_budget("harmony", here) == profile.budget.model_copy(update={"rounds": 2 * shared})
    assert profile.method_budget("harmony-full-softmax", here).rounds == 2 * shared  # the parent's
    assert profile.method_budget("harmony", elsewhere).rounds == shared
    assert profile.method_budget("fedavg", here).rounds == shared
    assert profile.method_budget("harmony").rounds == shared  # no setting: the profile's
    # only the rounds change: the configuration is the same in every setting
    assert profile.method_config("harmony", setting=here) == profile.method_config(
        "harmony", setting=elsewhere
    )
    tuned = {"harmony": {"lr": 0.01}}
    rounds = {
        (s.setting.name, s.method): s.rounds for s in evaluation_specs(profile, tuned, read_files=set())
    }
    assert rounds[(here.name, "harmony-fixed-depth")] == 2 * shared
    assert rounds[(elsewhere.name, "harmony-fixed-depth")] == shared
    assert rounds[(here.name, "splitgp")] == shared
    for bad, message in (
        ({"no-such-method": 96}, "no-such-method"),
        ({"harmony": 0}, "rounds must be 1 or more"),
    ):
        with pytest.raises(ValidationError, match=message):
            BenchProfile(**_with_rounds_in_first_setting(data, bad))
    # a learning-rate decay tied to a budget's rounds cannot follow a setting's other rounds
    with pytest.raises(ValidationError, match="decay_rounds 25 must equal its budget's rounds"):
        BenchProfile(**_with_rounds_in_first_setting(data, {"centralized": 50}))


def test_tuning_trains_each_trial_for_the_rounds_of_its_setting(tmp_path):
    from harmony_mobile.bench.runner import tune

    data = load_profile("standard").model_dump()
    data = _with_rounds_in_first_setting({**data, "budget_check": None}, {"harmony": 5})
    data["tuning"] = {
        "seeds": [100],
        "grids": {"harmony": [{}]},
        "settings": [s["name"] for s in data["settings"]],
    }
    profile = BenchProfile(**data)
    asked = []

    def execute(specs, *args):  # the specs tuning asks for; nothing trains
        asked.extend(specs)
        raise InterruptedError

    with pytest.MonkeyPatch.context() as patch, pytest.raises(InterruptedError):
        patch.setattr("harmony_mobile.bench.runner.execute", execute)
        tune(profile, tmp_path, None, False, 1, lambda _: None)
    assert [(s.setting.name, s.rounds) for s in asked] == [
        (profile.settings[0].name, 5),
        *[(s.name, profile.budget.rounds) for s in profile.settings[1:]],
    ]


def test_a_budget_check_by_times_compares_each_method_with_a_multiple_of_its_own_budget():
    data = load_profile("standard").model_dump()
    shared = data["budget"]["rounds"]
    data = _with_rounds_in_first_setting(data, {"harmony": 2 * shared})
    first = data["settings"][0]["name"]
    check = {"methods": ["harmony", "fedavg"], "times": [2], "seeds": [101], "settings": [first]}
    profile = BenchProfile(**{**data, "budget_check": check})
    assert profile.budget_check.longer_rounds(2 * shared) == [4 * shared]
    rounds = {(s.method, s.rounds) for s in budget_specs(profile, {})}
    assert rounds == {
        ("harmony", 2 * shared),
        ("harmony", 4 * shared),
        ("fedavg", shared),
        ("fedavg", 2 * shared),
    }
    # given as rounds, the check must be longer than the setting's budget, not only the profile's
    with pytest.raises(ValidationError, match=f"not longer than harmony's budget in {first}"):
        BenchProfile(**{**data, "budget_check": {**check, "times": None, "rounds": [2 * shared]}})
    for bad, message in (
        ({"rounds": [4 * shared]}, "exactly one of rounds or times"),
        ({"times": None}, "exactly one of rounds or times"),
        ({"times": [1]}, "must be 2 or more"),
    ):
        with pytest.raises(ValidationError, match=message):
            BenchProfile(**{**data, "budget_check": {**check, **bad}})


def test_the_report_names_the_methods_a_setting_trains_for_longer(tmp_path):
    results = synthetic_results()
    setting = results["profile"]["settings"][0]
    setting["method_rounds"] = {"harmony": 8}
    text = write_bench_report(results, tmp_path).read_text()
    ablations = [m for m in results["profile"]["methods"] if m.startswith("harmony")]
    names = ", ".join(f"`{m}`" for m in ablations)
    assert f"; in {setting['name']}: {names} 8 rounds of their budget" in text


def test_a_setting_with_two_longer_budgets_is_named_once(tmp_path):
    results = synthetic_results()
    setting = results["profile"]["settings"][0]
    other = next(m for m in results["profile"]["methods"] if not m.startswith("harmony"))
    setting["method_rounds"] = {"harmony": 8, other: 16}
    text = write_bench_report(results, tmp_path).read_text()
    names = ", ".join(f"`{m}`" for m in results["profile"]["methods"] if m.startswith("harmony"))
    assert f"; in {setting['name']}: {names} 8 rounds and `{other}` 16 rounds of their budget" in text
    assert text.count(f"; in {setting['name']}:") == 1


def test_the_report_says_which_methods_were_still_improving_at_their_budget(tmp_path):
    results = synthetic_results()
    results["budget_check"] = {
        "rows": [
            {
                "method": "harmony",
                "rounds": 2,
                "val_acc_with_ood": {"2": 0.70, "4": 0.745},
                "gain": 0.045,
                "stopped_improving": False,
            },
            {
                "method": "splitgp",
                "rounds": 2,
                "val_acc_with_ood": {"2": 0.60, "4": 0.605},
                "gain": 0.005,
                "stopped_improving": True,
            },
        ],
        "seeds": [100],
        "settings": ["toy-family"],
        "tolerance": 0.01,
        "run_wall_seconds": 60.0,
    }
    text = write_bench_report(results, tmp_path).read_text()
    assert "at its budget (see the budget check): **not met**: still improving: harmony." in text
    assert "| harmony | 70.0 | 74.5 | +4.5 | **no** |" in text
    assert "| splitgp | 60.0 | 60.5 | +0.5 | yes, at 2 rounds |" in text
    # its runs count in the profile's time: (300 s of runs + 60 s) / 2 jobs
    assert "about 3 min with 2 job(s)" in text
    results["budget_check"]["rows"] = results["budget_check"]["rows"][1:]
    assert "budget check): met." in write_bench_report(results, tmp_path / "met").read_text()


def test_a_budget_checked_on_two_settings_is_judged_per_setting(tmp_path):
    results = synthetic_results()
    row = {"method": "harmony", "rounds": 2, "gain": 0.0, "stopped_improving": True}
    results["budget_check"] = {
        "rows": [
            {**row, "setting": "toy-family", "val_acc_with_ood": {"2": 0.70, "4": 0.70}},
            {
                **row,
                "setting": "toy-dirichlet",
                "val_acc_with_ood": {"2": 0.60, "4": 0.65},
                "gain": 0.05,
                "stopped_improving": False,
            },
        ],
        "seeds": [100],
        "settings": ["toy-family", "toy-dirichlet"],
        "tolerance": 0.01,
        "run_wall_seconds": 60.0,
    }
    text = write_bench_report(results, tmp_path).read_text()
    assert "**not met**: still improving: harmony (toy-dirichlet)." in text
    assert (
        "| setting | method | 2 rounds | 4 rounds | best gain | stopped improving |\n|---|---|---|---|---|---|"
        in text
    )
    assert "| toy-family | harmony | 70.0 | 70.0 | +0.0 | yes, at 2 rounds |" in text
    assert "| toy-dirichlet | harmony | 60.0 | 65.0 | +5.0 | **no** |" in text


def test_re_rendering_keeps_the_prose_of_results_made_at_another_budget(tmp_path):
    from harmony_mobile.bench.runner import bench

    results = synthetic_results()  # "a synthetic profile", notes "tuned on validation only", 2 rounds
    (tmp_path / "results.json").write_text(json.dumps(results))
    lines: list[str] = []
    text = bench("standard", out_dir=tmp_path, report_only=True, log=lines.append).read_text()
    assert "tuned on validation only" in text and "a synthetic profile" in text
    assert any("description and notes are kept" in line for line in lines)
    standard = load_profile("standard")
    # the same budget, written before lr_schedule existed (its default is what those runs did)
    results["profile"]["budget"] = standard.budget.model_dump(exclude={"lr_schedule"})
    (tmp_path / "results.json").write_text(json.dumps(results))
    lines.clear()
    text = bench("standard", out_dir=tmp_path, report_only=True, log=lines.append).read_text()
    assert "tuned on validation only" not in text and "**Budget.**" in text
    assert not any("are kept" in line for line in lines)
    assert "a synthetic profile" not in text and standard.description.strip()[:60] in text
    # a setting's own budget is part of the budget too
    results["profile"]["settings"][0]["method_rounds"] = {"harmony": 96}
    (tmp_path / "results.json").write_text(json.dumps(results))
    lines.clear()
    text = bench("standard", out_dir=tmp_path, report_only=True, log=lines.append).read_text()
    assert "a synthetic profile" in text and any("description and notes are kept" in line for line in lines)


def test_a_tiers_file_is_named_relative_to_the_repository_whichever_checkout_ran_it():
    inside = {"clients_per_tier": 2, "tiers_file": str(REPO_ROOT / "benchmarks/configs/tiers-standard.yaml")}
    other_checkout = {"tiers_file": "/elsewhere/checkout/benchmarks/configs/tiers-standard.yaml"}
    own_file = {"tiers_file": "/home/me/my-tiers.yaml"}
    not_ours = {"tiers_file": "/elsewhere/benchmarks/configs/tiers-of-another-project.yaml"}
    assert repo_relative(inside) == {
        "clients_per_tier": 2,
        "tiers_file": "benchmarks/configs/tiers-standard.yaml",
    }
    assert repo_relative(other_checkout) == {"tiers_file": "benchmarks/configs/tiers-standard.yaml"}
    assert repo_relative(own_file) == own_file
    assert repo_relative(not_ours) == not_ours
    assert repo_relative({"clients_per_tier": 2}) == {"clients_per_tier": 2}


def test_results_that_name_a_retired_variant_still_render(tmp_path):
    """Committed results keep the method names they were made with; a variant retired since
    (harmony-no-contrastive, SupCon's ablation before SupCon was off by default) still renders as
    a HARMONY variant instead of failing the lookup of its parent."""
    from harmony_mobile.algorithms.registry import ALGORITHMS, RENAMED
    from harmony_mobile.bench.profile import parent_method

    results = json.loads((REPO_ROOT / "benchmarks/results/fashion-width2/interim/results.json").read_text())
    retired = {r["method"] for r in results["runs"]} & set(RENAMED)
    assert retired == {"harmony-no-contrastive"} and not retired & set(ALGORITHMS)
    assert parent_method("harmony-no-contrastive") == "harmony"
    text = write_bench_report(results, tmp_path / "report").read_text()
    assert "| harmony-no-contrastive |" in text


def test_a_cosine_budget_decays_every_method_over_its_own_runs_rounds():
    data = load_profile("standard").model_dump()
    data["budget"]["lr_schedule"] = "cosine"
    data["algorithm_config"]["centralized"] = {}
    profile = BenchProfile(**data)
    assert profile.method_config("harmony")["decay_rounds"] == profile.budget.rounds
    assert profile.method_config("harmony-full-softmax")["decay_rounds"] == profile.budget.rounds
    assert profile.method_config("fedavg", rounds=96)["decay_rounds"] == 96  # a budget check's longer run
    # a method with a budget of its own (constant unless that budget says cosine)
    assert "decay_rounds" not in profile.method_config("centralized")
    data["algorithm_config"]["fedavg"] = {"decay_rounds": data["budget"]["rounds"]}
    with pytest.raises(ValidationError, match="decay_rounds is set by its budget's lr_schedule"):
        BenchProfile(**data)


def test_a_fixed_decay_is_checked_for_every_method_that_inherits_it():
    standard = load_profile("standard").model_dump()
    checked = {
        **standard,
        "algorithm_config": {**standard["algorithm_config"], "multi-exit": {"decay_rounds": 24}},
    }
    checked["budget_check"] = {**standard["budget_check"], "methods": ["multi-exit"]}
    with pytest.raises(ValidationError, match="multi-exit's decay_rounds is tied to its budget's rounds"):
        BenchProfile(**checked)  # the check's 48-round run would decay over 24
    inherited = {
        **standard,
        "algorithm_config": {**standard["algorithm_config"], "harmony": {"decay_rounds": 24}},
    }
    inherited["budget_check"] = None
    inherited["budgets"] = {
        **standard["budgets"],
        "harmony-full-softmax": {
            "rounds": 48,
            "local_steps": 5,
            "samples_per_step": 64,
            "lr_schedule": "cosine",
        },
    }
    with pytest.raises(ValidationError, match="harmony-full-softmax: decay_rounds is set by its budget's"):
        BenchProfile(**inherited)
    tuned = {**standard, "tuning": {**standard["tuning"], "grids": {"fedavg": [{}, {"decay_rounds": 24}]}}}
    with pytest.raises(ValidationError, match=r"tuning: \['fedavg'\] try decay_rounds"):
        BenchProfile(**tuned)


def test_results_of_a_budget_with_a_field_since_removed_keep_their_prose(tmp_path):
    from harmony_mobile.bench.runner import bench

    results = synthetic_results()
    results["profile"]["budget"] = {**load_profile("standard").budget.model_dump(), "warmup_rounds": 3}
    (tmp_path / "results.json").write_text(json.dumps(results))
    lines: list[str] = []
    text = bench("standard", out_dir=tmp_path, report_only=True, log=lines.append).read_text()
    assert "tuned on validation only" in text and any("are kept" in line for line in lines)


def test_the_methods_section_describes_the_methods_the_report_holds():
    from harmony_mobile.bench.report import method_notes

    notes = method_notes(["harmony", "harmony-no-style-mixing", "splitgp-restricted", "fedavg"])
    assert "- `harmony`:" in notes and "- `splitgp`:" in notes and "- `fedavg`:" in notes
    assert "- No-split methods" in notes
    assert "`fedproto`" not in notes and "- `local`" not in notes and "- `centralized`" not in notes
    assert "No-split" not in method_notes(["harmony", "splitgp"])


def with_mechanism_study(results: dict, seeds: tuple = (0, 1, 2, 3, 4, 5, 6)) -> dict:
    """`results` with its ablation moved from the evaluation to a mechanism study on `seeds`: the
    study holds the ablation's runs and HARMONY's at the seeds the evaluation lacks."""
    ablation = "harmony-full-softmax"
    noise = {**NOISE, 5: -0.015, 6: 0.0}
    studied = [fake_run(ablation, seed, BASE[ablation] + noise[seed] / 4) for seed in seeds]
    studied += [
        fake_run("harmony", seed, BASE["harmony"] + noise[seed]) for seed in seeds if seed not in SEEDS
    ]
    results["runs"] = [run for run in results["runs"] if run["method"] != ablation]
    results["profile"]["methods"] = [m for m in METHODS if m != ablation]
    results["mechanism_study"] = {
        "seeds": list(seeds),
        "methods": [ablation],
        "runs": studied,
        "run_wall_seconds": sum(run["wall_seconds"] for run in studied),
        "run_cpu_seconds": None,
    }
    return results


def test_a_mechanism_study_decides_the_mechanism_targets_on_its_own_seeds(tmp_path):
    results = with_mechanism_study(synthetic_results())
    text = write_bench_report(results, tmp_path).read_text()
    gaps = [
        BASE["harmony-full-softmax"] - BASE["harmony"] - n * 3 / 4 for n in (*NOISE.values(), -0.015, 0.0)
    ]
    expected = paired_ci(gaps)
    row = f"| harmony-full-softmax - harmony | {100 * expected['mean']:+.1f} [{100 * expected['low']:+.1f}, "
    section = text.split("## Mechanisms (7 seeds)")[1].split("## Plots")[0]
    assert row in section and "on seeds [0, 1, 2, 3, 4, 5, 6]" in section
    # the study's table: HARMONY over its 7 seeds, its evaluation runs included
    harmony = [BASE["harmony"] + n for n in (*NOISE.values(), -0.015, 0.0)]
    assert f"| harmony | {100 * np.mean(harmony):.1f} ± {100 * np.std(harmony, ddof=1):.1f} |" in section
    assert (
        "- mechanism *restricted server softmax* (`harmony-full-softmax`): at 7 seeds (the mechanism study), "
        "turning it off costs accuracy with OOD with a CI below 0 in toy-family" in text
    )
    setting = text.split("## toy-family")[1].split("## Mechanisms")[0]
    assert "harmony-full-softmax" not in setting  # the evaluation's section holds its own methods only
    # the study's own runs are a stage of their own: they count outside an evaluation-only goal
    results["profile"] |= {"time_limit_minutes": 60.0, "time_goal_covers": "evaluation"}
    results["narrowed"] = {"settings": None, "seeds": None, "methods": None}
    text = write_bench_report(results, tmp_path / "goal").read_text()
    # 7 ablation runs and HARMONY's seeds 5 and 6: 122 s summed
    assert (
        "The evaluation runs took 4 min summed, about 2 min with 2 job(s) (goal: within 60 min: met)" in text
    )
    assert "outside the goal: mechanism study 2 min of wall time summed (1 min with 2 job(s))." in text


def test_an_ablation_left_in_the_evaluation_is_judged_there_beside_a_studied_one(tmp_path):
    results = with_mechanism_study(synthetic_results())
    evaluated = [fake_run("harmony-no-style-mixing", seed, 0.88 + NOISE[seed] / 2) for seed in SEEDS]
    results["runs"] += evaluated
    results["profile"]["methods"].append("harmony-no-style-mixing")
    results["profile"]["targets"]["ablations"]["harmony-no-style-mixing"] = "style mixing"
    text = write_bench_report(results, tmp_path).read_text()
    studied = next(line for line in text.splitlines() if "(`harmony-full-softmax`)" in line)
    kept = next(line for line in text.splitlines() if "(`harmony-no-style-mixing`)" in line)
    assert "at 7 seeds (the mechanism study)" in studied and "**met**" in studied
    assert "mechanism study" not in kept and "CI below 0 in toy-family" in kept and "**met**" in kept
    setting = text.split("## toy-family")[1].split("## Mechanisms")[0]
    assert "| harmony-no-style-mixing - harmony |" in setting


def test_a_mechanism_study_names_only_ablations_the_evaluation_does_not_run():
    profile = {
        **PROFILE,
        "targets": {"ablations": {"harmony-no-style-mixing": "style mixing", "harmony-fixed-depth": "depth"}},
    }
    BenchProfile(**profile, mechanism_study={"seeds": [0, 1, 2], "methods": ["harmony-fixed-depth"]})
    for study, refusal in [
        ({"seeds": [0, 1], "methods": ["harmony-no-style-mixing"]}, "are evaluation methods too"),
        ({"seeds": [0, 1], "methods": ["harmony-max-softmax"]}, "not ablations named in targets.ablations"),
        ({"seeds": [0, 0], "methods": ["harmony-fixed-depth"]}, r"seeds \[0, 0\] repeat an entry"),
        ({"seeds": [0, 1, 5], "methods": ["harmony-fixed-depth"]}, r"seeds \[5\] are tuning or budget-check"),
        (
            {"seeds": [0, 2], "methods": ["harmony-fixed-depth"]},
            r"include every evaluation seed; \[1\] missing",
        ),
    ]:
        with pytest.raises(ValidationError, match=refusal):
            BenchProfile(
                **profile,
                mechanism_study=study,
                tuning={"seeds": [5], "grids": {"fedavg": [{}]}},
            )
    with pytest.raises(ValidationError, match="studies the targets' method"):
        BenchProfile(**PROFILE, mechanism_study={"seeds": [0, 1], "methods": ["harmony-fixed-depth"]})


def test_a_profile_tuned_per_setting_trains_each_settings_own_pick(tmp_path):
    """Each setting's runs (evaluation, ablations, budget check) take the trial that scored best on
    that setting's validation runs, and the report shows the pick per setting."""
    from harmony_mobile.bench.runner import method_configs, pick_trials, tuning_specs

    data = {**load_profile("standard").model_dump(), "budget_check": None}
    data["tuning"] = {"seeds": [100], "grids": {"harmony": [{}, {"lr": 0.01}]}, "per_setting": True}
    profile = BenchProfile(**data)
    first, second = profile.settings[0], profile.settings[1]
    specs = tuning_specs(profile)
    # trial 1 wins the first setting, trial 0 every other one
    score = {(s.setting.name, s.trial): 0.6 if (s.setting == first) == (s.trial == 1) else 0.5 for s in specs}
    records = [
        {"validation": {"accuracy_with_ood": score[s.setting.name, s.trial], "accuracy_without_ood": 0.9}}
        for s in specs
    ]
    chosen, trials = pick_trials(profile, specs, records)
    assert chosen[first.name] == {"harmony": {"lr": 0.01}} and chosen[second.name] == {"harmony": {}}
    assert {(t["setting"], t["trial"]) for t in trials if t["chosen"]} == {
        (first.name, 1),
        *((s.name, 0) for s in profile.settings[1:]),
    }
    configs = {
        (s.setting.name, s.method): s.algorithm_config
        for s in evaluation_specs(profile, chosen, read_files=set())
    }
    assert configs[first.name, "harmony"]["lr"] == 0.01
    assert configs[first.name, "harmony-full-softmax"]["lr"] == 0.01  # an ablation takes its parent's pick
    assert "lr" not in configs[second.name, "harmony"]
    checked = BenchProfile(
        **{**data, "budget_check": {"methods": ["harmony"], "rounds": [96], "seeds": [101]}}
    )
    assert {s.setting.name: s.algorithm_config.get("lr") for s in budget_specs(checked, chosen)}[
        first.name
    ] == 0.01
    with pytest.raises(ValueError, match="tunes per setting"):
        profile.method_config("harmony", chosen)  # a pick without its setting is no pick
    untuned = {name: picks for name, picks in chosen.items() if name != second.name}
    with pytest.raises(ValueError, match=f"no tuning pick in setting '{second.name}'"):
        evaluation_specs(profile, untuned, read_files=set())  # never its defaults in silence
    results = {
        "profile": profile.model_dump(),
        "tuning": {"trials": trials},
        **method_configs(profile, ["harmony"], chosen),
    }
    from harmony_mobile.bench.report import method_config_lines, tuning_lines

    text = "\n".join(tuning_lines(results) + method_config_lines(results))
    assert f'| {first.name} | harmony | 1 | `{{"lr": 0.01}}` | 60.0 | 90.0 | **yes** |' in text
    assert "Trials per method: `harmony` 2." in text
    assert (
        f"| {first.name} | harmony | `" in text
        and '"lr": 0.01' in text.split(f"| {first.name} | harmony | `")[1]
    )
    with pytest.raises(ValidationError, match="leave tuning.settings unset"):
        BenchProfile(**{**data, "tuning": {**data["tuning"], "settings": [first.name]}})
