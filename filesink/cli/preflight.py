"""Checks ``filesink run`` makes before it starts Spark, so that bad input fails in seconds with a message that
names the file, directory or endpoint, and before anything is written.

- :func:`check_input`: the landing directory exists and each file in it can be read; Parquet footers are read
  and their schemas merged in the order the files landed, by the sink's rules (:mod:`filesink.cli.inputschema`).
- :func:`check_s3` (:mod:`filesink.output.probe`): an ``s3://`` location's endpoint answers, accepts the
  credentials and has the bucket.
- :func:`check_master`: a ``spark://`` master accepts connections.
- a local directory the sink needs (output, state directory, log store) is checked by :mod:`filesink.localdirs`,
  which the sink's constructor uses too.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from logstore.diagnosis import diagnose

from ..errors import InputError, SinkOptionError, SparkMasterError
from ..output import check_s3
from .inputschema import MergedInput, merge_footers, read_footer

__all__ = ["FORMATS", "InputFiles", "check_input", "check_master", "check_s3", "input_files"]

FORMATS = ("parquet", "json", "csv")


def input_files(directory: Path) -> list[Path]:
    """The files Spark's file source reads from ``directory``: recursively, skipping names that start with
    ``.`` or ``_`` (hidden files, ``_SUCCESS``, ``_spark_metadata``) and the files under such directories."""
    found = []
    for root, dirs, names in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        found += [Path(root) / n for n in sorted(names) if not n.startswith((".", "_"))]
    return found


@dataclass(frozen=True)
class InputFiles:
    """What :func:`check_input` found: the files, and for Parquet their schemas merged."""

    files: list[Path]
    merged: MergedInput | None
    """The union of the Parquet files' schemas (:func:`filesink.cli.inputschema.merge_footers`); None for JSON and
    CSV, without files, or when not asked for (a schema given)."""


def check_input(
    directory: Path, fmt: str, *, merge: bool = True, fill_missing: bool = False, keep: tuple[str, ...] = ()
) -> InputFiles:
    """Raise :class:`InputError` unless ``directory`` is a readable directory whose files are all readable as
    ``fmt`` (Parquet: a valid footer, and unless ``merge`` is off (the schema is given), schemas the sink takes
    one after another in the order the files landed; ``fill_missing`` and ``keep`` as
    :func:`filesink.cli.inputschema.merge_footers` takes them)."""
    if fmt not in FORMATS:
        raise InputError(f"unknown input format {fmt!r}: use one of {', '.join(FORMATS)}")
    if not directory.exists():
        raise InputError(f"the input directory {directory} does not exist: create it, or check the --input path")
    if not directory.is_dir():
        raise InputError(f"the input {directory} is a file, not a directory: give the directory files land in")
    if not os.access(directory, os.R_OK | os.X_OK):
        raise InputError(f"the input directory {directory} cannot be read (permission denied)")
    files = input_files(directory)
    for path in files:
        try:
            with open(path, "rb") as f:
                f.read(1)
        except OSError as e:
            found = diagnose(e, str(path), writing=False)
            raise InputError(
                f"the input file {path} cannot be read: {found.cause}. Nothing has been read or written yet: "
                f"{found.advise('start again')} Or move the file out of the input directory."
            ) from e
    if fmt != "parquet":
        return InputFiles(files, None)
    footers = [read_footer(path) for path in files]
    if not merge:
        return InputFiles(files, None)
    return InputFiles(files, merge_footers(footers, directory, fill_missing=fill_missing, keep=keep))


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


def ddl_columns(ddl: str) -> list[str]:
    """The top-level column names of a schema in Spark's DDL (``id bigint, `my col` string, s struct<a:int>``)."""
    names, depth, start = [], 0, 0
    for i, ch in enumerate(ddl + ","):
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif ch == "," and depth == 0:
            field = ddl[start:i].strip()
            start = i + 1
            if field.startswith("`"):
                names.append(field[1 : field.index("`", 1)])
            elif field:
                names.append(field.split()[0].rstrip(":"))
    return names


def check_named_columns(columns: Sequence[str], keys: Sequence[str], partition_by: Sequence[str], source: str) -> None:
    """Raise :class:`SinkOptionError` if ``--key`` or ``--partition-by`` names a column the input does not have
    (``columns``, read from ``source``): refused before Spark starts and before the sink's state is created."""
    import difflib

    for option, names in (("--partition-by", partition_by), ("--key", keys)):
        unknown = [n for n in names if n not in columns]
        if not unknown:
            continue
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, columns, n=1) or [c for c in columns if c.lower() == name.lower()]
            if close:
                hints.append(f"did you mean {option} {close[0]}?")
        raise SinkOptionError(
            f"{option} {' '.join(unknown)}: the input has no column {', '.join(unknown)} (its columns, from "
            f"{source}: {', '.join(columns)}). {' '.join(hints)} Nothing was created or written: give columns of the "
            "input, and the same ones at every run."
        )
