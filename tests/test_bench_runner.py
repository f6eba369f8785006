"""The benchmark driver on a tiny profile: tuning, evaluation runs, uplink accounting, the extra
metrics, parallel jobs (same numbers as serial) and resuming an interrupted profile."""

import json
import math

import pytest
import torch

from harmony_mobile.bench.profile import BenchProfile, load_profile
from harmony_mobile.bench.report import write_bench_report
from harmony_mobile.bench.runner import (
    RECORD,
    RunSpec,
    algorithm_settings,
    bench,
    budget_specs,
    evaluation_specs,
    is_recorded_run,
    run_benchmark,
    run_one,
    same_training,
    train_config,
    training_twins,
)

TINY = {
    "name": "tiny",
    "seeds": [0],
    "settings": [{"name": "digits-family", "dataset": "digits", "dataset_limit": 600}],
    "methods": ["harmony", "splitgp", "fedavg", "local"],
    "budget": {"rounds": 1, "local_steps": 2, "samples_per_step": 16},
    "train": {"clients_per_tier": 1},
    "algorithm_config": {"harmony": {"personalize_epochs": 1}},
    "tuning": {"seeds": [7], "grids": {"harmony": [{}, {"lr": 0.01}], "fedavg": [{}, {"lr": 0.01}]}},
}
# the metrics a run records that must not depend on how it was scheduled
COMPARED = ("summary", "mean", "uplink", "validation", "unseen", "per_tier", "train_config")


def comparable(record: dict) -> dict:
    return json.loads(json.dumps({key: record[key] for key in COMPARED}))


def trained_methods(lines: list[str]) -> list[str]:
    """The method of each run the log says was trained, not read back, in log order."""
    runs = [line for line in lines if line.startswith("[") and "reused" not in line]
    return [line.split(" seed=")[0].split()[-1] for line in runs]


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    """The tiny profile run once in this process; shared by the tests below (read-only)."""
    work = tmp_path_factory.mktemp("serial")
    lines: list[str] = []
    results = run_benchmark(BenchProfile(**TINY), work, log=lines.append)
    return work, results, lines


def test_a_tiny_benchmark_tunes_runs_and_counts_uplink_bytes(serial, tmp_path):
    work, results, _ = serial
    runs = {(r["method"], r["seed"]): r for r in results["runs"]}
    assert len(runs) == 4
    harmony, splitgp = runs["harmony", 0]["uplink"], runs["splitgp", 0]["uplink"]
    # HARMONY uploads V=2 variants of each query row, SplitGP one row per sample, 64x8x8 float32 each
    assert harmony["feature_bytes"] == harmony["uploaded_rows"] * 64 * 8 * 8 * 4
    assert harmony["label_bytes"] == 8 * harmony["uploaded_rows"]
    assert splitgp["uploaded_rows"] > 0 and splitgp["update_bytes"] > 0
    assert runs["local", 0]["uplink"]["total"] == 0  # nothing leaves a local-only phone
    assert (
        runs["fedavg", 0]["uplink"]["feature_bytes"] == 0 and runs["fedavg", 0]["uplink"]["update_bytes"] > 0
    )
    for record in runs.values():  # validation and unseen-class accuracy for split and no-split methods
        assert 0 <= record["validation"]["accuracy_with_ood"] <= 1
        family = record["unseen"]["family"]
        assert set(family) == {"cnn", "mobilenet", "resnet"}
        assert all(v["classes"] for v in family.values())  # the family split leaves every family a gap
        assert 0 <= record["unseen"]["family_mean"] <= 1
        assert set(record["per_tier"]) == {"entry-android", "mid-android", "mid-ios", "flagship"}
    assert runs["fedavg", 0]["per_tier"]["flagship"]["p=0.5"]["exit_rate"] == 1.0
    # split methods record their gate curves with the score they exit by; no-split methods have no gate
    assert runs["harmony", 0]["gates"]["exit_rule"] == "slot_margin"
    assert runs["splitgp", 0]["gates"]["exit_rule"] == "neg_entropy"
    assert set(runs["harmony", 0]["gates"]["val"]["p=0.2"]["curve"]) == {
        "max_softmax",
        "neg_entropy",
        "energy",
        "prototype",
        "slot_margin",  # from the run's replay set and back-end
    }
    assert runs["fedavg", 0]["gates"] == {}
    assert runs["harmony", 0]["code"] == results["machine"]["code"]  # each run names the code that made it
    assert runs["harmony", 0]["cpu"] == {  # and the CPU: another model can round differently
        key: results["machine"][key] for key in ("cpu_model", "torch_cpu_capability")
    }
    assert results["machine"]["cpu_model"] and results["machine"]["torch_cpu_capability"]
    assert (
        results["tuning"]["run_provenance"]
        == [{"reused": False, "code": results["machine"]["code"], "cpu": runs["harmony", 0]["cpu"]}] * 4
    )
    # tuning: 2 trials per tuned method, scored on validation, the pick reaches the evaluation runs
    trials = results["tuning"]["trials"]
    assert [(t["method"], t["trial"]) for t in trials] == [
        ("harmony", 0),
        ("harmony", 1),
        ("fedavg", 0),
        ("fedavg", 1),
    ]
    assert sum(t["chosen"] for t in trials) == 2
    for method in ("harmony", "fedavg"):
        best = max((t for t in trials if t["method"] == method), key=lambda t: t["val_acc_with_ood"])
        assert best["chosen"]
        assert results["method_configs"][method].items() >= best["params"].items()
        assert runs[method, 0]["train_config"]["algorithm_config"] == results["method_configs"][method]
    assert (work / "tune" / "digits-family" / "harmony" / "seed-7" / "trial-1" / RECORD).is_file()
    assert set(results["projections"]["methods"]) == {"splitgp", "harmony"}
    text = write_bench_report(results, tmp_path / "report").read_text()
    assert "| harmony |" in text and "## Tuning (validation only)" in text


def test_parallel_jobs_reproduce_a_serial_run_exactly(serial, tmp_path):
    """Two of the serial profile's evaluation runs again in two worker processes, with the
    configurations its tuning picked."""
    _, serial_results, _ = serial
    picked = {method: serial_results["method_configs"][method] for method in ("harmony", "local")}
    profile = BenchProfile(
        **{**TINY, "methods": ["harmony", "local"], "tuning": None, "algorithm_config": picked}
    )
    lines: list[str] = []
    parallel_results = run_benchmark(profile, tmp_path / "parallel", log=lines.append, jobs=2)
    assert parallel_results["machine"]["jobs"] == 2
    # records come back in spec order whatever order the workers finish in
    assert [r["method"] for r in parallel_results["runs"]] == ["harmony", "local"]
    serial_runs = {r["method"]: r for r in serial_results["runs"]}
    assert [comparable(r) for r in parallel_results["runs"]] == [
        comparable(serial_runs[method]) for method in ("harmony", "local")
    ]
    assert len([line for line in lines if line.startswith("[")]) == 2


def test_resume_keeps_finished_runs_and_redoes_a_killed_one(serial, tmp_path):
    import shutil

    work, results, _ = serial
    copy = tmp_path / "work"
    shutil.copytree(work, copy)
    profile = BenchProfile(**TINY)
    specs = evaluation_specs(profile, results["tuning"]["chosen"])
    killed = specs[1].path(copy)
    (killed / RECORD).unlink()  # the run was killed before it wrote its record
    (killed / "final_metrics.json").unlink(missing_ok=True)
    untouched = specs[0].path(copy) / RECORD
    before = untouched.read_text()
    older = copy / "tune" / "digits-family" / "harmony" / "seed-7" / "trial-0" / RECORD
    made_earlier = {**json.loads(older.read_text()), "code": {"commit": "aaa1111", "uncommitted": []}}
    older.write_text(json.dumps(made_earlier))  # a trial an older commit made
    lines: list[str] = []
    resumed = run_benchmark(profile, copy, resume=True, log=lines.append)
    run_lines = [line for line in lines if line.startswith("[")]
    trained = [line for line in run_lines if "reused" not in line]
    assert len(trained) == 1 and specs[1].label() in trained[0]
    assert len(run_lines) == len(specs) + 4  # + 4 tuning trials, all reused
    assert [p["reused"] for p in resumed["tuning"]["run_provenance"]] == [True] * 4
    # a run read back keeps the commit that made it, not the resuming invocation's
    assert resumed["tuning"]["run_provenance"][0]["code"] == {"commit": "aaa1111", "uncommitted": []}
    assert resumed["tuning"]["run_provenance"][1]["code"] == resumed["machine"]["code"]
    assert untouched.read_text() == before
    assert (killed / RECORD).is_file()
    redone = next(r for r in resumed["runs"] if r["method"] == specs[1].method and r["seed"] == specs[1].seed)
    original = next(
        r for r in results["runs"] if r["method"] == specs[1].method and r["seed"] == specs[1].seed
    )
    assert comparable(redone) == comparable(original)  # recomputed from scratch: the same numbers


def records_only(work, copy):
    """What a checkout holds of a work dir: the run records (bench.json), not the model files."""
    import shutil

    shutil.copytree(work, copy, ignore=lambda folder, names: [n for n in names if n != RECORD and "." in n])
    return copy


def test_resume_trains_again_the_runs_the_report_reads_when_only_their_records_are_left(serial, tmp_path):
    """A checkout holds the run records (bench.json), not the model files: the runs whose files the
    report reads (the projections') are trained again, the others read back, and the report renders."""
    from harmony_mobile.bench.runner import runs_whose_files_the_report_reads

    work, _, _ = serial
    copy = records_only(work, tmp_path / "work")
    assert not list(copy.rglob("run.json")) and list(copy.rglob(RECORD))
    records = {path: path.read_text() for path in copy.rglob(RECORD)}
    profile = BenchProfile(**TINY)
    lines: list[str] = []
    resumed = run_benchmark(profile, copy, resume=True, log=lines.append)
    read = runs_whose_files_the_report_reads(profile)
    assert read == {("digits-family", "harmony", 0), ("digits-family", "splitgp", 0)}
    assert sorted(trained_methods(lines)) == ["harmony", "splitgp"]
    # the committed records stay the runs' results; the retrained runs' numbers are kept beside them
    assert {path: path.read_text() for path in copy.rglob(RECORD)} == records
    retrained = sorted(path.parent.parent.name for path in copy.rglob("retrained.json"))
    assert retrained == ["harmony", "splitgp"]
    report = write_bench_report(resumed, tmp_path / "report").read_text()
    assert "| harmony |" in report
    assert "these recorded runs were trained again" in report and "`splitgp` seed 0:" in report
    read_back: list[str] = []
    again = run_benchmark(profile, copy, resume=True, log=read_back.append)
    assert trained_methods(read_back) == []
    assert [run.get("files_retrained") for run in again["runs"]] == [
        run.get("files_retrained") for run in resumed["runs"]
    ]


def test_a_retraining_killed_half_way_gives_its_record_back_and_stale_files_are_trained_again(
    serial, tmp_path
):
    """The record of a run trained again for its files waits beside its folder: a kill leaves it
    there, and the next resume puts it back and trains again. Files trained for another record
    (the record changed since, as after a pull) are trained again too."""
    import os

    from harmony_mobile.bench.runner import kept_record

    work, _, _ = serial
    copy = records_only(work, tmp_path / "work")
    run = copy / "eval" / "digits-family" / "harmony" / "seed-0"
    original = (run / RECORD).read_bytes()
    os.replace(run / RECORD, kept_record(run))  # killed while training again: a partial run is left
    (run / "run.json").write_text("{}")
    profile = BenchProfile(**TINY)
    lines: list[str] = []
    run_benchmark(profile, copy, resume=True, log=lines.append)
    assert "harmony" in trained_methods(lines) and not kept_record(run).exists()
    assert (run / RECORD).read_bytes() == original and (run / "final_metrics.json").is_file()

    changed = json.loads(original) | {"wall_seconds": 1.0}  # the same run, another record of it
    (run / RECORD).write_text(json.dumps(changed, indent=1))
    lines = []
    run_benchmark(profile, copy, resume=True, log=lines.append)
    assert trained_methods(lines) == ["harmony"]
    assert json.loads((run / RECORD).read_text()) == changed


def test_resume_refuses_records_of_another_configuration_all_at_once_and_deletes_nothing(serial, tmp_path):
    import shutil

    work, _, _ = serial
    copy = tmp_path / "work"
    shutil.copytree(work, copy)
    changed = BenchProfile(
        **{
            **TINY,
            "budget": {**TINY["budget"], "local_steps": 1},
            "tuning": None,
            "methods": ["local", "fedavg"],
        }
    )
    records = [spec.path(copy) / RECORD for spec in evaluation_specs(changed, {})]
    before = [record.read_text() for record in records]
    lines: list[str] = []
    with pytest.raises(
        ValueError, match=r"2 recorded run\(s\) are not runs of this configuration"
    ) as refused:
        run_benchmark(changed, copy, resume=True, log=lines.append)
    assert str(refused.value).count("local_steps 2 -> 1") == 2  # both named, before any training
    assert not [line for line in lines if line.startswith("[")]
    assert [record.read_text() for record in records] == before


def test_a_record_made_under_another_default_is_refused_not_read_as_the_new_default(serial, tmp_path):
    """A profile's configuration names only what it changes: the record keeps every setting the
    method trained with, so a default changed since (or a record that does not say) is no run of
    today's configuration; --resume says so instead of reading it back or deleting it."""
    import shutil

    work, results, _ = serial
    copy = tmp_path / "work"
    shutil.copytree(work, copy)
    profile = BenchProfile(**{**TINY, "tuning": None, "methods": ["harmony", "splitgp", "local"]})
    profile = BenchProfile(**{**profile.model_dump(), "algorithm_config": results["method_configs"]})
    specs = {spec.method: spec for spec in evaluation_specs(profile, {})}
    harmony = json.loads((specs["harmony"].path(copy) / RECORD).read_text())
    assert harmony["algorithm_settings"]["contrastive_weight"] == 0.0  # the default, written out
    harmony["algorithm_settings"]["contrastive_weight"] = 0.5  # as if made when the default was 0.5
    del harmony["algorithm_settings"]["server_logit_adjustment"]  # made before the setting existed
    (specs["harmony"].path(copy) / RECORD).write_text(json.dumps(harmony))
    splitgp = json.loads((specs["splitgp"].path(copy) / RECORD).read_text())
    del splitgp["algorithm_settings"]  # a record from before records said
    (specs["splitgp"].path(copy) / RECORD).write_text(json.dumps(splitgp))
    with pytest.raises(ValueError) as refused:
        run_benchmark(profile, copy, resume=True, log=lambda line: None)
    message = str(refused.value)
    assert "(contrastive_weight 0.5 -> 0.0)" in message  # the setting added since is not a change
    assert "predates records of every algorithm setting" in message


def test_a_chosen_work_dir_or_an_added_setting_holding_records_needs_resume(serial, tmp_path):
    import shutil

    import yaml

    work, _, _ = serial
    copy = tmp_path / "work"
    shutil.copytree(work, copy)
    recorded = len(list(copy.rglob(RECORD)))
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text(yaml.safe_dump(TINY))
    with pytest.raises(ValueError, match=f"holds {recorded} recorded run\\(s\\): add --resume"):
        bench(str(tiny), tmp_path / "out", copy, log=lambda line: None)
    profile = BenchProfile(**{**TINY, "tuning": None})
    with pytest.raises(ValueError, match="add --resume to read it back"):  # as `--extend` runs a setting
        run_benchmark(profile, copy, log=lambda line: None)
    assert len(list(copy.rglob(RECORD))) == recorded


def test_runs_recorded_in_another_report_are_read_back_instead_of_trained(serial, tmp_path):
    import shutil

    from harmony_mobile.bench.runner import (
        RecordedRuns,
        load_recorded_runs,
        runs_whose_files_the_report_reads,
    )

    work, results, _ = serial
    write_bench_report(results, tmp_path / "earlier")  # the source as a report keeps it (results.json)
    copy = tmp_path / "work"
    shutil.copytree(work / "tune", copy / "tune")  # the tuning trials only: no evaluation run
    profile = BenchProfile(**TINY)
    needs_files = frozenset(runs_whose_files_the_report_reads(profile))
    assert needs_files == {
        ("digits-family", "splitgp", 0),
        ("digits-family", "harmony", 0),
    }  # the projections'
    recorded = RecordedRuns(load_recorded_runs([tmp_path / "earlier"], tmp_path / "out"), needs_files)
    lines: list[str] = []
    reused = run_benchmark(profile, copy, resume=True, log=lines.append, recorded=recorded)
    assert any(line.startswith("2 of 4 evaluation runs copied from 4 recorded runs") for line in lines)
    assert sorted(trained_methods(lines)) == ["harmony", "splitgp"]
    by_method = {r["method"]: r for r in reused["runs"]}
    assert {m for m, r in by_method.items() if r.get("copied_from")} == {"fedavg", "local"}
    source = str((tmp_path / "earlier" / "results.json").resolve())
    assert by_method["local"]["copied_from"] == source and by_method["local"]["reused"]
    text = write_bench_report(reused, tmp_path / "report").read_text()
    # the report's numbers are the source report's (harmony and splitgp trained again, the same)
    aggregated = [
        json.loads((tmp_path / d / "results.json").read_text())["aggregated"] for d in ("earlier", "report")
    ]
    timeless = [  # all but the wall time: harmony and splitgp were trained again
        {
            m: {k: v for k, v in cells.items() if k != "wall_seconds"}
            for m, cells in a["digits-family"].items()
        }
        for a in aggregated
    ]
    assert timeless[0] == timeless[1] and len(timeless[0]) == 4
    assert f"2 of them evaluation runs copied from the records of `{source}` (2 runs)" in text
    # only the run whose configuration changed is not copied
    changed = BenchProfile(
        **{**TINY, "algorithm_config": {**TINY["algorithm_config"], "local": {"lr": 0.02}}}
    )
    shutil.copytree(work / "tune", tmp_path / "other" / "tune")
    lines.clear()
    run_benchmark(changed, tmp_path / "other", resume=True, log=lines.append, recorded=recorded)
    assert any(line.startswith("1 of 4 evaluation runs copied") for line in lines)
    assert (tmp_path / "other" / "eval" / "digits-family" / "fedavg" / "seed-0" / RECORD).is_file()


def test_recorded_runs_are_refused_before_any_training_unless_they_are_a_reports(tmp_path):
    from harmony_mobile.bench.runner import bench, load_recorded_runs

    out = tmp_path / "out"
    with pytest.raises(ValueError, match="needs --resume"):
        bench("quick", out, tmp_path / "w", reuse_runs_from=[tmp_path])
    with pytest.raises(ValueError, match="nothing with --report-only"):
        bench("quick", out, tmp_path / "w", resume=True, report_only=True, reuse_runs_from=[tmp_path])
    with pytest.raises(FileNotFoundError, match="to reuse runs from"):
        bench("quick", out, tmp_path / "w", resume=True, reuse_runs_from=[tmp_path / "none.json"])
    assert not (tmp_path / "w").exists()
    malformed = tmp_path / "malformed.json"
    for content in ("{", '{"runs": {"harmony": []}}', '{"runs": [{"method": "harmony"}]}'):
        malformed.write_text(content)
        with pytest.raises(ValueError, match="is not a benchmark's results.json"):
            load_recorded_runs([malformed], out)
    out.mkdir()
    (out / "results.json").write_text('{"runs": []}')
    with pytest.raises(ValueError, match="is the report this invocation writes"):
        load_recorded_runs([out], out)


def test_jobs_must_be_positive():
    from harmony_mobile.bench.runner import bench

    with pytest.raises(ValueError, match="jobs"):
        bench("quick", jobs=0)


def test_a_narrowed_profile_keeps_the_named_settings_and_run_paths(tmp_path):
    from harmony_mobile.bench.runner import narrowed

    standard = load_profile("standard")
    first, second = standard.settings[0].name, standard.settings[2].name
    subset = narrowed(standard, [0, 1], None, [first, second])
    assert [s.name for s in subset.settings] == [first, second] and subset.seeds == [0, 1]
    assert subset.methods == standard.methods and subset.tuning == standard.tuning
    whole = {spec.path(tmp_path) for spec in evaluation_specs(standard, {})}
    assert {spec.path(tmp_path) for spec in evaluation_specs(subset, {})} <= whole
    assert narrowed(standard, None, None, None) is standard
    # the budget check follows a narrowed method list (and is dropped when none of its methods run)
    assert narrowed(standard, None, ["harmony", "local"], None).budget_check.methods == ["harmony"]
    assert narrowed(standard, None, ["local"], None).budget_check is None
    # and a narrowed setting list: only the checked settings that run are checked
    checked = standard.budget_check.settings
    kept = [name for name in checked if name in (first, second)]
    assert len(kept) < len(checked)  # the narrowing below must drop a checked setting
    assert narrowed(standard, None, None, [first, second]).budget_check.settings == kept
    with pytest.raises(ValueError, match="not in profile 'standard'"):
        narrowed(standard, None, None, ["cifar-family"])
    with pytest.raises(ValueError, match=r"tunes on \['mnist5k-family'\]: --settings must include it"):
        narrowed(standard, None, None, ["digits-family"])


def test_a_profiles_tiers_file_is_read_relative_to_the_profile(tmp_path, monkeypatch):
    import yaml

    from harmony_mobile.bench.profile import CONFIG_DIR
    from harmony_mobile.models import load_tiers

    folder = tmp_path / "configs"
    folder.mkdir()
    profile = yaml.safe_load((CONFIG_DIR / "quick.yaml").read_text())
    profile["train"] = {**profile.get("train", {}), "tiers_file": "narrow.yaml"}
    (folder / "narrow.yaml").write_text((CONFIG_DIR / "tiers-standard.yaml").read_text())
    (folder / "mine.yaml").write_text(yaml.safe_dump(profile))
    monkeypatch.chdir(tmp_path / "..")  # the working directory must not matter
    loaded = load_profile(folder / "mine.yaml")
    assert loaded.train["tiers_file"] == str((folder / "narrow.yaml").resolve())
    # the standard profile runs every family at width 1 (its tiers file says why)
    assert {t.width for t in load_tiers(load_profile("standard").train["tiers_file"]).tiers} == {1.0}


def test_the_budget_check_trains_the_tuned_pick_longer_on_validation_seeds(tmp_path):
    profile = BenchProfile(
        **{
            **TINY,
            "methods": ["harmony"],
            "tuning": {"seeds": [7], "grids": {"harmony": [{"lr": 0.01}]}},
            "budget_check": {"methods": ["harmony"], "rounds": [2], "seeds": [8]},
        }
    )
    lines: list[str] = []
    results = run_benchmark(profile, tmp_path, log=lines.append)
    check = results["budget_check"]
    (row,) = check["rows"]
    scores = row["val_acc_with_ood"]
    assert set(scores) == {1, 2} and check["seeds"] == [8]
    assert row["gain"] == pytest.approx(scores[2] - scores[1])
    runs = tmp_path / "budget" / "digits-family" / "harmony" / "seed-8"
    short, long = (json.loads((runs / f"rounds-{r}" / RECORD).read_text()) for r in (1, 2))
    assert short["validation"]["accuracy_with_ood"] == scores[1]
    evaluated = results["runs"][0]["train_config"]
    # the evaluated config (tuned pick included) with only the rounds and the seed changed
    assert {**long["train_config"], "rounds": 1, "seed": 0} == evaluated and evaluated["rounds"] == 1
    assert evaluated["algorithm_config"]["lr"] == 0.01
    assert len([line for line in lines if "budget " in line and line.startswith("[")]) == 2
    assert check["run_wall_seconds"] == pytest.approx(short["wall_seconds"] + long["wall_seconds"])
    assert check["run_provenance"] == [
        {"reused": False, "code": short["code"], "cpu": short["cpu"]},
        {"reused": False, "code": long["code"], "cpu": long["cpu"]},
    ]


def test_the_budget_check_judges_each_of_its_settings_apart(tmp_path):
    profile = load_profile(_two_setting_profile(tmp_path, methods=["local"]))
    checked = {"methods": ["local"], "rounds": [2], "seeds": [8], "settings": ["digits-dirichlet"]}
    profile = BenchProfile(**{**profile.model_dump(), "budget_check": checked})
    check = run_benchmark(profile, tmp_path / "work", log=lambda _: None)["budget_check"]
    (row,) = check["rows"]  # on the named setting only, not the tuning one
    assert check["settings"] == ["digits-dirichlet"] and row["setting"] == "digits-dirichlet"
    runs = tmp_path / "work" / "budget" / "digits-dirichlet" / "local" / "seed-8"
    for rounds in (1, 2):
        record = json.loads((runs / f"rounds-{rounds}" / RECORD).read_text())
        assert record["train_config"]["partition"] == "dirichlet"
        assert row["val_acc_with_ood"][rounds] == record["validation"]["accuracy_with_ood"]
    assert not (tmp_path / "work" / "budget" / "digits-family").exists()


def test_a_method_has_stopped_improving_only_if_no_longer_budget_gains_the_tolerance():
    from harmony_mobile.bench.runner import budget_row

    flat = budget_row("m", 12, {12: 0.700, 24: 0.709, 48: 0.695}, 0.01)
    assert flat["stopped_improving"] and flat["gain"] == pytest.approx(0.009)
    late = budget_row("m", 12, {12: 0.700, 24: 0.705, 48: 0.712}, 0.01)  # the longest budget gains
    assert not late["stopped_improving"] and late["gain"] == pytest.approx(0.012)
    assert not budget_row("m", 12, {12: 0.70, 24: 0.71}, 0.01)["stopped_improving"]  # exactly the tolerance
    missing = budget_row("m", 12, {12: 0.70, 24: float("nan"), 48: 0.69}, 0.01)  # a failed longer run
    assert not missing["stopped_improving"] and math.isnan(missing["gain"])


def _two_setting_profile(folder, **changes) -> str:
    """A tiny profile file with a tuning setting and a second one, tuned on the first only; every
    trial sets `lr`, so whichever wins, the pick shows in the runs' configs."""
    import yaml

    profile = {
        **TINY,
        "name": "two",
        "settings": [
            TINY["settings"][0],
            {"name": "digits-dirichlet", "dataset": "digits", "dataset_limit": 600, "partition": "dirichlet"},
        ],
        "methods": ["harmony", "local"],
        "tuning": {
            "seeds": [7],
            "settings": ["digits-family"],
            "grids": {"local": [{"lr": 0.02}, {"lr": 0.005}]},
        },
        **changes,
    }
    path = folder / "two.yaml"
    path.write_text(yaml.safe_dump(profile))
    return str(path)


def test_extending_a_report_adds_a_setting_as_the_whole_profile_would_run_it(tmp_path):
    from harmony_mobile.bench.runner import bench

    profile, out, work = _two_setting_profile(tmp_path), tmp_path / "out", tmp_path / "work"
    quiet = lambda _: None  # noqa: E731
    bench(profile, out, work, settings=["digits-family"], log=quiet)
    first = json.loads((out / "results.json").read_text())
    lines: list[str] = []
    report = bench(profile, out, work, settings=["digits-dirichlet"], extend_report=True, log=lines.append)
    extended = json.loads((out / "results.json").read_text())
    # only the new setting's evaluation runs trained: no tuning trial, no run of the first setting
    trained = [line for line in lines if line.startswith("[")]
    assert len(trained) == 2 and all("eval digits-dirichlet" in line for line in trained)
    assert (work / "eval" / "digits-family" / "harmony" / "seed-0" / RECORD).is_file()  # not cleared
    assert extended["tuning"] == first["tuning"] and extended["runs"][:2] == first["runs"]
    assert [r["setting"] for r in extended["runs"]] == ["digits-family"] * 2 + ["digits-dirichlet"] * 2
    assert (
        extended["runs"][3]["train_config"]["algorithm_config"]["lr"]
        == first["tuning"]["chosen"]["local"]["lr"]
    )
    assert extended["narrowed"]["settings"] is None and len(extended["invocations"]) == 2
    assert set(extended["aggregated"]) == {"digits-family", "digits-dirichlet"}
    # the same numbers as the whole profile in one invocation
    bench(profile, tmp_path / "whole", tmp_path / "whole-work", log=quiet)
    whole = json.loads((tmp_path / "whole" / "results.json").read_text())
    assert [comparable(r) for r in extended["runs"]] == [comparable(r) for r in whole["runs"]]
    text = report.read_text()
    assert "## digits-dirichlet" in text and "The 2 invocations that produced these results took" in text
    assert "--settings digits-dirichlet --extend" in text


def test_extending_a_report_runs_the_budget_check_of_the_settings_it_adds(tmp_path):
    from harmony_mobile.bench.runner import bench

    checked = {
        "methods": ["local"],
        "rounds": [2],
        "seeds": [8],
        "settings": ["digits-family", "digits-dirichlet"],
    }
    profile = _two_setting_profile(tmp_path, methods=["local"], budget_check=checked)
    out, work, quiet = tmp_path / "out", tmp_path / "work", lambda _: None
    bench(profile, out, work, settings=["digits-family"], log=quiet)
    first = json.loads((out / "results.json").read_text())["budget_check"]
    assert first["settings"] == ["digits-family"]
    bench(profile, out, work, settings=["digits-dirichlet"], extend_report=True, log=quiet)
    check = json.loads((out / "results.json").read_text())["budget_check"]
    assert check["settings"] == ["digits-family", "digits-dirichlet"]
    assert [row["setting"] for row in check["rows"]] == ["digits-family", "digits-dirichlet"]
    assert check["rows"][0] == first["rows"][0]  # the first setting's check is kept, not redone
    added = json.loads(
        (work / "budget" / "digits-dirichlet" / "local" / "seed-8" / "rounds-2" / RECORD).read_text()
    )
    assert check["rows"][1]["val_acc_with_ood"]["2"] == added["validation"]["accuracy_with_ood"]
    assert check["run_wall_seconds"] == pytest.approx(
        first["run_wall_seconds"] + check["by_setting"]["digits-dirichlet"]["run_wall_seconds"]
    )
    assert len(check["run_provenance"]) == 4


def test_a_setting_left_out_of_the_first_invocation_gets_its_budget_check_when_added(tmp_path):
    from harmony_mobile.bench.runner import bench, load_extendable, narrowed

    checked = {"methods": ["local"], "rounds": [2], "seeds": [8], "settings": ["digits-dirichlet"]}
    profile = _two_setting_profile(tmp_path, methods=["local"], budget_check=checked)
    assert narrowed(load_profile(profile), None, None, ["digits-family"]).budget_check.settings == []
    out, work, quiet = tmp_path / "out", tmp_path / "work", lambda _: None
    bench(profile, out, work, settings=["digits-family"], log=quiet)
    assert json.loads((out / "results.json").read_text())["budget_check"] is None
    for _ in range(2):  # added, then redone: its rows replaced, not repeated
        bench(profile, out, work, settings=["digits-dirichlet"], extend_report=True, resume=True, log=quiet)
        check = json.loads((out / "results.json").read_text())["budget_check"]
        assert check["settings"] == ["digits-dirichlet"] and len(check["rows"]) == 1
        assert check["run_wall_seconds"] == check["by_setting"]["digits-dirichlet"]["run_wall_seconds"]
    (tmp_path / "other").mkdir()
    other_check = {**checked, "settings": ["digits-family"]}
    elsewhere = load_profile(
        _two_setting_profile(tmp_path / "other", methods=["local"], budget_check=other_check)
    )
    with pytest.raises(
        ValueError,
        match=r"checked the budget on \['digits-dirichlet'\], the profile checks \['digits-family'\]",
    ):
        load_extendable(elsewhere, out, jobs=1)


def test_a_profile_file_must_not_check_the_budget_on_no_setting(tmp_path):
    import yaml

    path = tmp_path / "empty.yaml"
    path.write_text(
        yaml.safe_dump(
            {**TINY, "budget_check": {"methods": ["local"], "rounds": [2], "seeds": [8], "settings": []}}
        )
    )
    with pytest.raises(ValueError, match="budget_check settings is empty"):
        load_profile(path)


def test_a_budget_check_of_older_code_is_kept_whole_or_replaced_whole():
    from harmony_mobile.bench.runner import merged_budget_check

    row = {"method": "m", "rounds": 1, "val_acc_with_ood": {"1": 0.5}, "gain": 0.0, "stopped_improving": True}
    older = {"rows": [row], "settings": ["a"], "run_wall_seconds": 5.0, "run_provenance": [{"reused": False}]}
    newer = {
        "rows": [{**row, "setting": "b"}],
        "settings": ["b"],
        "run_wall_seconds": 7.0,
        "run_provenance": [{"reused": True}],
        "by_setting": {"b": {"run_wall_seconds": 7.0, "run_provenance": [{"reused": True}]}},
    }
    both = merged_budget_check(older, newer, ["a", "b"])
    assert both["settings"] == ["a", "b"] and [r["setting"] for r in both["rows"]] == ["a", "b"]
    assert both["run_wall_seconds"] == 12.0 and both["run_provenance"] == [
        {"reused": False},
        {"reused": True},
    ]
    redone = {
        **newer,
        "rows": [{**row, "setting": "a"}],
        "settings": ["a"],
        "by_setting": {"a": newer["by_setting"]["b"]},
    }
    replaced = merged_budget_check(older, redone, ["a", "b"])
    assert replaced["run_wall_seconds"] == 7.0 and replaced["settings"] == ["a"]
    assert replaced["rows"] == [{**row, "setting": "a"}]
    pooled = {**older, "settings": ["a", "b"]}  # older code pooled a method's runs over its settings
    with pytest.raises(ValueError, match=r"pools \['a', 'b'\] \(older code\): run the profile again"):
        merged_budget_check(pooled, newer, ["a", "b"])
    assert (
        merged_budget_check(None, newer, ["a", "b"]) is newer
        and merged_budget_check(older, None, ["a"]) is older
    )


def test_a_report_is_extended_only_by_the_profile_that_made_it_before_anything_is_deleted(tmp_path):
    from harmony_mobile.bench.runner import bench, load_extendable

    profile, out, work = _two_setting_profile(tmp_path), tmp_path / "out", tmp_path / "work"
    work.mkdir()
    (work / "earlier-run").write_text("kept")
    with pytest.raises(FileNotFoundError, match="to extend"):
        bench(profile, out, work, settings=["digits-dirichlet"], extend_report=True)
    with pytest.raises(ValueError, match="name them with --settings"):
        bench(profile, out, work, extend_report=True)
    with pytest.raises(ValueError, match="not in profile 'two'"):
        bench(profile, out, work, settings=["cifar"], extend_report=True)
    with pytest.raises(ValueError, match="names a setting twice"):
        bench(profile, out, work, settings=["digits-dirichlet", "digits-dirichlet"], extend_report=True)
    assert (work / "earlier-run").read_text() == "kept"
    current = load_profile(profile)
    older_code = {k: v for k, v in current.model_dump().items() if k != "budget_check"}  # a field added since
    made = {"profile": older_code, "narrowed": {"settings": ["digits-family"]}, "machine": {"jobs": 2}}
    out.mkdir()
    (out / "results.json").write_text(json.dumps(made))
    assert load_extendable(current, out, jobs=2)["machine"] == {"jobs": 2}
    # two extensions of one report at once would each write it without the other's setting
    from filelock import FileLock

    with FileLock(out / ".extend.lock", timeout=0):  # as another process extending it holds it
        with pytest.raises(ValueError, match="another invocation is extending"):
            bench(profile, out, work, settings=["digits-dirichlet"], extend_report=True, jobs=2)
    assert (work / "earlier-run").read_text() == "kept"
    with pytest.raises(ValueError, match="made with --jobs 2"):
        load_extendable(current, out, jobs=1)
    longer = load_profile(_two_setting_profile(tmp_path, budget={**TINY["budget"], "rounds": 2}))
    with pytest.raises(ValueError, match="another version of profile 'two'"):
        load_extendable(longer, out, jobs=2)
    (out / "results.json").write_text(json.dumps({**made, "narrowed": {"seeds": [0]}}))
    with pytest.raises(ValueError, match="only some seeds or methods"):
        load_extendable(current, out, jobs=2)
    family, dirichlet = older_code["settings"]
    redefined = {**made, "profile": {**older_code, "settings": [family, {**dirichlet, "alpha": 0.1}]}}
    (out / "results.json").write_text(json.dumps(redefined))
    with pytest.raises(ValueError, match="'digits-dirichlet' of .* is not the profile's any more"):
        load_extendable(current, out, jobs=2)


def test_resume_reads_back_a_run_recorded_in_another_checkout(tmp_path, monkeypatch):
    """A work dir made in another checkout records that checkout's absolute tiers path: the run is
    the same run (the tiers file is compared by its name in benchmarks/configs), not one to redo."""
    profile = load_profile("standard")
    spec = RunSpec("eval", profile.settings[0], "local", 0, 1)
    config = train_config(spec, profile.train, None).model_dump()
    assert config["tiers_file"].endswith("benchmarks/configs/tiers-standard.yaml")
    elsewhere = {**config, "tiers_file": "/another/checkout/benchmarks/configs/tiers-standard.yaml"}
    record_file = spec.path(tmp_path) / RECORD
    record_file.parent.mkdir(parents=True)
    settings = algorithm_settings("local", config["algorithm_config"])
    record_file.write_text(
        json.dumps({"train_config": elsewhere, "algorithm_settings": settings, "summary": {"marker": 1}})
    )

    def no_training(*args, **kwargs):
        raise AssertionError("the recorded run was trained again instead of read back")

    monkeypatch.setattr("harmony_mobile.bench.runner.training.train", no_training)
    record = run_one(spec, profile.train, tmp_path, resume=True)
    assert record["reused"] and record["summary"] == {"marker": 1}  # read back, not trained
    # a tiers file of another name is another configuration (benchmarks/configs has one tiers file:
    # the other name is not ours, so it stays absolute and differs)
    other = {**config, "tiers_file": "/another/checkout/benchmarks/configs/tiers-other.yaml"}
    assert not same_training(other, config) and same_training(elsewhere, config)


def test_a_worker_exits_when_its_bench_process_is_killed(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    script = (
        "import multiprocessing, os, time\n"
        "from concurrent.futures import ProcessPoolExecutor\n"
        "from harmony_mobile.bench.runner import exit_with_parent\n"
        "if __name__ == '__main__':\n"
        "    spawn = multiprocessing.get_context('spawn')\n"
        "    pool = ProcessPoolExecutor(1, spawn, initializer=exit_with_parent, initargs=(os.getpid(),))\n"
        "    print(pool.submit(os.getpid).result(), flush=True)\n"
        "    pool.submit(time.sleep, 120)\n"
        "    time.sleep(120)\n"
    )
    (tmp_path / "parent.py").write_text(script)
    parent = subprocess.Popen(
        [sys.executable, str(tmp_path / "parent.py")], stdout=subprocess.PIPE, text=True
    )
    worker = int(parent.stdout.readline())
    os.kill(worker, 0)  # alive, sleeping in its task
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:  # gone, or a zombie its new parent has not reaped yet
            if Path(f"/proc/{worker}/stat").read_text().split(")")[-1].split()[0] == "Z":
                return
        except FileNotFoundError:
            return
        time.sleep(0.2)
    os.kill(worker, signal.SIGKILL)
    pytest.fail("the worker outlived its killed bench process by 20 s")


def test_the_evaluation_cost_benchmark_gets_the_same_results_with_shared_and_unshared_answers(
    serial, tmp_path
):
    """benchmarks/eval_cost.py on a finished run: both ways timed, their measurements compared."""
    import importlib.util

    from harmony_mobile.bench.profile import REPO_ROOT

    path = REPO_ROOT / "benchmarks/eval_cost.py"
    spec = importlib.util.spec_from_file_location(path.stem, path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    work, _, _ = serial
    threads = torch.get_num_threads()  # the script sets 1 for its timing; the rest of the suite keeps its own
    script.main(
        [
            str(work / "eval" / "digits-family" / "harmony" / "seed-0"),
            "--turns",
            "1",
            "--out",
            str(tmp_path / "cost"),
        ]
    )
    torch.set_num_threads(threads)
    report = json.loads((tmp_path / "cost.json").read_text())
    # identical up to a sample at a client's exit threshold flipping with float rounding (the
    # threshold is calibrated on a validation sample's own score): one sample of one client's
    # request, which moves a mean over the clients by at most 1 / (clients x its ID samples)
    from harmony_mobile.bench.saved_runs import load_finished_run

    run = load_finished_run(work / "eval" / "digits-family" / "harmony" / "seed-0")
    one_sample = max(1 / (len(run.clients) * len(part.val)) for part in run.partition.clients)
    assert report["largest_difference"] <= one_sample, (one_sample, report["differences"])
    assert len(report["differences"]) <= 4, report["differences"]
    assert [len(v) for v in report["cpu_seconds"].values()] == [1, 1]
    said_identical = "Identical results both ways: **yes**" in (tmp_path / "cost.md").read_text()
    assert said_identical == report["identical_results"]


def test_the_evaluation_cost_comparison_names_every_leaf_that_differs():
    import importlib.util

    from harmony_mobile.bench.profile import REPO_ROOT

    path = REPO_ROOT / "benchmarks/eval_cost.py"
    spec = importlib.util.spec_from_file_location(path.stem, path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    nan = float("nan")
    same = {"a": [1.0, nan, {"b": "x"}], "c": 2}
    assert script.differing_numbers(same, json.loads(json.dumps(same))) == []
    other = {"a": [1.5, 0.0, {"b": "y"}], "d": 2}
    found = {p: (x, y) for p, x, y in script.differing_numbers(same, other)}
    assert set(found) == {"/a[0]", "/a[1]", "/a[2]/b", "/c", "/d"}
    assert script.gap(1.0, 1.5) == 0.5 and script.gap(nan, 0.0) == float("inf")
    assert script.differing_numbers([1, 2], [1, 2, 3]) == [("", [1, 2], [1, 2, 3])]


def test_a_cosine_budget_check_decays_each_run_over_its_own_rounds():
    profile = BenchProfile(
        **{
            **TINY,
            "budget": {**TINY["budget"], "lr_schedule": "cosine"},
            "budget_check": {"methods": ["harmony", "fedavg"], "rounds": [2, 4], "seeds": [8]},
        }
    )
    specs = budget_specs(profile, {})
    assert sorted({s.rounds for s in specs}) == [1, 2, 4]
    assert all(s.algorithm_config["decay_rounds"] == s.rounds for s in specs)


def test_a_record_made_before_a_setting_existed_is_read_as_that_settings_old_behaviour():
    config = train_config(RunSpec("eval", BenchProfile(**TINY).settings[0], "fedavg", 0, 1), {}, None)
    record = {"train_config": config.model_dump(), "algorithm_settings": algorithm_settings("fedavg", {})}
    assert record["algorithm_settings"].pop("decay_rounds") is None  # as an older record holds it
    assert is_recorded_run(record, config.model_dump(), algorithm_settings("fedavg", {}))
    assert not is_recorded_run(record, config.model_dump(), algorithm_settings("fedavg", {"decay_rounds": 1}))


def test_a_split_methods_record_from_before_exit_rules_were_settings_matches_its_own_rule():
    config = train_config(RunSpec("eval", BenchProfile(**TINY).settings[0], "splitgp", 0, 1), {}, None)
    record = {"train_config": config.model_dump(), "algorithm_settings": algorithm_settings("splitgp", {})}
    assert record["algorithm_settings"].pop("exit_rule") is None
    assert is_recorded_run(record, config.model_dump(), algorithm_settings("splitgp", {}))
    gated = algorithm_settings("splitgp", {"exit_rule": "slot_margin"})
    assert not is_recorded_run(record, config.model_dump(), gated)


def test_a_harmony_record_from_before_the_slot_gate_was_its_default_is_not_read_as_todays_harmony():
    config = train_config(RunSpec("eval", BenchProfile(**TINY).settings[0], "harmony", 0, 1), {}, None)
    old = algorithm_settings("harmony", {}) | {"exit_rule": None}  # then: the method's own, max softmax
    record = {"train_config": config.model_dump(), "algorithm_settings": old}
    assert not is_recorded_run(record, config.model_dump(), algorithm_settings("harmony", {}))
    del record["algorithm_settings"]["exit_rule"]  # older still: before the setting existed
    assert not is_recorded_run(record, config.model_dump(), algorithm_settings("harmony", {}))


def test_a_run_that_differs_only_in_its_exit_rule_is_its_twins_training_evaluated_again(serial, tmp_path):
    """harmony-max-softmax trains exactly what harmony trains: the benchmark evaluates harmony's
    files by max softmax instead of training again, and gets what training it would have given."""
    _, serial_results, _ = serial
    picked = {"harmony": serial_results["method_configs"]["harmony"]}
    profile = BenchProfile(
        **{**TINY, "methods": ["harmony", "harmony-max-softmax"], "tuning": None, "algorithm_config": picked}
    )
    lines: list[str] = []
    results = run_benchmark(profile, tmp_path / "twins", log=lines.append, jobs=2)
    harmony, twin = results["runs"]
    assert twin["method"] == "harmony-max-softmax" and "trained_by" not in harmony
    assert twin["trained_by"] == {key: harmony[key] for key in ("method", "cpu_seconds", "code", "cpu")}
    assert twin["cpu_seconds"] < harmony["cpu_seconds"]  # an evaluation, not a training
    assert trained_methods(lines) == ["harmony", "harmony-max-softmax"]  # the twin after its training
    assert twin["gates"]["exit_rule"] == "max_softmax" and harmony["gates"]["exit_rule"] == "slot_margin"
    spec = evaluation_specs(profile, {})[1]
    trained = run_one(spec, profile.train, tmp_path / "trained")  # the same run trained, not evaluated
    assert "trained_by" not in trained
    assert comparable(twin) == comparable(trained)
    for key in ("thresholds", "round_metrics", "gates"):
        assert twin[key] == trained[key], key
    text = write_bench_report(results, tmp_path / "report").read_text()
    assert "1 of the runs trains exactly what another run trains" in text
    assert "`harmony-max-softmax` from `harmony` (1 run)" in text


def test_a_slot_gated_twin_of_a_max_softmax_run_is_harmony_as_trained(serial, tmp_path):
    """The other way round (the server's slot prototypes made from the saved back-end and replay
    set), serially; read back on resume; and a twin whose run has no files trains itself."""
    _, serial_results, _ = serial
    picked = {"harmony": serial_results["method_configs"]["harmony"]}
    profile = BenchProfile(
        **{
            **TINY,
            "methods": ["harmony-max-softmax", "harmony"],
            "tuning": None,
            "algorithm_config": picked,
            "pca": {"methods": []},  # the report would read harmony's files: it would train them
        }
    )
    results = run_benchmark(profile, tmp_path / "reverse", log=[].append)
    twin = results["runs"][1]
    assert twin["method"] == "harmony" and twin["trained_by"]["method"] == "harmony-max-softmax"
    trained = next(r for r in serial_results["runs"] if r["method"] == "harmony")
    assert comparable(twin) == comparable(trained) and twin["gates"] == trained["gates"]
    lines: list[str] = []
    run_benchmark(profile, tmp_path / "reverse", log=lines.append, resume=True)
    assert trained_methods(lines) == []  # both read back
    spec = evaluation_specs(profile, {})[1]
    alone = run_one(spec, profile.train, tmp_path / "alone", trained_by=tmp_path / "no-such-run")
    assert "trained_by" not in alone and comparable(alone) == comparable(trained)


def test_only_runs_that_train_the_same_weights_are_twins():
    setting = BenchProfile(**TINY).settings[0]

    def spec(method, seed=0, keeps_files=False, **config):
        return RunSpec("eval", setting, method, seed, 1, config, keeps_files=keeps_files)

    specs = [
        spec("harmony"),
        spec("harmony-max-softmax"),  # the exit rule only: a twin
        spec("harmony", calibration_target=0.9),  # the calibration only: a twin
        spec("harmony-fixed-depth"),  # trains otherwise
        spec("harmony-max-softmax", seed=1),  # another seed
        spec("harmony", seed=1, keeps_files=True),  # the report reads its files: trained itself
        spec("splitgp"),
        spec("splitgp", exit_rule="slot_margin"),  # SplitGP gated by the slot margin: a twin
        spec("fedavg"),
        spec("fedavg", lr=0.01),
    ]
    assert training_twins(specs) == {1: 0, 2: 0, 7: 6}


def test_latency_is_not_measured_when_its_method_was_not_run(tmp_path):
    from harmony_mobile.bench.runner import measure_latency

    profile = BenchProfile(
        **{**TINY, "methods": ["fedavg"], "tuning": None, "latency": {"method": "harmony"}}
    )
    lines: list[str] = []
    assert measure_latency(profile, tmp_path, lines.append)["error"] == (
        "harmony (the latency section's method) was not run"
    )
    assert lines == ["latency not measured: harmony (the latency section's method) was not run"]


def test_a_mechanism_study_trains_only_the_runs_the_evaluation_lacks_and_resumes(serial, tmp_path):
    """HARMONY's ablations on seeds of their own: HARMONY's evaluation run at a shared seed is not
    trained again, the gate's ablation is HARMONY's files evaluated again, and --resume reads the
    whole study back."""
    _, serial_results, _ = serial
    picked = {"harmony": serial_results["method_configs"]["harmony"]}
    ablations = {"harmony-max-softmax": "gate", "harmony-fixed-depth": "random depth"}
    profile = BenchProfile(
        **{**TINY, "methods": ["harmony", "local"], "tuning": None, "algorithm_config": picked},
        targets={"baselines": ["local"], "ablations": ablations},
        mechanism_study={"seeds": [0, 1], "methods": list(ablations)},
    )
    lines: list[str] = []
    results = run_benchmark(profile, tmp_path / "work", log=lines.append)
    assert [(r["method"], r["seed"]) for r in results["runs"]] == [("harmony", 0), ("local", 0)]
    study = results["mechanism_study"]
    assert sorted((r["method"], r["seed"]) for r in study["runs"]) == [
        ("harmony", 1),
        ("harmony-fixed-depth", 0),
        ("harmony-fixed-depth", 1),
        ("harmony-max-softmax", 0),
        ("harmony-max-softmax", 1),
    ]
    assert sorted(trained_methods(lines)) == sorted(
        ["harmony", "local", "harmony", *["harmony-fixed-depth"] * 2, *["harmony-max-softmax"] * 2]
    )
    twins = [r for r in study["runs"] if r["method"] == "harmony-max-softmax"]
    assert all(r["trained_by"]["method"] == "harmony" for r in twins)
    assert study["run_wall_seconds"] == pytest.approx(sum(r["wall_seconds"] for r in study["runs"]))
    again: list[str] = []
    resumed = run_benchmark(profile, tmp_path / "work", resume=True, log=again.append)
    assert trained_methods(again) == []
    assert [comparable(r) for r in resumed["mechanism_study"]["runs"]] == [
        comparable(r) for r in study["runs"]
    ]
    assert set(results["method_configs"]) == {"harmony", "local", *ablations}
    text = write_bench_report(results, tmp_path / "report").read_text()
    study_section = text.split("## Mechanisms (2 seeds)")[1].split("## Plots")[0]
    assert "(evaluation of harmony's runs)" in study_section
    assert "2 of the runs train exactly what another run trains" in study_section
    assert "(`harmony-fixed-depth`): at 2 seeds (the mechanism study)" in text


def test_extending_a_report_runs_the_mechanism_study_of_the_settings_it_adds(tmp_path):
    study = {"seeds": [0, 1], "methods": ["harmony-fixed-depth"]}
    targets = {"baselines": ["local"], "ablations": {"harmony-fixed-depth": "random depth"}}
    profile = _two_setting_profile(tmp_path, targets=targets, mechanism_study=study)
    out, work = tmp_path / "out", tmp_path / "work"
    bench(profile, out, work, settings=["digits-family"], log=lambda _: None)
    first = json.loads((out / "results.json").read_text())["mechanism_study"]
    lines: list[str] = []
    bench(profile, out, work, settings=["digits-dirichlet"], extend_report=True, log=lines.append)
    extended = json.loads((out / "results.json").read_text())["mechanism_study"]
    trained = [line for line in lines if line.startswith("[")]
    assert len(trained) == 5 and all("eval digits-dirichlet" in line for line in trained)
    assert extended["runs"][:3] == first["runs"]
    assert [r["setting"] for r in extended["runs"]] == ["digits-family"] * 3 + ["digits-dirichlet"] * 3
    assert "### digits-dirichlet" in (out / "report.md").read_text()


def test_a_run_narrowed_to_some_seeds_or_methods_leaves_the_mechanism_study_out():
    from harmony_mobile.bench.runner import narrowed

    profile = BenchProfile(
        **TINY,
        targets={"ablations": {"harmony-fixed-depth": "random depth"}},
        mechanism_study={"seeds": [0, 1], "methods": ["harmony-fixed-depth"]},
    )
    assert narrowed(profile, None, None, ["digits-family"]).mechanism_study == profile.mechanism_study
    assert narrowed(profile, [0], None, None).mechanism_study is None
    assert narrowed(profile, None, ["harmony"], None).mechanism_study is None


def test_a_profile_tuned_per_setting_runs_each_settings_pick_end_to_end(tmp_path):
    """Two settings, each with the pick of its own validation runs: the evaluation runs train it and
    the report's configuration table names it per setting."""
    dirichlet = {
        "name": "digits-dirichlet",
        "dataset": "digits",
        "dataset_limit": 600,
        "partition": "dirichlet",
    }
    profile = BenchProfile(
        **{
            **TINY,
            "settings": [*TINY["settings"], {**dirichlet, "alpha": 0.5}],
            "methods": ["harmony", "fedavg"],
            "tuning": {"seeds": [7], "grids": {"harmony": [{}, {"lr": 0.01}]}, "per_setting": True},
        }
    )
    results = run_benchmark(profile, tmp_path / "work", log=lambda _: None)
    by_setting = results["method_configs_by_setting"]
    assert "method_configs" not in results and set(by_setting) == {"digits-family", "digits-dirichlet"}
    for row in results["tuning"]["trials"]:
        picked = by_setting[row["setting"]]["harmony"]
        assert row["chosen"] == (picked.get("lr") == row["params"].get("lr"))
    for run in results["runs"]:
        assert run["train_config"]["algorithm_config"] == by_setting[run["setting"]][run["method"]]
    text = write_bench_report(results, tmp_path / "report").read_text()
    assert "| setting | method | trial | params |" in text and "| setting | method | config |" in text
    assert "| digits-dirichlet | harmony | `" in text
