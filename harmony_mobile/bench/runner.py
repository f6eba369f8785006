"""The benchmark driver: tuning trials, then one training run per (setting, method, seed) through
`harmony_mobile.training.train`, then the latency measurement and the feature projections the report
plots.

Every run writes its record (RUN/bench.json) as soon as it finishes, so an interrupted profile
continues with `resume`: finished runs are read back, a run killed half-way (no record) is redone
from scratch. Runs are independent (each builds its own data, partition and models from the
seed), so `jobs` > 1 runs them in that many worker processes, each with one torch thread; the
numbers are the same as with `jobs` = 1. A run that trains exactly what another run of the
profile trains and differs only in its exit gate (`harmony-max-softmax` beside `harmony`) is not
trained again: it is the other run's files evaluated by its own gate (`training_twins`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import multiprocessing
import os
import platform
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from pydantic import ValidationError

from harmony_mobile import training
from harmony_mobile.algorithms.registry import build_algorithm, check_algorithm
from harmony_mobile.bench.hooks import BenchObserver, RunExtras, UplinkCounter
from harmony_mobile.bench.profile import REPO_ROOT, BenchProfile, Budget, Setting, repo_relative
from harmony_mobile.bench.saved_runs import evaluate_saved_run
from harmony_mobile.bench.stats import sum_known
from harmony_mobile.data.partition import ClientSplit, ood_test_indices
from harmony_mobile.run_dir import RunDir, RunDirError

RECORD = "bench.json"
RETRAINED = "retrained.json"  # a recorded run trained again for the files the report reads


@dataclass(frozen=True)
class RunSpec:
    """One training run: which stage it belongs to, its data setting, method, seed and config."""

    stage: str  # "tune" (a tuning trial), "budget" (a budget check; both scored on validation) or "eval"
    setting: Setting
    method: str
    seed: int
    rounds: int
    algorithm_config: dict = field(default_factory=dict)
    trial: int | None = None
    # the report reads this run's model files (latency, projections): a record alone, as a checkout
    # holds it (model files are not committed), does not finish it
    keeps_files: bool = False

    def path(self, work_dir: Path) -> Path:
        run = Path(work_dir) / self.stage / self.setting.name / self.method / f"seed-{self.seed}"
        if self.stage == "budget":
            return run / f"rounds-{self.rounds}"
        return run / f"trial-{self.trial}" if self.trial is not None else run

    def label(self) -> str:
        trial = f" trial {self.trial}" if self.trial is not None else ""
        rounds = f" {self.rounds} rounds" if self.stage == "budget" else ""
        return f"{self.stage} {self.setting.name} {self.method}{trial}{rounds} seed={self.seed}"


def train_config(spec: RunSpec, shared: dict, data_root: str | None) -> training.TrainConfig:
    setting = spec.setting
    return training.TrainConfig(
        dataset=setting.dataset,
        data_root=data_root,
        dataset_limit=setting.dataset_limit,
        partition=setting.partition,
        alpha=setting.alpha,
        rounds=spec.rounds,
        seed=spec.seed,
        algorithm=spec.method,
        algorithm_config=spec.algorithm_config,
        **{"threads": 1, **shared},
    )


def run_one(
    spec: RunSpec,
    shared: dict,
    work_dir: Path,
    data_root: str | None = None,
    resume: bool = False,
    code: dict | None = None,
    trained_by: Path | None = None,
) -> dict:
    """Train one run and return its record (also written to RUN/bench.json). With `resume`, a
    finished run of the same configuration is read back instead; anything else there is redone.
    `code`: the version the caller loaded (a commit made while runs train must not relabel them).
    `trained_by`: a finished run that trained exactly this one's weights (`training_twins`): when
    its files are there, this run is that run evaluated by its own exit rule, not trained again."""
    config = train_config(spec, shared, data_root)
    settings = algorithm_settings(spec.method, config.algorithm_config)
    run_path = spec.path(work_dir)
    record_file = run_path / RECORD
    restore_kept_record(run_path)
    if record_file.is_file():  # `check_recorded` refused every other record before the stage began
        record = json.loads(record_file.read_text())
        if not (resume and is_recorded_run(record, config.model_dump(), settings)):
            raise ValueError(f"{run_path} holds a recorded run that is not this one; it is never deleted")
        if not spec.keeps_files or files_of_record(run_path):
            return {**with_retrained(record, run_path), "reused": True}
        return _retrained_for_files(spec, config, settings, run_path, code, record)
    if run_path.exists():  # a run killed half-way
        shutil.rmtree(run_path)
    record = _evaluated_twin(spec, config, trained_by, code) if trained_by is not None else None
    if record is None:
        record = _trained(spec, config, run_path, code)
    record["algorithm_settings"] = settings
    run_path.mkdir(parents=True, exist_ok=True)
    record_file.write_text(json.dumps(record, indent=1))
    return record


def kept_record(run_path: Path) -> Path:
    """Where a recorded run's record waits while the run is trained again (beside its folder)."""
    return run_path.with_name(f"{run_path.name}.{RECORD}")


def restore_kept_record(run_path: Path) -> None:
    """A retraining killed half-way: its partial files go, its record comes back."""
    kept = kept_record(run_path)
    if kept.is_file():
        shutil.rmtree(run_path, ignore_errors=True)
        run_path.mkdir(parents=True)
        os.replace(kept, run_path / RECORD)


def files_of_record(run_path: Path) -> bool:
    """The run's files are finished and belong to its record: trained with it, or trained again
    for it (retrained.json names the record it was trained for)."""
    if not _finished_with_record(run_path):
        return False
    return not (run_path / RETRAINED).is_file() or retrained_for_record(run_path) is not None


def retrained_for_record(run_path: Path) -> dict | None:
    """retrained.json when it was trained for the run's record as it is now, else None."""
    retrained_file = run_path / RETRAINED
    if not retrained_file.is_file():
        return None
    retrained = json.loads(retrained_file.read_text())
    return retrained if retrained.get("record_sha256") == record_digest(run_path) else None


def record_digest(run_path: Path) -> str:
    return hashlib.sha256((run_path / RECORD).read_bytes()).hexdigest()


def _retrained_for_files(spec: RunSpec, config, settings: dict, run_path: Path, code, recorded: dict) -> dict:
    """A recorded run trained again for the files the report reads: its record stays the result
    (another machine's float rounding moves a retrained run's numbers, and a resumed report must
    not move with them) and is never deleted: it waits beside the folder while the run trains."""
    kept = kept_record(run_path)
    os.replace(run_path / RECORD, kept)
    shutil.rmtree(run_path)
    record = _trained(spec, config, run_path, code)
    record["algorithm_settings"] = settings
    os.replace(kept, run_path / RECORD)
    part = run_path / f"{RETRAINED}.part"
    part.write_text(json.dumps({**record, "record_sha256": record_digest(run_path)}, indent=1))
    os.replace(part, run_path / RETRAINED)
    return {**recorded, "files_retrained": record["summary"]}


def with_retrained(record: dict, run_path: Path) -> dict:
    """A record, with the summary of the run trained again for its files when there is one."""
    retrained = retrained_for_record(run_path) if _finished_with_record(run_path) else None
    return {**record, "files_retrained": retrained["summary"]} if retrained else record


def changed_settings(record: dict, config: dict, settings: dict) -> str:
    """What differs between a recorded run and the one asked for, as `name recorded -> asked`."""
    recorded_method = recorded_settings(record, settings)
    if recorded_method is None:
        return "its record predates records of every algorithm setting"
    recorded = {**repo_relative(record.get("train_config") or {}), **recorded_method}
    asked = {**repo_relative(config), **settings}
    changed = [
        f"{key} {recorded.get(key)!r} -> {asked.get(key)!r}"
        for key in sorted(set(recorded) | set(asked))
        if key != "algorithm_config" and recorded.get(key) != asked.get(key)
    ]
    return ", ".join(changed) or "its record differs"


def check_recorded(
    specs: list[RunSpec], shared: dict, work_dir: Path, data_root: str | None, resume: bool
) -> None:
    """Before any run of a stage: every recorded run in the way is named at once. Without `resume`
    a record is never overwritten; with it, a record of another configuration is never deleted."""
    conflicts = []
    for spec in specs:
        record_file = spec.path(work_dir) / RECORD
        if not record_file.is_file():
            continue
        if not resume:
            conflicts.append(f"{spec.path(work_dir)} (add --resume to read it back)")
            continue
        config = train_config(spec, shared, data_root).model_dump()
        settings = algorithm_settings(spec.method, config["algorithm_config"])
        record = json.loads(record_file.read_text())
        if not is_recorded_run(record, config, settings):
            conflicts.append(f"{spec.path(work_dir)} ({changed_settings(record, config, settings)})")
    if conflicts:
        shown = "; ".join(conflicts[:5]) + (f"; and {len(conflicts) - 5} more" if len(conflicts) > 5 else "")
        raise ValueError(
            f"{len(conflicts)} recorded run(s) are not runs of this configuration, and a record is never "
            f"deleted: {shown}. Delete those folders to train them again, or use another --work-dir"
        )


def _record_head(spec: RunSpec, config: training.TrainConfig, code: dict | None) -> dict:
    return {
        "stage": spec.stage,
        "setting": spec.setting.name,
        "method": spec.method,
        "seed": spec.seed,
        "trial": spec.trial,
        "train_config": config.model_dump(),
        "code": code or code_version(),  # a profile resumed across commits says which made each run
        "cpu": cpu_info(),  # and across machines, which CPU
    }


def _trained(spec: RunSpec, config: training.TrainConfig, run_path: Path, code: dict | None) -> dict:
    counter, extras = UplinkCounter(), RunExtras()
    started, cpu_started = time.perf_counter(), time.process_time()
    observer = BenchObserver(counter, extras, spec.seed)
    results = training.train(config, run_path, show_progress=False, observer=observer)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    train_samples = sum(len(c.train_idx) for c in RunDir(run_path).clients())
    return {
        **_record_head(spec, config, code),
        "wall_seconds": wall,
        "cpu_seconds": cpu,  # on a shared machine closer to the run's own cost than wall time
        "summary": results["summary"],
        "mean": results["mean"],
        "uplink": counter.as_dict(),
        "train_samples": train_samples,
        "upload_bytes_per_sample": counter.total() / train_samples,
        "thresholds": results.get("thresholds", {}),
        "privacy": results.get("privacy", {}),  # label DP / feature DP settings and their accounting
        **_extra_metrics(extras),
        "round_metrics": _round_metrics(run_path),
    }


def _extra_metrics(extras: RunExtras) -> dict:
    return {
        "validation": extras.validation,
        "unseen": extras.unseen,
        "per_tier": extras.per_tier,
        "gates": extras.gates,
    }


# What a training twin shares with the run that trained its weights: everything training decided.
TRAINING_FIELDS = ("uplink", "train_samples", "upload_bytes_per_sample", "privacy", "round_metrics")


def _evaluated_twin(
    spec: RunSpec, config: training.TrainConfig, trained_by: Path, code: dict | None
) -> dict | None:
    """The record of `trained_by`'s weights evaluated by `spec`'s exit rule; its time is the
    evaluation's alone (what the run cost), the training's is the other run's. None when those
    weights cannot be read (no files, as in a fresh checkout, or files another checkout made
    whose tiers file is gone): then the run trains itself."""
    if not _finished_with_record(trained_by):
        return None
    algorithm = build_algorithm(spec.method, config.algorithm_config)
    trained = json.loads((trained_by / RECORD).read_text())
    extras = RunExtras()
    started, cpu_started = time.perf_counter(), time.process_time()
    observer = BenchObserver(UplinkCounter(), extras, spec.seed)
    try:
        results = evaluate_saved_run(
            trained_by, algorithm.exit_rule, algorithm.config.calibration_target, observer
        )
    except (OSError, RunDirError):
        return None
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    return {
        **_record_head(spec, config, code),
        "wall_seconds": wall,
        "cpu_seconds": cpu,
        "summary": results["summary"],
        "mean": results["mean"],
        **{key: trained.get(key) for key in TRAINING_FIELDS},
        "thresholds": results["thresholds"],
        **_extra_metrics(extras),
        # the weights' provenance: the commit and CPU that trained them (their rounding is theirs)
        "trained_by": {key: trained.get(key) for key in ("method", "cpu_seconds", "code", "cpu")},
    }


def _finished_with_record(run_path: Path) -> bool:
    """A run whose files and record are both there (training writes final_metrics.json last)."""
    return (run_path / RECORD).is_file() and (run_path / "final_metrics.json").is_file()


def algorithm_settings(method: str, algorithm_config: dict | None) -> dict:
    """Every setting of the method as it trains, defaults included: the configuration a profile
    writes names only what it changes, so a default changed since a run was recorded would
    otherwise read that run back as the new default's."""
    return build_algorithm(method, algorithm_config).config.model_dump(mode="json")


def same_training(recorded: dict | None, config: dict) -> bool:
    """Whether a recorded run trained `config`, its tiers file compared by its name in
    benchmarks/configs: a work dir made in another checkout records that checkout's absolute path.
    Never by the file's content (an edited tiers file must get a new name, or a fresh work dir)."""
    return recorded is not None and repo_relative(recorded) == repo_relative(config)


# Method settings added after runs were recorded, with the value that trains as those runs did: a
# record without the key is a run of that value.
SETTINGS_ADDED_SINCE_RECORDS = {
    "decay_rounds": None,
    "exit_rule": None,
    "server_logit_adjustment": 0.0,
}


def recorded_settings(record: dict, settings: dict) -> dict | None:
    """The method settings a record trained with, a setting added since read as its old value."""
    recorded = record.get("algorithm_settings")
    if recorded is None:
        return None
    missing = {k: v for k, v in SETTINGS_ADDED_SINCE_RECORDS.items() if k in settings and k not in recorded}
    return {**recorded, **missing}


def is_recorded_run(record: dict, config: dict, settings: dict) -> bool:
    """Whether `record` is the run of training `config` with the method's full `settings`: what
    `--resume` reads back and `--reuse-runs-from` copies, and nothing else."""
    recorded = recorded_settings(record, settings)
    return same_training(record.get("train_config"), config) and recorded == settings


def _round_metrics(run_path: Path) -> list[dict]:
    """The scalar metrics training logged per round (losses, diversity measurements...)."""
    log = run_path / "metrics.jsonl"
    if not log.is_file():
        return []
    rows = []
    for line in log.read_text().splitlines():
        row = json.loads(line)
        rows.append({k: v for k, v in row.items() if isinstance(v, int | float)})
    return rows


def exit_with_parent(parent: int) -> None:
    """Worker initializer: a worker whose bench process died without shutting the pool down
    (killed, not interrupted) exits too, rather than training on for minutes and racing a resumed
    invocation over the same run folders."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _run_in_worker(
    spec: RunSpec,
    shared: dict,
    work_dir: Path,
    data_root: str | None,
    resume: bool,
    code: dict,
    trained_by: Path | None = None,
) -> dict:
    torch.set_num_threads(1)
    return run_one(spec, shared, work_dir, data_root, resume, code, trained_by)


# Settings that decide only how a trained run is evaluated (its exit gate), never its weights.
EVALUATION_ONLY_SETTINGS = ("exit_rule", "calibration_target")


def training_key(spec: RunSpec) -> str | None:
    """What a split run's weights depend on besides the shared settings: two specs with the same key
    train the same weights (the bench's lineage follows the seed, so even the label tokens agree).
    None for a method without a back-end: it has no gate to evaluate it by."""
    algorithm = build_algorithm(spec.method, spec.algorithm_config)
    if not algorithm.uses_split:
        return None
    settings = algorithm.config.model_dump(mode="json", exclude=set(EVALUATION_ONLY_SETTINGS))
    where = [spec.stage, spec.setting.name, spec.seed, spec.rounds, type(algorithm).__name__]
    return json.dumps([where, settings], sort_keys=True)


def training_twins(specs: list[RunSpec]) -> dict[int, int]:
    """Index of each spec that trains exactly what an earlier spec trains -> that spec's index: the
    benchmark evaluates the earlier run's files by the twin's exit rule instead of training them
    again. A run whose files the report reads is never a twin (a twin has no files of its own)."""
    first: dict[str, int] = {}
    twins = {}
    for index, spec in enumerate(specs):
        key = training_key(spec)
        if key is None:
            continue
        if key in first and not spec.keeps_files:
            twins[index] = first[key]
        first.setdefault(key, index)
    return twins


def execute(
    specs: list[RunSpec],
    shared: dict,
    work_dir: Path,
    data_root: str | None,
    resume: bool,
    jobs: int,
    log: Callable[[str], None],
) -> list[dict]:
    """Run every spec (in `jobs` worker processes when jobs > 1); records in the order of `specs`.
    Training twins (`training_twins`) run after everything else, from their twin's files."""
    check_recorded(specs, shared, work_dir, data_root, resume)
    started = time.perf_counter()
    code = code_version()
    records: list[dict | None] = [None] * len(specs)
    twins = training_twins(specs)
    done = 0

    def report(index: int, record: dict) -> None:
        nonlocal done
        done += 1
        records[index] = record
        val = record.get("validation", {}).get("accuracy_with_ood", float("nan"))
        how = "reused" if record.get("reused") else f"{record['wall_seconds']:.0f} s"
        log(
            f"[{done}/{len(specs)}] {specs[index].label()}: acc p=0 {record['summary']['accuracy_without_ood']:.3f}, "
            f"with OOD {record['summary']['accuracy_with_ood']:.3f} (val {val:.3f}), {how}, "
            f"total {time.perf_counter() - started:.0f} s"
        )

    passes = [[i for i in range(len(specs)) if i not in twins], list(twins)]
    for indices in passes:
        jobs_of = {i: (specs[i], shared, work_dir, data_root, resume, code) for i in indices}
        for i in set(indices) & set(twins):
            jobs_of[i] += (specs[twins[i]].path(work_dir),)
        _run_jobs(jobs_of, jobs, report)
    return records


def _run_jobs(jobs_of: dict[int, tuple], jobs: int, report: Callable[[int, dict], None]) -> None:
    if not jobs_of:  # e.g. no twins: no worker processes to start
        return
    if jobs <= 1:
        for index, args in jobs_of.items():
            report(index, run_one(*args))
        return
    # spawn: a fresh interpreter per worker (no forked torch thread pools)
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(jobs, spawn, initializer=exit_with_parent, initargs=(os.getpid(),)) as pool:
        futures = {pool.submit(_run_in_worker, *args): index for index, args in jobs_of.items()}
        for future in as_completed(futures):
            report(futures[future], future.result())


@dataclass(frozen=True)
class RecordedRuns:
    """Evaluation runs recorded in other reports, copied into the work dir instead of trained
    (`harmony bench --reuse-runs-from`), and the runs never copied because the report reads their
    files (models for the latency, features for the projections), not only their records."""

    runs: list[dict]
    needs_files: frozenset[tuple[str, str, int]]  # (setting, method, seed)


def load_recorded_runs(sources: list[Path], out_dir: Path) -> list[dict]:
    """The evaluation run records in other reports' results.json files (or their folders), each
    saying which file it was copied from (a record copied before keeps its first source)."""
    recorded = []
    for source in sources:
        results_file = (Path(source) / "results.json" if Path(source).is_dir() else Path(source)).resolve()
        if not results_file.is_file():
            raise FileNotFoundError(f"no {results_file} to reuse runs from")
        if results_file == (Path(out_dir) / "results.json").resolve():
            raise ValueError(f"{results_file} is the report this invocation writes: copy it elsewhere first")
        runs = _evaluation_runs(results_file)
        name = (
            str(results_file.relative_to(REPO_ROOT))
            if results_file.is_relative_to(REPO_ROOT)
            else str(results_file)
        )
        recorded += [{"copied_from": name, **run} for run in runs]
    return recorded


def _evaluation_runs(results_file: Path) -> list[dict]:
    """The evaluation and mechanism study runs of a benchmark's results.json, or a ValueError
    saying it is not one."""
    try:
        results = json.loads(results_file.read_text())
        runs = results["runs"] + (results.get("mechanism_study") or {}).get("runs", [])
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise ValueError(f"{results_file} is not a benchmark's results.json: {error!r}") from error
    fields = ("stage", "setting", "method", "seed", "train_config")
    if not isinstance(runs, list) or not all(
        isinstance(r, dict) and all(f in r for f in fields) for r in runs
    ):
        raise ValueError(
            f"{results_file} is not a benchmark's results.json: its runs lack {', '.join(fields)}"
        )
    return [run for run in runs if run["stage"] == "eval"]


def runs_whose_files_the_report_reads(profile: BenchProfile) -> set[tuple[str, str, int]]:
    """(setting, method, seed) of the runs whose models the latency measurement exports and whose
    features the projections plot."""
    first = (profile.settings[0].name, profile.seeds[0])
    runs = {(first[0], profile.latency.method, first[1])} if profile.latency is not None else set()
    setting = profile.pca.setting or first[0]
    seed = profile.pca.seed if profile.pca.seed is not None else first[1]
    return runs | {(setting, method, seed) for method in profile.pca.methods}


def copy_recorded_runs(
    specs: list[RunSpec], shared: dict, work_dir: Path, data_root: str | None, recorded: RecordedRuns
) -> int:
    """Write into the work dir, as finished runs that `--resume` reads back, the recorded runs of
    the same setting, method and training configuration as a spec. The tiers file is compared by
    its name in benchmarks/configs (runs record its absolute path, maybe in another checkout), not
    by content. A run folder that exists already, or a run in `recorded.needs_files`, is left
    alone. Returns how many runs were copied."""

    def key(setting: str, method: str, config: dict) -> tuple[str, str, str]:
        return setting, method, json.dumps(repo_relative(config), sort_keys=True)

    by_run = {}
    for record in recorded.runs:
        by_run.setdefault(key(record["setting"], record["method"], record["train_config"]), record)
    copied = 0
    for spec in specs:
        path, config = spec.path(work_dir), train_config(spec, shared, data_root).model_dump()
        record = by_run.get(key(spec.setting.name, spec.method, config))
        if (
            record is None
            or path.exists()
            or (spec.setting.name, spec.method, spec.seed) in recorded.needs_files
            # a record that does not say every setting it trained with may predate a default
            or not is_recorded_run(
                record, config, algorithm_settings(spec.method, config["algorithm_config"])
            )
        ):
            continue
        copy = {k: v for k, v in record.items() if k not in ("reused", "files_retrained")}
        copy |= {"train_config": config}
        if record["train_config"] != config:
            copy["copied_tiers_file"] = record["train_config"].get("tiers_file")
        path.mkdir(parents=True)
        (path / RECORD).write_text(json.dumps(copy, indent=1))
        copied += 1
    return copied


def records_of(records: list[dict], specs: list[RunSpec], **fields) -> list[dict]:
    """The records (in the order of `specs`) whose spec has the given field values."""
    return [
        r for r, s in zip(records, specs, strict=True) if all(getattr(s, k) == v for k, v in fields.items())
    ]


def provenance(records: list[dict]) -> list[dict]:
    """Which of a stage's runs were read back (`--resume`) and which commit made each: what the
    report says of tuning and budget-check runs, whose records it does not keep."""
    return [{"reused": bool(r.get("reused")), "code": r.get("code"), "cpu": r.get("cpu")} for r in records]


NO_RUN_TIME = {"run_wall_seconds": 0.0, "run_cpu_seconds": 0.0}  # a stage that ran nothing


def cpu_seconds(records: list[dict]) -> float | None:
    """The runs' summed CPU time; None if a record of older code did not keep it."""
    return sum_known(r.get("cpu_seconds") for r in records)


def validation_score(record: dict) -> float:
    return record.get("validation", {}).get("accuracy_with_ood", float("nan"))


def tuning_specs(profile: BenchProfile) -> list[RunSpec]:
    """Every trial of every tuned method on the tuning settings and seeds."""
    if profile.tuning is None:
        return []
    return [
        RunSpec(
            "tune",
            setting,
            method,
            seed,
            profile.method_budget(method, setting).rounds,
            {**profile.method_config(method, setting=setting), **trial},
            index,
        )
        for method, trials in profile.tuning.grids.items()
        for index, trial in enumerate(trials)
        for setting in profile.tuning_settings()
        for seed in profile.tuning.seeds
    ]


def tune(profile: BenchProfile, work_dir: Path, data_root: str | None, resume: bool, jobs: int, log) -> dict:
    """Run every trial of every tuned method; each method keeps the trial with the best mean
    validation accuracy with OOD (ties: the earlier trial)."""
    if profile.tuning is None:
        return {"chosen": {}, "trials": [], "run_provenance": [], **NO_RUN_TIME}
    specs = tuning_specs(profile)
    log(
        f"tuning: {len(profile.tuning.grids)} methods x {profile.tuning.trials} trials x {len(specs) // (len(profile.tuning.grids) * profile.tuning.trials)} runs each"
    )
    records = execute(specs, profile.train, work_dir, data_root, resume, jobs, log)
    chosen, trials = pick_trials(profile, specs, records)
    return {
        "chosen": chosen,
        "trials": trials,
        "run_wall_seconds": sum(r["wall_seconds"] for r in records),
        "run_cpu_seconds": cpu_seconds(records),
        "run_provenance": provenance(records),
    }


def pick_trials(profile: BenchProfile, specs: list[RunSpec], records: list[dict]) -> tuple[dict, list[dict]]:
    """Each tuned method's best trial by mean validation accuracy with OOD, and every trial's row;
    in each setting on its own runs when the profile tunes per setting (picks `{setting: {method:
    values}}`, rows naming their setting)."""
    if not profile.tunes_per_setting:
        return _pick_trials(profile, specs, records, {})
    chosen, trials = {}, []
    for setting in profile.tuning_settings():
        chosen[setting.name], rows = _pick_trials(profile, specs, records, {"setting": setting})
        trials += [{"setting": setting.name, **row} for row in rows]
    return chosen, trials


def _pick_trials(
    profile: BenchProfile, specs: list[RunSpec], records: list[dict], where: dict
) -> tuple[dict, list[dict]]:
    """`pick_trials` over the runs whose spec has the fields `where` gives."""
    trials, chosen = [], {}
    for method, grid in profile.tuning.grids.items():
        scores = []
        for index, params in enumerate(grid):
            mine = records_of(records, specs, method=method, trial=index, **where)
            score = float(np.nanmean([validation_score(r) for r in mine]))
            scores.append(score)
            trials.append(
                {
                    "method": method,
                    "trial": index,
                    "params": params,
                    "val_acc_with_ood": score,
                    "val_acc_without_ood": float(
                        np.nanmean([r["validation"]["accuracy_without_ood"] for r in mine])
                    ),
                    "runs": len(mine),
                }
            )
        best = int(np.nanargmax(scores))
        chosen[method] = grid[best]
        for row in trials:
            if row["method"] == method:
                row["chosen"] = row["trial"] == best
    return chosen, trials


def _copy_and_log(profile, specs, work_dir, data_root, recorded: RecordedRuns | None, log) -> None:
    if recorded is not None:
        copied = copy_recorded_runs(specs, profile.train, work_dir, data_root, recorded)
        stages = "evaluation and study" if profile.mechanism_study else "evaluation"
        log(
            f"{copied} of {len(specs)} {stages} runs copied from {len(recorded.runs)} recorded runs of other "
            "reports (runs copied by an earlier invocation are read back, not counted here)"
        )


def evaluation_specs(
    profile: BenchProfile, tuned: dict, read_files: set[tuple[str, str, int]] | None = None
) -> list[RunSpec]:
    """`read_files`: the runs whose model files the report reads (default: the profile's own)."""
    if read_files is None:
        read_files = runs_whose_files_the_report_reads(profile)
    return [
        RunSpec(
            "eval",
            setting,
            method,
            seed,
            profile.method_budget(method, setting).rounds,
            profile.method_config(method, tuned, setting=setting),
            keeps_files=(setting.name, method, seed) in read_files,
        )
        for setting in profile.settings
        for seed in profile.seeds  # seed-major: a partial benchmark already has every method per seed
        for method in profile.methods
    ]


def study_specs(
    profile: BenchProfile, tuned: dict, read_files: set, evaluated: list[RunSpec]
) -> list[RunSpec]:
    """The mechanism study's runs that the evaluation (`evaluated`) does not make itself."""
    studied = profile.mechanism_profile()
    if studied is None:
        return []
    made = {spec.path(Path()) for spec in evaluated}
    return [spec for spec in evaluation_specs(studied, tuned, read_files) if spec.path(Path()) not in made]


@dataclass(frozen=True)
class Execution:
    """Where and how a stage's runs are made (`execute`'s arguments besides the runs)."""

    work_dir: Path
    data_root: str | None
    resume: bool
    jobs: int
    log: Callable[[str], None]


def run_evaluation_and_study(
    profile: BenchProfile, tuned: dict, read_files: set, how: Execution, recorded: RecordedRuns | None
) -> tuple[list[dict], dict | None]:
    """The evaluation runs, and the mechanism study's (None without one). One `execute` for both,
    so that a study run training what an evaluation run trains is that run's files evaluated again."""
    specs = evaluation_specs(profile, tuned, read_files)
    extra = study_specs(profile, tuned, read_files, specs)
    _copy_and_log(profile, specs + extra, how.work_dir, how.data_root, recorded, how.log)
    records = execute(
        specs + extra, profile.train, how.work_dir, how.data_root, how.resume, how.jobs, how.log
    )
    if profile.mechanism_study is None:
        return records, None
    return records[: len(specs)], study_results(profile.mechanism_study.model_dump(), records[len(specs) :])


def study_results(study: dict, runs: list[dict]) -> dict:
    """The mechanism study's entry in the results: its seeds and methods, its own runs and their time."""
    return {
        **study,
        "runs": runs,
        "run_wall_seconds": sum(r["wall_seconds"] for r in runs),
        "run_cpu_seconds": cpu_seconds(runs),
    }


def merged_study(
    earlier: dict | None, added: dict | None, settings: list[str], order: list[str]
) -> dict | None:
    """An extension's study: the earlier runs of the settings not added now (`settings`), then the
    added ones, in the profile's setting order."""
    if added is None:
        return None
    runs = [r for r in (earlier or {}).get("runs", []) if r["setting"] not in settings] + added["runs"]
    runs.sort(key=lambda r: order.index(r["setting"]))
    return study_results(added, runs)


def budget_specs(profile: BenchProfile, tuned: dict) -> list[RunSpec]:
    """Each checked method's tuned config at its budget's rounds and at every longer budget."""
    check = profile.budget_check
    if check is None:
        return []
    return [
        RunSpec(
            "budget", setting, method, seed, rounds, profile.method_config(method, tuned, rounds, setting)
        )
        for setting in profile.budget_check_settings()
        for method in check.methods
        for rounds in profile.checked_rounds(method, setting)
        for seed in check.seeds
    ]


def budget_row(method: str, base: int, scores: dict[int, float], tolerance: float, setting: str = "") -> dict:
    """`scores`: validation accuracy per rounds, `base` the method's budget. It has stopped improving
    when no longer budget gains `tolerance` or more; a budget without a score (NaN) leaves that
    undecided, reported as not stopped."""
    longer = [score for rounds, score in scores.items() if rounds != base]
    gain = max(longer) - scores[base] if not np.isnan([scores[base], *longer]).any() else float("nan")
    return {
        "setting": setting,
        "method": method,
        "rounds": base,
        "val_acc_with_ood": scores,
        "gain": gain,
        "stopped_improving": bool(gain < tolerance),
    }


def check_budget(
    profile: BenchProfile, tuned: dict, work_dir: Path, data_root: str | None, resume: bool, jobs: int, log
) -> dict | None:
    """Mean validation accuracy with OOD of each checked method per budget (rounds); a method has
    stopped improving at its budget when no longer budget gains `tolerance` or more."""
    specs = budget_specs(profile, tuned)
    if not specs:
        return None
    check = profile.budget_check
    log(
        f"budget check: {len(check.methods)} methods at {len(specs) // len(check.methods)} "
        "(setting, budget, seed) runs each"
    )
    records = execute(specs, profile.train, work_dir, data_root, resume, jobs, log)
    rows = []
    settings = profile.budget_check_settings()
    for setting in settings:
        for method in check.methods:
            checked = profile.checked_rounds(method, setting)
            base, scores = checked[0], {}
            for rounds in checked:
                mine = records_of(records, specs, setting=setting, method=method, rounds=rounds)
                scores[rounds] = float(np.nanmean([validation_score(r) for r in mine]))
            rows.append(budget_row(method, base, scores, check.tolerance, setting.name))
    # run times and provenance per setting, so that extending a report can redo one setting's check
    by_setting = {}
    for setting in settings:
        mine = records_of(records, specs, setting=setting)
        by_setting[setting.name] = {
            "run_wall_seconds": sum(r["wall_seconds"] for r in mine),
            "run_cpu_seconds": cpu_seconds(mine),
            "run_provenance": provenance(mine),
        }
    check_fields = {"seeds": check.seeds, "settings": list(by_setting), "tolerance": check.tolerance}
    return _with_totals({"rows": rows, **check_fields}, by_setting)


def _with_totals(check: dict, by_setting: dict) -> dict:
    """`check` with `by_setting` and the run times and provenance over all its settings, in its order."""
    return {
        **check,
        "run_wall_seconds": sum(part["run_wall_seconds"] for part in by_setting.values()),
        "run_cpu_seconds": sum_known(part.get("run_cpu_seconds") for part in by_setting.values()),
        "run_provenance": [p for part in by_setting.values() for p in part["run_provenance"]],
        "by_setting": by_setting,
    }


def _extended_budget_check(profile, results, settings, work_dir, data_root, resume, jobs, log) -> dict | None:
    """The results' budget check with that of the checked settings among `settings` run (again)
    with the tuning picks."""
    checked = [s.name for s in profile.budget_check_settings() if s.name in settings]
    if not checked:
        return results.get("budget_check")
    only = profile.model_copy(
        update={"budget_check": profile.budget_check.model_copy(update={"settings": checked})}
    )
    added = check_budget(only, results["tuning"]["chosen"], work_dir, data_root, resume, jobs, log)
    return merged_budget_check(results.get("budget_check"), added, [s.name for s in profile.settings])


def merged_budget_check(earlier: dict | None, added: dict | None, order: list[str]) -> dict | None:
    """`earlier`'s budget check with the settings `added` checked replaced or added, rows and
    settings in `order` (the profile's). Older code kept no per-setting times: its check of one
    setting is kept or replaced whole; one that pooled several settings in a row is not merged."""
    if not earlier or not added:
        return added or earlier
    if "by_setting" not in earlier:
        if len(earlier["settings"]) != 1:
            raise ValueError(
                f"its budget check pools {earlier['settings']} (older code): run the profile again"
            )
        (only,) = earlier["settings"]
        times = {
            "run_wall_seconds": earlier.get("run_wall_seconds", 0.0),
            "run_cpu_seconds": earlier.get("run_cpu_seconds"),
            "run_provenance": earlier.get("run_provenance", []),
        }
        earlier = {
            **earlier,
            "rows": [{**row, "setting": only} for row in earlier["rows"]],
            "by_setting": {only: times},
        }
    redone = set(added["settings"])
    kept = [name for name in earlier["settings"] if name not in redone]
    merged = {name: earlier["by_setting"][name] for name in kept} | added["by_setting"]
    settings = sorted(merged, key=order.index)
    rows = [row for row in earlier["rows"] if row.get("setting") in kept] + added["rows"]
    rows.sort(key=lambda row: order.index(row["setting"]))  # stable: methods keep their order
    return _with_totals(
        {**added, "rows": rows, "settings": settings}, {name: merged[name] for name in settings}
    )


@torch.no_grad()
def feature_projection(run_path: Path, seed: int, max_points: int = 800, tsne: bool = False) -> dict:
    """Back-end penultimate features of every client's ID test samples and of its OOD test samples
    (p = 0.5 draw), projected to 2-D by PCA (and t-SNE if asked) fitted on them. Returns points with
    class and family."""
    from sklearn.decomposition import PCA

    run = RunDir(run_path)
    dataset = run.dataset()
    labels = dataset.labels.numpy()
    backend = run.backend().backend
    info = run.info
    artifacts = run.clients()
    # the OOD pool is everything no client holds
    held = np.concatenate(
        [np.concatenate([c.train_idx, c.val_idx, c.test_idx]).astype(np.int64) for c in artifacts]
    )
    pool = np.setdiff1d(np.arange(len(labels)), held)
    features, classes, families, ood = [], [], [], []
    for artifact in artifacts:
        tier = info.tiers.get(artifact.tier)
        test = np.asarray(artifact.test_idx, dtype=np.int64)
        split = ClientSplit(artifact.client_id, tuple(artifact.classes), test, test, test)
        has_ood = np.isin(labels[pool], artifact.classes, invert=True).any()
        index, is_ood = ood_test_indices(split, labels, pool, 0.5 if has_ood else 0.0, seed)
        _, z = run.front_end(artifact)(dataset.images[index])
        features.append(backend.features(z).numpy())
        classes.append(labels[index])
        families += [tier.family] * len(index)
        ood.append(is_ood)
    features = np.concatenate(features)
    classes, families, ood = np.concatenate(classes), np.array(families), np.concatenate(ood)
    keep = np.sort(np.random.default_rng(seed).permutation(len(features))[:max_points])
    features = features[keep]
    xy = PCA(n_components=2, random_state=0).fit_transform(features)
    points = {
        "x": np.round(xy[:, 0], 3).tolist(),
        "y": np.round(xy[:, 1], 3).tolist(),
        "class": classes[keep].astype(int).tolist(),
        "family": families[keep].tolist(),
        "ood": ood[keep].astype(bool).tolist(),
    }
    if tsne:
        from sklearn.manifold import TSNE

        perplexity = min(30.0, (len(features) - 1) / 3)
        embedded = TSNE(n_components=2, perplexity=perplexity, random_state=0).fit_transform(features)
        points["tsne_x"] = np.round(embedded[:, 0], 3).tolist()
        points["tsne_y"] = np.round(embedded[:, 1], 3).tolist()
    return points


def code_version() -> dict:
    """The commit the benchmark ran on and the training files that differed from it (if any)."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=False
        ).stdout

    try:
        changed = git("status", "--porcelain", "--", "harmony_mobile").splitlines()
        return {
            "commit": git("rev-parse", "--short", "HEAD").strip(),
            "uncommitted": [line[3:] for line in changed],
        }
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "uncommitted": []}


def cpu_info() -> dict:
    """Which CPU and which of torch's kernel sets ran: the same run on another CPU model can round
    differently, and over many rounds that moves a run's accuracy by points, not only in the last digit."""
    return dict(_cpu_info())  # a copy: every run record gets its own


@functools.cache
def _cpu_info() -> dict:
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [
            line.split(":", 1)[1].strip()
            for line in cpuinfo.read_text().splitlines()
            if line.startswith("model name")
        ]
        model = names[0] if names else model
    return {"cpu_model": model, "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}


def machine_info() -> dict:
    import os

    return {
        "code": code_version(),
        "platform": platform.platform(),
        **cpu_info(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "torch_threads": 1,
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def measure_latency(profile: BenchProfile, work_dir: Path, log) -> dict | None:
    """Time each tier's exported front-end and the back-end once (architectures, not weights, set
    the time, so one run's front-ends stand for every method's)."""
    spec = profile.latency
    if spec is None:
        return None
    if spec.method not in profile.methods:  # e.g. --methods left it out: no run of it to export
        reason = f"{spec.method} (the latency section's method) was not run"
        log(f"latency not measured: {reason}")
        return {"error": reason, "rtt_ms": spec.rtt_ms}
    from harmony_mobile.bench.latency import measure_run

    setting, seed = profile.settings[0], profile.seeds[0]
    run_path = Path(work_dir) / "eval" / setting.name / spec.method / f"seed-{seed}"
    try:
        measured = measure_run(run_path, spec.quantization, spec.runs)
    except Exception as error:  # noqa: BLE001 - an export failure must not lose hours of training results
        log(f"latency not measured: {type(error).__name__}: {error}")
        return {"error": f"{type(error).__name__}: {error}", "rtt_ms": spec.rtt_ms}
    log(
        "latency: "
        + ", ".join(f"{t} {v['device_ms']:.3f} ms" for t, v in measured["tiers"].items())
        + f"; server {measured['server_ms']:.3f} ms"
    )
    return {**measured, "rtt_ms": spec.rtt_ms, "run": f"{setting.name}/{spec.method}/seed-{seed}"}


def projections(profile: BenchProfile, work_dir: Path) -> dict:
    methods = {}
    setting = profile.pca.setting or profile.settings[0].name
    seed = profile.pca.seed if profile.pca.seed is not None else profile.seeds[0]
    for method in profile.pca.methods:
        path = Path(work_dir) / "eval" / setting / method / f"seed-{seed}"
        if (path / RECORD).is_file():
            methods[method] = feature_projection(path, seed, profile.pca.max_points, profile.pca.tsne)
    return {"setting": setting, "seed": seed, "methods": methods}


def method_configs(profile: BenchProfile, methods: list[str], tuned: dict) -> dict:
    """What each method trains with, for the report: `method_configs`, or, when the profile tunes
    per setting, `method_configs_by_setting` (`{setting: {method: config}}`)."""
    if not profile.tunes_per_setting:
        return {"method_configs": {m: profile.method_config(m, tuned) for m in methods}}
    return {
        "method_configs_by_setting": {
            s.name: {m: profile.method_config(m, tuned, setting=s) for m in methods} for s in profile.settings
        }
    }


def run_benchmark(
    profile: BenchProfile,
    work_dir: Path,
    data_root: str | None = None,
    resume: bool = False,
    log: Callable[[str], None] = print,
    jobs: int = 1,
    recorded: RecordedRuns | None = None,
) -> dict:
    """Tuning, every (setting, method, seed), latency and projections; returns the raw results the
    report is written from. `recorded`: run records of other reports that `--resume` may read back
    instead of training (`copy_recorded_runs`)."""
    torch.set_num_threads(1)
    started = time.perf_counter()
    machine = {**machine_info(), "jobs": jobs}
    tuning = tune(profile, work_dir, data_root, resume, jobs, log)
    tuning_seconds = time.perf_counter() - started
    how = Execution(work_dir, data_root, resume, jobs, log)
    runs, study = run_evaluation_and_study(
        profile, tuning["chosen"], runs_whose_files_the_report_reads(profile), how, recorded
    )
    budget_check = check_budget(profile, tuning["chosen"], work_dir, data_root, resume, jobs, log)
    methods = [*profile.methods, *profile.studied_methods]
    return {
        "profile": profile.model_dump(),
        **method_configs(profile, methods, tuning["chosen"]),
        "method_budgets": {m: profile.method_budget(m).model_dump() for m in methods},
        "tuning": {**tuning, "wall_seconds": tuning_seconds},
        "budget_check": budget_check,
        "mechanism_study": study,
        "machine": machine,
        "runs": runs,
        "latency": measure_latency(profile, work_dir, log),
        "projections": projections(profile, work_dir),
        "total_wall_seconds": time.perf_counter() - started,
    }


def narrowed(
    profile: BenchProfile, seeds: list[int] | None, methods: list[str] | None, settings: list[str] | None
) -> BenchProfile:
    """The profile restricted to the given seeds, methods and settings (by name); None keeps the
    profile's. Runs keep their paths, so a narrowed run's results are reused by the whole profile
    with `--resume`."""
    updates: dict = {}
    for flag, values in (("--seeds", seeds), ("--methods", methods), ("--settings", settings)):
        if values and len(set(values)) != len(values):  # two runs would share one run folder
            raise ValueError(f"{flag} {','.join(map(str, values))} repeats an entry")
    for method in methods or []:
        try:
            check_algorithm(method)
        except ValueError as error:
            raise ValueError(f"--methods: {error}") from None
    if seeds:
        updates["seeds"] = seeds
    if methods:
        updates["methods"] = methods
    if settings:
        updates["settings"] = [s.model_dump() for s in profile.settings_named(settings)]
        untuned = [s.name for s in profile.tuning_settings() if s.name not in settings]
        if untuned:  # every method's pick is made there, before any evaluation run
            raise ValueError(f"profile {profile.name!r} tunes on {untuned}: --settings must include it")
    if profile.budget_check:  # a narrowed run checks only the methods and settings it runs
        updates.update(_narrowed_budget_check(profile, methods, settings))
    if seeds or methods:  # the study is of the target method and its ablations at their seeds
        updates["mechanism_study"] = None
    return BenchProfile(**{**profile.model_dump(), **updates}) if updates else profile


def _narrowed_budget_check(
    profile: BenchProfile, methods: list[str] | None, settings: list[str] | None
) -> dict:
    check = profile.budget_check.model_dump()
    if methods:
        check["methods"] = [m for m in check["methods"] if m in methods]
    if settings:
        check["settings"] = [s.name for s in profile.budget_check_settings() if s.name in settings]
    if not (methods or settings):
        return {}
    # no checked method left: no check; no checked setting left: an empty check, not none, so
    # that the results stay extendable (`--extend` runs the other settings' check)
    return {"budget_check": check if check["methods"] else None}


def _comparable_profile(profile: dict) -> dict:
    """What must not change between results and the invocations that extend them: everything but
    the prose and the settings, read through the current model (results of older code lack fields
    added since, which take their defaults) with the tiers file named relative to the repository."""
    from pydantic import ValidationError

    try:
        dumped = BenchProfile(**profile).model_dump()
    except ValidationError as error:
        raise ValueError(f"the results' profile is not valid any more: {error}") from error
    kept = {k: v for k, v in dumped.items() if k not in ("description", "notes", "settings")}
    if kept.get("budget_check"):  # narrowed with the settings: extending checks the others
        kept["budget_check"] = {k: v for k, v in kept["budget_check"].items() if k != "settings"}
    return {**kept, "train": repo_relative(kept.get("train") or {})}


FIRST_RUN_THE_TUNING_SETTINGS = "run the profile with its tuning settings first"


def _results_file(out_dir: Path, action: str, hint: str) -> Path:
    """`out_dir`'s results.json, or a FileNotFoundError saying what could not be done without it."""
    results_file = Path(out_dir) / "results.json"
    if not results_file.is_file():
        raise FileNotFoundError(f"no {results_file} to {action}; {hint}")
    return results_file


def load_extendable(profile: BenchProfile, out_dir: Path, jobs: int) -> dict:
    """`out_dir`'s results, or a ValueError unless they are of this profile as it is now, with every
    method and seed, run with the same number of jobs (the time line divides the runs' time by it)."""
    results_file = _results_file(out_dir, "extend", FIRST_RUN_THE_TUNING_SETTINGS)
    results = json.loads(results_file.read_text())
    narrowing = results.get("narrowed") or {}
    if narrowing.get("seeds") or narrowing.get("methods"):
        raise ValueError(f"{results_file} ran only some seeds or methods: extend a report of all of them")
    if _comparable_profile(results["profile"]) != _comparable_profile(profile.model_dump()):
        raise ValueError(
            f"{results_file} was made with another version of profile {profile.name!r}: run it again"
        )
    mine = [s.model_dump() for s in profile.settings]
    for setting in results["profile"]["settings"]:  # a setting redefined since would mix two datasets
        if Setting(**setting).model_dump() not in mine:
            raise ValueError(f"setting {setting['name']!r} of {results_file} is not the profile's any more")
    covered = [setting["name"] for setting in results["profile"]["settings"]]
    expected = [s.name for s in profile.budget_check_settings() if s.name in covered]
    checked = (results.get("budget_check") or {}).get("settings", [])
    if checked != expected:
        raise ValueError(
            f"{results_file} checked the budget on {checked}, the profile checks {expected} of its settings: run it again"
        )
    made_with = results.get("machine", {}).get("jobs", 1)
    if made_with != jobs:
        raise ValueError(f"{results_file} was made with --jobs {made_with}: extend it with the same")
    return results


def extend(
    profile: BenchProfile,
    results: dict,
    settings: list[str],
    work_dir: Path,
    data_root: str | None,
    resume: bool,
    log: Callable[[str], None],
    jobs: int = 1,
    recorded: RecordedRuns | None = None,
    argument: str | None = None,
) -> dict:
    """`results` (from `load_extendable`) with the evaluation runs of `settings` added (or redone),
    trained with their tuning picks, and the budget check of those the profile checks; the tuning,
    the other settings' budget check and latency are kept. A profile too long for one sitting is
    finished a setting at a time this way."""
    from harmony_mobile.bench.report import bench_command, command_line

    started = time.perf_counter()
    added = profile.model_copy(update={"settings": profile.settings_named(settings)})
    # the runs the whole profile's report reads, not those of the added settings alone
    how = Execution(work_dir, data_root, resume, jobs, log)
    read_files = runs_whose_files_the_report_reads(profile)
    new_runs, study = run_evaluation_and_study(added, results["tuning"]["chosen"], read_files, how, recorded)
    order = [s.name for s in profile.settings]
    check = _extended_budget_check(profile, results, settings, work_dir, data_root, resume, jobs, log)
    results = {
        **results,
        "budget_check": check,
        "mechanism_study": merged_study(results.get("mechanism_study"), study, settings, order),
    }
    runs = sorted(  # stable: each setting's runs keep their seed-major order
        [r for r in results["runs"] if r["setting"] not in settings] + new_runs,
        key=lambda r: order.index(r["setting"]),
    )
    covered = [name for name in order if any(r["setting"] == name for r in runs)]
    if (profile.pca.setting or order[0]) in settings:  # the features plot is of a setting added now
        results = {**results, "projections": projections(profile, work_dir)}
    invocations = results.get("invocations") or [
        {"command": command_line(results), "wall_seconds": results["total_wall_seconds"]}
    ]
    invocations.append(
        {
            "command": f"{bench_command(results, argument)} --settings {','.join(settings)} --extend",
            "wall_seconds": time.perf_counter() - started,
        }
    )
    return {
        **results,
        "profile": {
            **profile.model_dump(),
            "settings": [s.model_dump() for s in profile.settings_named(covered)],
        },
        "machine": {**results["machine"], "code": code_version()},
        "runs": runs,
        "narrowed": {"settings": None if covered == order else covered, "seeds": None, "methods": None},
        "invocations": invocations,
        "total_wall_seconds": sum(i["wall_seconds"] for i in invocations),
    }


def _same_budget(recorded: dict, budget: Budget) -> bool:
    """Through the model: a field added since the results counts at its default; one removed since
    makes them another budget."""
    try:
        return Budget(**recorded) == budget
    except ValidationError:
        return False


def rerender(profile: BenchProfile, out_dir: Path, log: Callable[[str], None]) -> Path:
    """The report written again from `out_dir`'s results.json: numbers unchanged, prose from the
    current profile unless its budget changed since (then the results' own prose is kept)."""
    from harmony_mobile.bench.report import write_bench_report

    results_file = _results_file(out_dir, "re-render", "run the benchmark first")
    results = json.loads(results_file.read_text())
    recorded = results["profile"]
    current = {s.name: s.method_rounds for s in profile.settings}
    same_rounds = all(s.get("method_rounds", {}) == current.get(s["name"], {}) for s in recorded["settings"])
    if _same_budget(recorded["budget"], profile.budget) and same_rounds:
        results["profile"].update(description=profile.description, notes=profile.notes)
    else:
        log("the profile's budget changed since these results: their own description and notes are kept")
    report = write_bench_report(results, out_dir)
    log(f"report: {report} (re-rendered from {results_file})")
    return report


def _check_extension_args(whole: BenchProfile, settings: list[str] | None, narrowing: bool) -> None:
    if not settings or narrowing:
        raise ValueError(
            "--extend adds whole settings to a report: name them with --settings, without --seeds, --methods or --report-only"
        )
    if len({s.name for s in whole.settings_named(settings)}) != len(settings):
        raise ValueError(f"--settings names a setting twice: {','.join(settings)}")


def extend_and_report(
    profile: BenchProfile,
    settings: list[str] | None,
    out_dir: Path,
    work_dir: Path | None,
    data_root: str | None,
    resume: bool,
    log: Callable[[str], None],
    jobs: int,
    narrowing: bool,
    recorded: RecordedRuns | None = None,
    argument: str | None = None,
) -> Path:
    """`extend` the report in `out_dir` and write it again (`argument`: this invocation's
    --profile, for its command line). A lock on the folder, released when this process ends
    however it ends, keeps a second invocation from writing the report over this one's settings."""
    from filelock import FileLock, Timeout

    from harmony_mobile.bench.report import write_bench_report

    _check_extension_args(profile, settings, narrowing)
    # the lock lives beside the report, so there must be one; the report is read under the lock
    # (another extension may just have ended) and checked before a run folder is touched
    _results_file(out_dir, "extend", FIRST_RUN_THE_TUNING_SETTINGS)
    lock = FileLock(Path(out_dir) / ".extend.lock")
    try:
        lock.acquire(timeout=0)
    except Timeout as error:
        raise ValueError(f"another invocation is extending {out_dir}: wait for it") from error
    try:
        earlier = load_extendable(profile, out_dir, jobs)
        work_dir = _work_dir(work_dir, profile, clear=False)  # the earlier settings' runs stay
        log(
            f"benchmark {profile.name}: adding {', '.join(settings)} to {out_dir}, {jobs} job(s); runs in {work_dir}"
        )
        started = time.perf_counter()
        results = extend(
            profile, earlier, settings, work_dir, data_root, resume, log, jobs, recorded, argument
        )
        report = write_bench_report(results, out_dir)
    finally:
        lock.release()
    log(f"report: {report} ({(time.perf_counter() - started) / 60:.1f} min)")
    return report


def _work_dir(work_dir: Path | None, profile: BenchProfile, clear: bool) -> Path:
    path = Path(work_dir) if work_dir else Path.home() / ".cache" / "harmony-mobile" / "bench" / profile.name
    if path.exists() and clear:
        recorded = sum(1 for _ in path.rglob(RECORD))
        if work_dir and recorded:  # a folder the user chose may hold hours of runs (or committed ones)
            raise ValueError(
                f"{path} holds {recorded} recorded run(s): add --resume to read them back, or delete "
                "the folder to train every run again"
            )
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    return path


def profile_argument(profile_name: str | Path) -> str:
    """`--profile` as the report's command line should repeat it: a name, or a YAML file's path
    relative to the repository when it lies inside it."""
    path = Path(profile_name)
    if not path.suffix:
        return str(profile_name)
    resolved = path.resolve()
    return str(resolved.relative_to(REPO_ROOT)) if resolved.is_relative_to(REPO_ROOT) else str(path)


def _check_bench_args(jobs: int, resume: bool, report_only: bool, reuse_runs_from: list[Path] | None) -> None:
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    if reuse_runs_from and report_only:
        raise ValueError("--reuse-runs-from copies runs for training: it does nothing with --report-only")
    if reuse_runs_from and not resume:
        raise ValueError("--reuse-runs-from needs --resume (copied runs are read back as finished runs)")


def bench(
    profile_name: str = "quick",
    out_dir: Path | None = None,
    work_dir: Path | None = None,
    data_root: str | None = None,
    resume: bool = False,
    seeds: list[int] | None = None,
    methods: list[str] | None = None,
    log: Callable[[str], None] = print,
    report_only: bool = False,
    jobs: int = 1,
    settings: list[str] | None = None,
    extend_report: bool = False,
    reuse_runs_from: list[Path] | None = None,
) -> Path:
    """Load a profile, run it, write the report; returns the report path. `report_only` re-renders
    the report from an earlier results.json without training; `extend_report` adds `settings` to
    it (see `extend`). `reuse_runs_from`: other reports whose recorded evaluation runs of the same
    configuration are read back instead of trained (needs `resume`; see `copy_recorded_runs`).

    Defaults: report in benchmarks/results/<profile>/, runs in ~/.cache/harmony-mobile/bench/<profile>/
    (deleted and redone unless `resume`; extending never deletes the earlier settings' runs)."""
    from harmony_mobile.bench.profile import load_profile
    from harmony_mobile.bench.report import write_bench_report

    _check_bench_args(jobs, resume, report_only, reuse_runs_from)
    whole = load_profile(profile_name)
    # extending skips the tuning stage, so its settings need not include the tuning ones
    profile = whole if extend_report else narrowed(whole, seeds, methods, settings)
    out_dir = Path(out_dir) if out_dir else REPO_ROOT / "benchmarks" / "results" / profile.name
    recorded = None
    if reuse_runs_from:  # the whole profile's file-reading runs too: a later whole run reads them
        needs_files = runs_whose_files_the_report_reads(whole) | runs_whose_files_the_report_reads(profile)
        recorded = RecordedRuns(load_recorded_runs(reuse_runs_from, out_dir), frozenset(needs_files))
    if extend_report:
        narrowing = bool(seeds or methods or report_only)
        argument = profile_argument(profile_name)
        return extend_and_report(
            whole, settings, out_dir, work_dir, data_root, resume, log, jobs, narrowing, recorded, argument
        )
    if report_only:
        return rerender(profile, out_dir, log)
    work_dir = _work_dir(work_dir, profile, clear=not resume)
    started = time.perf_counter()
    trials = profile.tuning.trials if profile.tuning else 0
    log(
        f"benchmark {profile.name}: {len(profile.settings)} setting(s) x {len(profile.methods)} methods x "
        f"{len(profile.seeds)} seeds, {trials} tuning trials per tuned method, {jobs} job(s); runs in {work_dir}"
    )
    results = run_benchmark(profile, work_dir, data_root, resume, log, jobs, recorded)
    results["narrowed"] = {"settings": settings, "seeds": seeds, "methods": methods}
    results["profile_argument"] = profile_argument(profile_name)
    report = write_bench_report(results, out_dir)
    log(f"report: {report} ({(time.perf_counter() - started) / 60:.1f} min)")
    return report
