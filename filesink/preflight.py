"""Checks ``filesink run`` makes before it starts Spark, so that bad input fails in seconds with a message that
names the file, directory or endpoint, and before anything is written.

- :func:`check_input`: the landing directory exists and each file in it can be read; Parquet footers are read
  and their schemas compared with each other.
- :func:`check_s3`: an ``s3://`` location's endpoint answers, accepts the credentials and has the bucket.
- :func:`check_master`: a ``spark://`` master accepts connections.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .errors import InputError, SparkMasterError, StorageAccessError

FORMATS = ("parquet", "json", "csv")


def input_files(directory: Path) -> list[Path]:
    """The files Spark's file source reads from ``directory``: recursively, skipping names that start with
    ``.`` or ``_`` (hidden files, ``_SUCCESS``, ``_spark_metadata``) and the files under such directories."""
    found = []
    for root, dirs, names in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        found += [Path(root) / n for n in sorted(names) if not n.startswith((".", "_"))]
    return found


def check_input(directory: Path, fmt: str) -> list[Path]:
    """Raise :class:`InputError` unless ``directory`` is a readable directory whose files are all readable as
    ``fmt`` (Parquet: a valid footer, and one schema across files). Returns the files found (maybe none)."""
    import pyarrow.parquet as pq

    if fmt not in FORMATS:
        raise InputError(f"unknown input format {fmt!r}: use one of {', '.join(FORMATS)}")
    if not directory.exists():
        raise InputError(f"the input directory {directory} does not exist: create it, or check the --input path")
    if not directory.is_dir():
        raise InputError(f"the input {directory} is a file, not a directory: give the directory files land in")
    if not os.access(directory, os.R_OK | os.X_OK):
        raise InputError(f"the input directory {directory} cannot be read (permission denied)")
    files = input_files(directory)
    first: tuple[Path, Any] | None = None
    for path in files:
        try:
            with open(path, "rb") as f:
                f.read(1)
        except OSError as e:
            raise InputError(
                f"the input file {path} cannot be read: {e.strerror or e}. Fix its permissions or move it out "
                "of the input directory; nothing has been read or written yet."
            ) from e
        if fmt != "parquet":
            continue
        try:
            schema = pq.read_schema(path)
        except Exception as e:
            raise InputError(
                f"the input file {path} is not a readable Parquet file ({e}). Move it out of the input directory "
                "(or fix it) and run again; nothing has been read or written yet."
            ) from e
        if first is None:
            first = (path, schema)
        elif not schema.equals(first[1]):
            raise InputError(
                f"schema mismatch in the input: {path} has {_describe(schema)}, but {first[0]} has "
                f"{_describe(first[1])}. A sink keeps one schema: move the odd files to another input directory."
            )
    return files


def _describe(schema: Any) -> str:
    return "(" + ", ".join(f"{f.name} {f.type}" for f in schema) + ")"


def check_s3(url: str, storage_options: Mapping[str, Any], what: str) -> None:
    """Raise :class:`StorageAccessError` unless the bucket of ``url`` can be listed with ``storage_options``.

    ``what`` names the location in the message (``output``, ``log store``). The secret key never appears in
    a message; the access key id is shown shortened."""
    import botocore.exceptions
    import fsspec

    from logstore.storage import s3_client_options

    options = s3_client_options(url, storage_options)
    config = dict(options.get("config_kwargs") or {})
    config["retries"] = {"max_attempts": 2, "mode": "standard"}  # fail fast: this is only a probe
    config["connect_timeout"] = 5
    options["config_kwargs"] = config
    options["skip_instance_cache"] = True
    fs, root = fsspec.core.url_to_fs(url, **options)
    bucket = root.split("/", 1)[0]
    endpoint = (options.get("client_kwargs") or {}).get("endpoint_url") or "AWS S3"
    key = options.get("key") or os.environ.get("AWS_ACCESS_KEY_ID") or ""
    who = f"access key id {key[:4]}…" if key else "the default AWS credentials"
    secret = options.get("secret") or os.environ.get("AWS_SECRET_ACCESS_KEY") or ""
    try:
        fs.ls(bucket, refresh=True)
    except FileNotFoundError:
        raise StorageAccessError(
            f"the {what} {url}: bucket {bucket!r} does not exist at {endpoint}; create it first"
        ) from None
    except PermissionError as e:
        raise StorageAccessError(
            f"the {what} {url}: {endpoint} refused access with {who} ({_short(e, secret)}). Check "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or the AWS profile) and the bucket's policy."
        ) from None
    except botocore.exceptions.NoCredentialsError:
        raise StorageAccessError(
            f"the {what} {url}: no S3 credentials were found. Set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            "or AWS_PROFILE."
        ) from None
    except (OSError, botocore.exceptions.BotoCoreError) as e:
        raise StorageAccessError(
            f"the {what} {url}: cannot reach the S3 endpoint {endpoint} ({_short(e, secret)}). Check --s3-endpoint "
            "(or AWS_ENDPOINT_URL) and that the server is running."
        ) from None


def _short(error: BaseException, secret: str) -> str:
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    return text.replace(secret, "***") if secret else text


def check_master(url: str, timeout: float = 5.0) -> None:
    """Raise :class:`SparkMasterError` unless some master of a ``spark://host:port[,host:port]`` URL accepts a
    TCP connection (other masters, such as ``local[4]`` or ``yarn``, are left to Spark)."""
    import socket

    if not url.startswith("spark://"):
        return
    problems = []
    for address in url.removeprefix("spark://").split(","):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise SparkMasterError(f"--master {url}: {address!r} is not host:port (e.g. spark://master-host:7077)")
        try:
            socket.create_connection((host, int(port)), timeout=timeout).close()
            return
        except OSError as e:
            problems.append(f"{address}: {e.strerror or e}")
    raise SparkMasterError(
        f"cannot reach the Spark master {url} ({'; '.join(problems)}). Check --master and that the master is running."
    )
