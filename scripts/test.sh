#!/usr/bin/env bash
# Set everything up on a fresh machine and run the checks and the default test tier.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m chaos` for the long campaigns.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/setup.sh" "[test]"
echo "==> ruff"
ruff check logstore filesink recovery tests
ruff format --check logstore filesink recovery tests
echo "==> mypy"
mypy
echo "==> pytest"
status=0
# Three test processes on two cores (pytest-xdist; FILESINK_TEST_WORKERS sets another number): most tests wait on
# Spark, S3 and subprocesses rather than on the CPU, which the default tier keeps about half idle with two.
# Tests are handed out one at a time (--maxschedchunk 1), so no process holds a queue of long tests
# while another is idle (or waits in the failpoint coverage test, which runs last).
# The 30 slowest tests are listed at the end, to keep the default tier's time in view.
python -m pytest -n "${FILESINK_TEST_WORKERS:-3}" --maxschedchunk 1 -m "not chaos" --durations=30 "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "error: pytest collected no tests" >&2
fi
exit "$status"
