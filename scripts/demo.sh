#!/usr/bin/env bash
# Set everything up on a fresh machine and run the example job on the embedded default (local directories).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/setup.sh" "[demo]"
echo "==> running the example streaming job"
exec python -m filesink demo "$@"
