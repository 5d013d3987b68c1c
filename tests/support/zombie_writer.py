"""A file writer run as its own process, so that a test can pause it (SIGSTOP) and resume it later.

Usage: python zombie_writer.py TASK_PICKLE

Unpickles ``(output, task)`` and runs ``write_file`` on it, as a Spark task would. Exit 0 and ``published``
when the file became visible; exit 3 and ``fenced: <message>`` when the writer was fenced.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

from helpers import support_env

from filesink.errors import FencedError
from filesink.tasks.writer import write_file


def start(task_file: Path, output: Any, task: Any, failpoints: str) -> subprocess.Popen[str]:
    """Pickle ``(output, task)`` to ``task_file`` and run this script on it with ``failpoints`` configured."""
    from logstore.failpoints import ENV_VAR

    task_file.write_bytes(pickle.dumps((output, task)))
    here = Path(__file__)
    env = support_env(**{ENV_VAR: failpoints})
    return subprocess.Popen(
        [sys.executable, str(here), str(task_file)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def main() -> int:
    with open(sys.argv[1], "rb") as f:
        output, task = pickle.load(f)
    try:
        write_file(output, task)
    except FencedError as e:
        print(f"fenced: {e}", flush=True)
        return 3
    print("published", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
