#!/usr/bin/env bash
# The main job from a fresh clone: set up, start a local zbk cluster on embedded metadata,
# run a sample workload (write, read back, print the numbers), stop everything.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m zbk.demo "$@"
