"""`make bench-fashion` goes on from the run records committed in its work dir: every record there
that one of its profiles would read back must be a run of that profile's configuration, or the
command stops before training (a record is never deleted). Checked without training: the stages'
run specs are built from the profiles and the tuning records, as the benchmark builds them."""

import json
import re
import shlex
from pathlib import Path

import pytest

from harmony_mobile.bench.profile import REPO_ROOT, load_profile
from harmony_mobile.bench.runner import (
    RECORD,
    budget_specs,
    check_recorded,
    evaluation_specs,
    pick_trials,
    runs_whose_files_the_report_reads,
    study_specs,
    tuning_specs,
)


def bench_fashion_invocations() -> list[tuple[str, Path, bool]]:
    """(profile, work dir, whether it resumes) of each `harmony bench` line of the Makefile's
    bench-fashion recipe."""
    recipe = re.search(r"^bench-fashion:.*\n((?:\t.*\n)+)", (REPO_ROOT / "Makefile").read_text(), re.M)
    assert recipe, "the Makefile has no bench-fashion recipe"
    invocations = []
    for line in recipe.group(1).splitlines():
        words = shlex.split(line)
        if "bench" in words and "--profile" in words:
            profile = words[words.index("--profile") + 1]
            work_dir = REPO_ROOT / words[words.index("--work-dir") + 1]
            invocations.append((profile, work_dir, "--resume" in words))
    return invocations


INVOCATIONS = bench_fashion_invocations()
PROFILES = [(profile, work_dir) for profile, work_dir, _ in INVOCATIONS]


def test_the_recipe_runs_the_recurring_profile_first_and_every_profile_with_resume():
    assert INVOCATIONS[0][0] == "fashion"
    assert all(work_dir.is_dir() and resumes for _, work_dir, resumes in INVOCATIONS)


def recorded(specs, work_dir: Path) -> list[dict] | None:
    files = [spec.path(work_dir) / RECORD for spec in specs]
    if not all(f.is_file() for f in files):
        return None  # a stage not finished yet: the benchmark trains the rest
    return [json.loads(f.read_text()) for f in files]


@pytest.mark.parametrize("profile_name,work_dir", PROFILES, ids=[name for name, _ in PROFILES])
def test_every_committed_record_a_profile_reads_back_is_a_run_of_its_configuration(profile_name, work_dir):
    profile = load_profile(profile_name)
    specs = tuning_specs(profile)
    check_recorded(specs, profile.train, work_dir, None, resume=True)
    records = recorded(specs, work_dir)
    if profile.tuning is not None and records is None:
        pytest.skip(f"{profile_name}: its tuning records are not all committed; later stages follow them")
    tuned = pick_trials(profile, specs, records)[0] if profile.tuning is not None else {}
    evaluated = evaluation_specs(profile, tuned)
    studied = study_specs(profile, tuned, runs_whose_files_the_report_reads(profile), evaluated)
    later = evaluated + studied + budget_specs(profile, tuned)
    check_recorded(later, profile.train, work_dir, None, resume=True)
