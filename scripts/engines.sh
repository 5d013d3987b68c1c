#!/usr/bin/env bash
# Builds, once per machine, the pinned Spark with Delta's and Iceberg's own connectors that the engine tests read
# the sink's tables with (tests/support/engines_env.py: pyspark in a virtual environment of its own, the connectors'
# jars fetched with Maven). A second call finds it built and only prints it. The tests build it themselves when it
# is missing (and are skipped, with the failed command and its answer, when it cannot be built); this script does
# it ahead, and prints the pins and what the build cost (seconds, bytes).
# Usage: bash scripts/engines.sh   (FILESINK_ENGINES_CACHE=/dir puts it elsewhere than ~/.cache/filesink-tests)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${FILESINK_VENV:-$repo/.venv}"
python_bin="$venv/bin/python"
[ -x "$python_bin" ] || python_bin="${PYTHON:-python3}"
exec "$python_bin" "$repo/tests/support/engines_env.py"
