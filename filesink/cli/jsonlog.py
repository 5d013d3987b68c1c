"""``filesink run --log-format json``: one JSON object per line on stdout, for log shippers.

Events: ``batch`` and ``roll`` (:func:`filesink.metrics.figures.event_record`), and ``notice`` for what the run says in
text mode on stdout (recovery at start, the metrics' URL, the summary at the end: ``{"event": "notice",
"message": ...}``). Nothing else goes to stdout in this mode; the progress display and errors stay on stderr.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any, TextIO

_lock = threading.Lock()


def write(record: dict[str, Any], stream: TextIO | None = None) -> None:
    """Write ``record`` as one line of JSON (with ``time``, Unix seconds, first), whole even from several threads."""
    line = json.dumps({"time": round(time.time(), 3), **record}, separators=(",", ":"), default=str)
    target = stream if stream is not None else sys.stdout
    with _lock:
        target.write(line + "\n")
        target.flush()


def notice(text: str) -> None:
    """What text mode prints as a line on stdout, as a ``notice`` event."""
    write({"event": "notice", "message": text})
