"""A benchmark profile: data settings, seeds, methods, the one budget every method gets, the
tuning grids, and the targets the report checks.

The budget is shared: the same rounds, local steps per round and samples drawn per step for every
method. HARMONY draws a support and a query batch per step, so its batch size is half the samples
per step; every other method draws one batch of the full size. A method may get its own stated
budget (`budgets`): `centralized` is a converged reference, not a competitor at equal budget; and a
setting may give a method more rounds of it (`settings[].method_rounds`) where the budget check finds
it still improving on that partition alone. An ablation trains for its parent's budget.
Hyper-parameters of one method (`algorithm_config`, and the trial tuning picks for it) are applied
to its relatives too: HARMONY's to its ablations (an ablation changes exactly one mechanism),
SplitGP's to multi-exit (except lambda, fixed at 0 there).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from harmony_mobile.algorithms.harmony import Harmony
from harmony_mobile.algorithms.registry import ALGORITHMS, RENAMED, build_algorithm, check_algorithm
from harmony_mobile.training import TrainConfig
from harmony_mobile.yaml_files import read_yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO_ROOT / "benchmarks" / "configs"


_TRAIN_FIELDS = TrainConfig.model_fields


class Budget(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rounds: int = Field(ge=1)
    local_steps: int = Field(ge=1, description="optimizer steps per client per round")
    samples_per_step: int = Field(
        ge=4, description="samples a client draws per step (HARMONY: support + query)"
    )
    lr_schedule: Literal["constant", "cosine"] = Field(
        default="constant",
        description="cosine: the method's learning rates during the rounds (client and server; not the "
        "final personalization's) decay over the run's own rounds (a budget check's longer runs decay "
        "over theirs)",
    )


class Setting(BaseModel):
    """A data setting of the benchmark: the TrainConfig fields it sets, defaulting as TrainConfig does,
    and the methods that train for more rounds on it."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    dataset: str = _TRAIN_FIELDS["dataset"].default
    dataset_limit: int | None = Field(default=_TRAIN_FIELDS["dataset_limit"].default, ge=10)
    partition: Literal["family", "dirichlet", "shard"] = _TRAIN_FIELDS["partition"].default
    alpha: float = Field(default=_TRAIN_FIELDS["alpha"].default, gt=0)
    method_rounds: dict[str, int] = Field(
        default_factory=dict,
        description="rounds of a method's budget in this setting, in place of its budget's own: where "
        "the budget check finds the method still improving on this partition alone (only the rounds "
        "change, so the method's configuration is the same in every setting)",
    )

    @model_validator(mode="after")
    def _positive_rounds(self) -> Setting:
        bad = {m: r for m, r in self.method_rounds.items() if r < 1}
        if bad:
            raise ValueError(f"method_rounds {bad}: rounds must be 1 or more")
        return self

    def label(self) -> str:
        scheme = f"Dirichlet alpha={self.alpha:g}" if self.partition == "dirichlet" else self.partition
        if self.partition == "family":
            scheme = "family-correlated"
        limit = f" (first {self.dataset_limit})" if self.dataset_limit else ""
        return f"{self.dataset}{limit}, {scheme} split"


class PcaSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    setting: str | None = None  # None = the first setting
    seed: int | None = None  # None = the first seed
    methods: list[str] = ["splitgp", "harmony"]
    max_points: int = Field(default=800, ge=10, description="points kept per method in results.json")
    tsne: bool = Field(default=False, description="also a t-SNE of the same points (slower than PCA)")


class TuningSpec(BaseModel):
    """Every tuned method gets a grid of the same number of trials, scored on validation only
    (clients' val splits + OOD from other clients' val splits) over the tuning seeds, which must not
    be evaluation seeds. Ablations and multi-exit take their parent's pick (they are defined by one
    switch relative to it), so they have no grid of their own."""

    model_config = ConfigDict(extra="forbid")

    seeds: list[int] = Field(min_length=1)
    settings: list[str] | None = Field(default=None, description="None = every setting")
    grids: dict[str, list[dict[str, Any]]] = Field(min_length=1)
    per_setting: bool = Field(
        default=False,
        description="each setting gets the trial that scores best on its own validation runs "
        "(then every setting is a tuning setting); else one pick over all tuning settings",
    )

    @model_validator(mode="after")
    def _same_number_of_trials(self) -> TuningSpec:
        sizes = {method: len(trials) for method, trials in self.grids.items()}
        if len(set(sizes.values())) != 1 or 0 in sizes.values():
            raise ValueError(f"every tuned method needs the same (non-zero) number of trials; got {sizes}")
        return self

    @property
    def trials(self) -> int:
        return len(next(iter(self.grids.values())))


class BudgetCheck(BaseModel):
    """Is each listed method's budget where it stops improving? Each method's tuned config is
    trained for its budget's rounds in a setting and for each longer budget (`rounds`, or `times`
    its own rounds), on `settings` (unset: the tuning settings) and `seeds`, and scored on
    validation only; it has stopped improving when
    no longer budget gains `tolerance` or more, judged per setting (a partition may need longer than
    the one tuned on). The seeds are neither evaluation nor tuning seeds: on a tuning seed the
    budget's own score is the best of the trials, which biases the check towards "stopped"."""

    model_config = ConfigDict(extra="forbid")

    methods: list[str] = Field(min_length=1)
    rounds: list[int] | None = Field(
        default=None, min_length=1, description="the longer budgets (rounds) to compare with"
    )
    times: list[int] | None = Field(
        default=None,
        min_length=1,
        description="or the longer budgets as multiples of each method's own rounds in each setting",
    )
    seeds: list[int] = Field(min_length=1, description="validation-only seeds (not tuning, not evaluation)")
    tolerance: float = Field(default=0.01, ge=0, description="validation accuracy with OOD, fraction")
    settings: list[str] | None = Field(default=None, description="setting names; unset: the tuning settings")

    @model_validator(mode="after")
    def _rounds_or_times(self) -> BudgetCheck:
        if (self.rounds is None) == (self.times is None):
            raise ValueError("budget_check: give the longer budgets as exactly one of rounds or times")
        if self.times is not None and min(self.times) < 2:
            raise ValueError(f"budget_check: times {self.times} must be 2 or more")
        return self

    def longer_rounds(self, budget_rounds: int) -> list[int]:
        """The rounds a method whose budget is `budget_rounds` is compared with."""
        return self.rounds if self.rounds is not None else [t * budget_rounds for t in self.times]


class MechanismStudy(BaseModel):
    """The target method and its ablations on seeds of their own. Turning one mechanism off moves
    accuracy by a few points, which the evaluation's seeds may not resolve; more seeds for every
    method would cost the baselines' runs too. Like tuning and the budget check, a study: its runs
    are reported in a section of their own and decide the mechanism targets, and a profile whose
    records are committed reads them back. At the evaluation seeds the target method's runs are the
    evaluation's own."""

    model_config = ConfigDict(extra="forbid")

    seeds: list[int] = Field(min_length=2)
    methods: list[str] = Field(min_length=1, description="ablations named in targets.ablations")


class ConvergenceCheck(BaseModel):
    """The report fails its convergence line unless `method` reaches `min_accuracy` without OOD on
    every setting of the named datasets: an upper bound that did not converge bounds nothing."""

    model_config = ConfigDict(extra="forbid")

    method: str = "centralized"
    datasets: list[str] = ["mnist5k"]
    min_accuracy: float = Field(default=0.95, gt=0, le=1)


class Targets(BaseModel):
    model_config = ConfigDict(extra="forbid")

    method: str = "harmony"
    baselines: list[str] = Field(
        default_factory=list, description="HARMONY with OOD must beat the best of these by `margin`"
    )
    margin: float = Field(default=0.05, ge=0, description="accuracy with OOD, fraction (0.05 = 5 points)")
    reference: str = "centralized"
    fraction_of_reference: float = Field(default=0.9, gt=0, le=1)
    ablations: dict[str, str] = Field(
        default_factory=dict, description="ablation method -> the mechanism it turns off"
    )
    confidence: float = Field(default=0.95, gt=0, lt=1)


class LatencySpec(BaseModel):
    """Expected time per query = exit rate * t_device + fallback rate * (t_device + RTT + t_server),
    t_device = measured median batch-1 latency of the tier's .pte, t_server = measured median batch-1
    time of the back-end g, RTT stated."""

    model_config = ConfigDict(extra="forbid")

    rtt_ms: float = Field(default=50.0, ge=0, description="stated network round trip")
    quantization: Literal["fp32", "int8"] = "fp32"
    runs: int = Field(default=50, ge=5, description="timed calls per measurement (median)")
    method: str = Field(default="harmony", description="whose front-ends are exported and timed")


class BenchProfile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    seeds: list[int] = Field(min_length=1)
    settings: list[Setting] = Field(min_length=1)
    methods: list[str] = Field(min_length=1)
    budget: Budget
    budgets: dict[str, Budget] = Field(
        default_factory=dict, description="a method's own stated budget instead of the shared one"
    )
    train: dict[str, Any] = Field(
        default_factory=dict,
        description="other TrainConfig fields shared by every run (clients_per_tier, ...)",
    )
    algorithm_config: dict[str, dict[str, Any]] = Field(default_factory=dict)
    tuning: TuningSpec | None = None
    budget_check: BudgetCheck | None = None
    mechanism_study: MechanismStudy | None = None
    convergence: ConvergenceCheck | None = None
    targets: Targets | None = None
    latency: LatencySpec | None = None
    pca: PcaSpec = PcaSpec()
    time_limit_minutes: float | None = None
    time_goal_covers: Literal["all", "evaluation"] = Field(
        default="all",
        description="the runs the time goal covers: every run, or the evaluation runs alone when the "
        "studies' records (tuning, budget check, mechanism study) are committed and read back instead "
        "of rerun",
    )
    notes: str = Field(default="", description="markdown appended to the report (what was tuned and how)")

    @model_validator(mode="after")
    def _known_methods(self) -> BenchProfile:
        named = [*self.methods, *self.algorithm_config, *self.budgets]
        named += [method for setting in self.settings for method in setting.method_rounds]
        if self.tuning:
            named += list(self.tuning.grids)
        for method in named:
            check_algorithm(method)  # unknown or renamed: a clear error naming the right method
        _refuse_repeats("", seeds=self.seeds, methods=self.methods, settings=[s.name for s in self.settings])
        self._check_algorithm_configs()
        reserved = {
            "dataset",
            "data_root",
            "dataset_limit",
            "partition",
            "alpha",
            "rounds",
            "seed",
            "algorithm",
        }
        if reserved & set(self.train):
            raise ValueError(f"train: {sorted(reserved & set(self.train))} are set by settings/budget/seeds")
        self._check_tuning()
        self._check_mechanism_study()  # before the decay check, which reads the study's methods
        self._check_decay()
        self._check_budget_check()
        return self

    def _check_algorithm_configs(self) -> None:
        """Every method's entry, run or not, is a valid config of it that leaves the setting its
        variant is defined by alone (the variant's value would win, and the record would misstate it)."""
        for method, entry in self.algorithm_config.items():
            fixed = ALGORITHMS[method][1]
            clash = sorted(key for key in entry if key in fixed and entry[key] != fixed[key])
            if clash:
                values = ", ".join(f"{key} = {fixed[key]!r}" for key in clash)
                raise ValueError(f"algorithm_config.{method}: {method} is defined by {values}; leave it out")
            try:
                build_algorithm(method, entry)
            except ValidationError as error:
                problems = "; ".join(_setting_problem(method, item) for item in error.errors())
                raise ValueError(f"algorithm_config.{method}: {problems}") from None

    def check_names(self) -> None:
        """The methods and settings `targets` and `pca` name are the profile's own (a misspelt one
        would silently drop a target or the feature plot). Checked on the whole profile, before
        --methods or --settings narrow it."""
        targets = self.targets
        if targets is not None:
            # only what the profile names: the default reference need not be run (then its target is not judged)
            given = [getattr(targets, f) for f in ("method", "reference") if f in targets.model_fields_set]
            named = [*given, *targets.baselines, *targets.ablations]
            unknown = [m for m in dict.fromkeys(named) if m not in [*self.methods, *self.studied_methods]]
            if unknown:
                raise ValueError(f"targets: {unknown} are not methods of this profile ({self.methods})")
        for section in (self.latency, self.convergence):
            if (
                section is not None
                and "method" in section.model_fields_set
                and section.method not in self.methods
            ):
                raise ValueError(
                    f"{type(section).__name__}: {section.method!r} is not a method of this profile"
                )
        pca = self.pca
        if pca.setting is not None:
            self.settings_named([pca.setting])
        if "methods" in pca.model_fields_set:
            unknown = [m for m in pca.methods if m not in self.methods]
            if unknown:
                raise ValueError(f"pca: {unknown} are not methods of this profile ({self.methods})")
        if pca.seed is not None and pca.seed not in self.seeds:
            raise ValueError(f"pca: seed {pca.seed} is not an evaluation seed of this profile {self.seeds}")

    def _check_budget_check(self) -> None:
        check = self.budget_check
        if check is None:
            return
        if self.tuning is None:
            raise ValueError("budget_check trains each method's tuned pick: it needs a tuning section")
        _refuse_repeats(
            "budget_check: ",
            methods=check.methods,
            rounds=check.rounds or [],
            times=check.times or [],
            seeds=check.seeds,
            settings=check.settings or [],
        )
        self.budget_check_settings()  # a ValueError naming an unknown setting
        unevaluated = [m for m in check.methods if m not in self.methods]
        if unevaluated:
            raise ValueError(f"budget_check: {unevaluated} are not methods of this profile")
        for method in check.methods:
            check_algorithm(method)
            for setting in self.budget_check_settings():
                base, *longer = self.checked_rounds(method, setting)
                shorter = [r for r in longer if r <= base]
                if shorter:
                    raise ValueError(
                        f"budget_check: rounds {shorter} are not longer than {method}'s budget "
                        f"in {setting.name} ({base} rounds)"
                    )
        shared = set(check.seeds) & set(self.seeds + self.tuning.seeds)
        if shared:
            raise ValueError(
                f"budget_check seeds {sorted(shared)} are evaluation or tuning seeds; check on other seeds"
            )

    def _check_mechanism_study(self) -> None:
        study = self.mechanism_study
        if study is None:
            return
        _refuse_repeats("mechanism_study: ", seeds=study.seeds, methods=study.methods)
        if self.targets is None or self.targets.method not in self.methods:
            raise ValueError(
                "mechanism_study: it studies the targets' method, which must be a method of the profile"
            )
        for method in study.methods:
            check_algorithm(method)
        not_ablations = [m for m in study.methods if m not in self.targets.ablations]
        if not_ablations:
            raise ValueError(f"mechanism_study: {not_ablations} are not ablations named in targets.ablations")
        evaluated = [m for m in study.methods if m in self.methods]
        if evaluated:
            raise ValueError(
                f"mechanism_study: {evaluated} are evaluation methods too; name each in one place"
            )
        missing = [seed for seed in self.seeds if seed not in study.seeds]
        if missing:  # the study pairs the ablations with the target method's evaluation runs
            raise ValueError(f"mechanism_study: seeds must include every evaluation seed; {missing} missing")
        validation = set(self.tuning.seeds if self.tuning else []) | set(
            self.budget_check.seeds if self.budget_check else []
        )
        if validation & set(study.seeds):
            raise ValueError(
                f"mechanism_study seeds {sorted(validation & set(study.seeds))} are tuning or budget-check seeds"
            )

    @property
    def tunes_per_setting(self) -> bool:
        """Whether each setting gets its own tuning pick (`{setting: {method: values}}`)."""
        return self.tuning is not None and self.tuning.per_setting

    @property
    def studied_methods(self) -> list[str]:
        """The ablations only the mechanism study runs (none without one)."""
        return self.mechanism_study.methods if self.mechanism_study else []

    def mechanism_profile(self) -> BenchProfile | None:
        """The study as the runs of a profile: the target method and its ablations at the study's seeds."""
        study = self.mechanism_study
        if study is None:
            return None
        methods = [self.targets.method, *study.methods]
        return self.model_copy(update={"seeds": study.seeds, "methods": methods, "mechanism_study": None})

    def _check_decay(self) -> None:
        """A learning-rate decay must span each run's own rounds: shorter wastes the last rounds at
        rate ~0, longer stops before the rate is low. A fixed `decay_rounds` (a method's own entry or
        its parent's) must therefore equal its budget's rounds and stay out of the budget check's
        longer runs; under a cosine `lr_schedule` the budget sets it for every run."""
        checked = self.budget_check.methods if self.budget_check else []
        for method in dict.fromkeys([*self.algorithm_config, *self.methods, *self.studied_methods]):
            own = self.algorithm_config.get(method, {})
            decay = {**self.algorithm_config.get(parent_method(method), {}), **own}.get("decay_rounds")
            if decay is None:
                continue
            for budget in self.all_budgets(method):
                if budget.lr_schedule == "cosine":
                    raise ValueError(
                        f"{method}: decay_rounds is set by its budget's lr_schedule; leave it out"
                    )
                if decay != budget.rounds:
                    raise ValueError(
                        f"{method}: decay_rounds {decay} must equal its budget's rounds ({budget.rounds})"
                    )
            if method in checked:
                raise ValueError(
                    f"budget_check: {method}'s decay_rounds is tied to its budget's rounds; "
                    "a budget lr_schedule follows each run's rounds"
                )
        tuned = [
            m
            for m, trials in (self.tuning.grids if self.tuning else {}).items()
            if any("decay_rounds" in t for t in trials)
        ]
        if tuned:
            raise ValueError(f"tuning: {tuned} try decay_rounds, which follows the budget (lr_schedule)")

    def _check_tuning(self) -> None:
        if self.tuning is None:
            return
        _refuse_repeats("tuning: ", seeds=self.tuning.seeds, settings=self.tuning.settings or [])
        shared = set(self.tuning.seeds) & set(self.seeds)
        if shared:
            raise ValueError(f"tuning seeds {sorted(shared)} are also evaluation seeds; tune on other seeds")
        names = {s.name for s in self.settings}
        unknown = [s for s in self.tuning.settings or [] if s not in names]
        if unknown:
            raise ValueError(f"tuning settings {unknown} are not settings of this profile")
        derived = [m for m in self.tuning.grids if parent_method(m) != m]
        if derived:
            raise ValueError(
                f"{derived} take their parent's tuned values ({', '.join(parent_method(m) for m in derived)}); "
                "tune the parent instead"
            )
        if self.tunes_per_setting and len(self.tuning_settings()) < len(self.settings):
            raise ValueError("tuning.per_setting picks a trial in every setting: leave tuning.settings unset")
        for method, trials in self.tuning.grids.items():
            self._refuse_repeated_trials(method, trials)

    def _refuse_repeated_trials(self, method: str, trials: list[dict[str, Any]]) -> None:
        """Every trial is a valid config of `method` (refused at load, not when its run starts), and
        equal trial counts are only fair when the trials differ: a trial spelling out a default
        (`lr` at the method's own default) trains what `{}` trains."""
        seen: dict[str, int] = {}
        for index, trial in enumerate(trials):
            try:
                config = build_algorithm(method, self._config(method, {method: trial})).config
            except ValidationError as error:
                problems = "; ".join(_setting_problem(method, item) for item in error.errors())
                raise ValueError(f"tuning.grids.{method}: trial {index} {trial}: {problems}") from None
            key = config.model_dump_json()
            if key in seen:
                raise ValueError(
                    f"tuning.grids.{method}: trial {index} {trial} trains what trial {seen[key]} "
                    f"{trials[seen[key]]} trains (defaults included); each trial must try something else"
                )
            seen[key] = index

    def method_budget(self, method: str, setting: Setting | None = None) -> Budget:
        """`method`'s budget (its own, else its parent's, else the shared one: HARMONY's ablations
        train as long as HARMONY), with the rounds `setting` gives it or its parent, if any."""
        budget = own_or_parents(method, self.budgets) or self.budget
        rounds = setting and own_or_parents(method, setting.method_rounds)
        return budget.model_copy(update={"rounds": rounds}) if rounds else budget

    def checked_rounds(self, method: str, setting: Setting) -> list[int]:
        """The budget check's rounds for `method` in `setting`: its budget's, then each longer one."""
        base = self.method_budget(method, setting).rounds
        return [base, *self.budget_check.longer_rounds(base)]

    def all_budgets(self, method: str) -> list[Budget]:
        """The distinct budgets `method` trains for across the profile's settings."""
        return list(
            {b.model_dump_json(): b for b in (self.method_budget(method, s) for s in self.settings)}.values()
        )

    def method_config(
        self,
        method: str,
        tuned: dict[str, dict[str, Any]] | None = None,
        rounds: int | None = None,
        setting: Setting | None = None,
    ) -> dict[str, Any]:
        """The algorithm config of `method` under its budget in `setting`, with the values tuning
        picked for it (or for its parent) on top of the profile's fixed ones. `tuned`: the tuning's
        picks, `{method: values}`, or `{setting name: {method: values}}` when the profile tunes per
        setting. `rounds`: the run's, when not its budget's (a budget check), which a cosine schedule
        decays over."""
        return self._config(method, self.picks_in(tuned, setting), rounds, setting)

    def picks_in(self, tuned: dict | None, setting: Setting | None) -> dict[str, dict[str, Any]]:
        """The tuned values of each method in `setting`: `{method: values}`."""
        if not tuned or not self.tunes_per_setting:
            return tuned or {}
        if setting is None:
            raise ValueError(f"profile {self.name!r} tunes per setting: a method's config needs the setting")
        if setting.name not in tuned:  # e.g. a setting added to the profile after its tuning ran
            raise ValueError(
                f"profile {self.name!r} has no tuning pick in setting {setting.name!r}: run its tuning"
            )
        return tuned[setting.name]

    def _config(
        self,
        method: str,
        picks: dict[str, dict[str, Any]],
        rounds: int | None = None,
        setting: Setting | None = None,
    ) -> dict[str, Any]:
        budget = self.method_budget(method, setting)
        per_step = budget.samples_per_step
        config: dict[str, Any] = {
            "local_steps": budget.local_steps,
            "batch_size": per_step // 2 if is_harmony(method) else per_step,
        }
        if budget.lr_schedule == "cosine":
            config["decay_rounds"] = rounds or budget.rounds
        parent = parent_method(method)
        inherited = {**self.algorithm_config.get(parent, {}), **picks.get(parent, {})}
        if method == "multi-exit":
            inherited.pop("mix_lambda", None)
        config.update(inherited)
        if parent != method:
            config.update(self.algorithm_config.get(method, {}))
        return config

    def settings_named(self, names: list[str]) -> list[Setting]:
        """The profile's settings called `names`, in that order; a ValueError naming every unknown one."""
        known = {s.name: s for s in self.settings}
        unknown = [name for name in names if name not in known]
        if unknown:
            raise ValueError(f"settings {unknown} are not in profile {self.name!r}; it has {sorted(known)}")
        return [known[name] for name in names]

    def budget_check_settings(self) -> list[Setting]:
        check = self.budget_check
        if check is None:
            return []
        if check.settings is None:
            return self.tuning_settings()
        self.settings_named(check.settings)  # a ValueError naming an unknown setting
        return [s for s in self.settings if s.name in check.settings]  # in the profile's order

    def tuning_settings(self) -> list[Setting]:
        if self.tuning is None:
            return []
        wanted = self.tuning.settings
        return [s for s in self.settings if wanted is None or s.name in wanted]


SLOT_GATE_SUFFIX = "-slot-gate"  # a variant that differs only in exiting by slot_margin


def is_harmony(method: str) -> bool:
    """Also for a retired HARMONY variant's name, which older results hold (their reports still render)."""
    if method in RENAMED:
        return method.startswith("harmony")
    return ALGORITHMS[method][0] is Harmony


def _refuse_repeats(section: str, **named: list) -> None:
    """Two runs of one list's repeated entry would share one run folder."""
    for name, values in named.items():
        if len(set(values)) != len(values):
            raise ValueError(f"{section}{name} {values} repeat an entry")


def _setting_problem(method: str, item: dict) -> str:
    """One pydantic error of a method's config: the setting, what is wrong, the value given."""
    where = ".".join(str(part) for part in item["loc"])
    if item["type"] == "extra_forbidden":
        return f"{where}: not a setting of {method}"
    message = item["msg"].removeprefix("Value error, ")
    return f"{where}: {message} (got {item['input']!r})" if where else message  # a check of the whole config


def parent_method(method: str) -> str:
    """The method whose hyper-parameters `method` inherits: HARMONY for its ablations, SplitGP for
    multi-exit, a method for its slot-gate variant (which trains alike), itself otherwise."""
    if method.endswith(SLOT_GATE_SUFFIX):
        return parent_method(method.removesuffix(SLOT_GATE_SUFFIX))
    if is_harmony(method):
        return "harmony"
    if method == "multi-exit":
        return "splitgp"
    return method


def own_or_parents(method: str, by_method: dict[str, Any]) -> Any:
    """`by_method`'s entry for `method`, else for its parent (None if neither has one): a budget or
    a setting's rounds given to HARMONY is its ablations' too."""
    return next((by_method[m] for m in (method, parent_method(method)) if m in by_method), None)


def load_profile(name_or_path: str | Path) -> BenchProfile:
    """A profile by name (benchmarks/configs/<name>.yaml) or by path to a YAML file."""
    path = Path(name_or_path)
    if not path.suffix:
        path = CONFIG_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")) if CONFIG_DIR.is_dir() else []
        raise FileNotFoundError(f"no benchmark profile {name_or_path!r} ({path}); known: {', '.join(known)}")
    data = read_yaml(path, "benchmark profile") or {}
    if not isinstance(data, dict):
        raise ValueError(f"benchmark profile {path} must hold a mapping of profile fields")
    if (data.get("budget_check") or {}).get("settings") == []:  # only a narrowed profile checks none
        raise ValueError(f"{path}: budget_check settings is empty; leave it out to check the tuning settings")
    train = data.get("train") or {}
    if train.get("tiers_file"):
        # a profile names its tiers file relative to itself, so it runs from any working directory;
        # the absolute path enters every run's config (`--resume` compares it by its name in
        # benchmarks/configs, so a work dir made in another checkout is read back too)
        train["tiers_file"] = str((path.parent / Path(train["tiers_file"]).expanduser()).resolve())
    profile = BenchProfile(**data)
    profile.check_names()
    return profile


def repo_relative(train: dict) -> dict:
    """The shared settings with a tiers file of the repository named relative to it (the profile
    resolves it to an absolute path on the machine that ran it, maybe in another checkout)."""
    tiers_file = Path(train.get("tiers_file") or "")
    if tiers_file.is_relative_to(REPO_ROOT):
        return {**train, "tiers_file": str(tiers_file.relative_to(REPO_ROOT))}
    ours = REPO_ROOT / "benchmarks" / "configs" / tiers_file.name
    if tiers_file.parent.parts[-2:] == ("benchmarks", "configs") and ours.is_file():  # another checkout's
        return {**train, "tiers_file": str(ours.relative_to(REPO_ROOT))}
    return train
