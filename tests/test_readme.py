"""README.md stays an entry page: short enough to read, and every link in it (the reports its
numbers come from, the documents it points to) names a file that exists in the checkout."""

from __future__ import annotations

import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
README = REPO_ROOT / "README.md"
MAX_LINES = 200  # detail belongs in docs/ and benchmarks/results/README.md


def test_the_readme_is_at_most_two_hundred_lines():
    assert len(README.read_text().splitlines()) <= MAX_LINES


def test_every_relative_link_in_the_readme_names_an_existing_file():
    targets = re.findall(r"\]\(([^)#\s]+)", README.read_text())
    local = [t for t in targets if "://" not in t]
    assert local, "the README links no report"
    missing = [t for t in local if not (REPO_ROOT / t).exists()]
    assert not missing, missing
