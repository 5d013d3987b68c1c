"""The query id read from a Spark checkpoint's ``metadata`` file (how a sink under Spark Connect knows its query),
on local disk and on a real S3 server under Hadoop's ``s3a://`` name."""

from __future__ import annotations

import json

import fsspec
import pytest

from filesink.errors import SinkOptionError
from filesink.sink.checkpoint import checkpoint_query_id, fsspec_url

QUERY_ID = "6f1c2a34-9b7e-4c1d-8a2f-0e5d4b3c2a19"


def test_the_id_spark_wrote_is_read(tmp_path):
    (tmp_path / "metadata").write_text(json.dumps({"id": QUERY_ID}) + "\n")
    assert checkpoint_query_id(str(tmp_path), {}) == QUERY_ID
    assert checkpoint_query_id(f"file://{tmp_path}/", {}) == QUERY_ID


def test_a_directory_that_is_no_checkpoint_is_refused_naming_it(tmp_path):
    with pytest.raises(SinkOptionError, match="no metadata file") as e:
        checkpoint_query_id(str(tmp_path / "elsewhere"), {})
    assert str(tmp_path / "elsewhere") in str(e.value) and "checkpointLocation" in str(e.value)
    (tmp_path / "metadata").write_text("not json")
    with pytest.raises(SinkOptionError, match="could not read the query id"):
        checkpoint_query_id(str(tmp_path), {})
    (tmp_path / "metadata").write_text(json.dumps({"id": ""}))
    with pytest.raises(SinkOptionError, match="holds no query id"):
        checkpoint_query_id(str(tmp_path), {})


def test_hadoop_s3_names_are_read_with_s3fs(s3_prefix, s3_options):
    assert fsspec_url("s3a://bucket/cp") == "s3://bucket/cp" and fsspec_url("/a/b") == "/a/b"
    fs = fsspec.filesystem("s3", **s3_options)
    fs.pipe(f"{s3_prefix.removeprefix('s3://')}/cp/metadata", json.dumps({"id": QUERY_ID}).encode())
    assert checkpoint_query_id(s3_prefix.replace("s3://", "s3a://", 1) + "/cp", s3_options) == QUERY_ID
