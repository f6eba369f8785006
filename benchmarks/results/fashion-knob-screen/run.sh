#!/bin/sh
# Each variant's 4 runs (2 settings x seeds 101, 102), 2 at a time; --resume reads finished runs back.
set -e
cd "$(dirname "$0")"
for variant in "$@"; do
  harmony bench --profile "profiles/$variant.yaml" --jobs 2 --resume \
    --work-dir "work-$variant" --out "reports/$variant"
done
