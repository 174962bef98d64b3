#!/usr/bin/env bash
# Applies the mutants listed in scripts/mutants.py one at a time and reports which the tests kill.
#   scripts/mutants.sh [--only M1 M2 ...] [--markdown]
set -euo pipefail
exec python3 "$(dirname "$0")/mutants.py" "$@"
