"""The streaming query's id, read from its checkpoint: how a sink under Spark Connect tells its query's batches
from another query's.

In classic PySpark the sink reads the id from the Spark local property Spark sets for ``foreachBatch``. Under
Spark Connect the server's ``foreachBatch`` process runs in a session of its own, where that property is not
set; given ``checkpoint_location``, the sink reads the id Spark keeps in ``<checkpoint>/metadata`` (one JSON
line, ``{"id": "..."}``, written when the query first starts and never changed).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from logstore.diagnosis import told
from logstore.storage import open_filesystem

from ..errors import SinkOptionError

HADOOP_SCHEMES = {"s3a": "s3", "s3n": "s3"}
"""Hadoop's names for S3 in a checkpointLocation, and fsspec's."""


def fsspec_url(location: str) -> str:
    scheme, sep, rest = location.partition("://")
    return f"{HADOOP_SCHEMES.get(scheme, scheme)}://{rest}" if sep else location


def checkpoint_query_id(location: str, storage_options: Mapping[str, Any]) -> str:
    """The query id in the checkpoint at ``location``; :class:`SinkOptionError` if there is none to read."""
    fs, root = open_filesystem(fsspec_url(location), storage_options)
    path = root.rstrip("/") + "/metadata"
    try:
        with fs.open(path, "rb") as f:
            text = f.read().decode("utf-8", errors="replace")
        query_id = json.loads(text.splitlines()[0])["id"]
    except FileNotFoundError:
        raise SinkOptionError(
            f"checkpoint_location {location} has no metadata file ({path}), so it is not the checkpoint of a "
            "started streaming query. Nothing was written. Give the sink the query's own checkpointLocation (the "
            "one passed to .option('checkpointLocation', ...))."
        ) from None
    except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
        raise SinkOptionError(
            f"could not read the query id from {path} (checkpoint_location {location}): {told(e)}. Nothing was "
            "written. Check that checkpoint_location is the query's checkpointLocation and readable with the "
            "sink's storage_options."
        ) from None
    if not isinstance(query_id, str) or not query_id:
        raise SinkOptionError(f"{path} (checkpoint_location {location}) holds no query id: {text[:200]!r}")
    return query_id
