"""The ``filesink`` command: ``run`` (the streaming job), ``demo`` (a self-checking example) and ``recover``
(inspect and repair a sink's state; :mod:`recovery.cli`). The reference is ``docs/cli.md``.

Exit codes: 0 done, 1 failed, 2 bad usage, 3 a live query holds the sink, 4 not a sink's state directory
(``recover`` only), 5 a log segment the sink needs is missing or damaged, 130 stopped at once by a second Ctrl-C
or SIGTERM (``run``).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recovery.cli import add_parser as add_recover
from recovery.cli import recover

from .. import s3options
from ..argparsing import Parser, catalog_property
from ..destination import TableFormat
from ..destination.catalogs import cli_catalog_refusal, needs_catalog
from ..errors import COMMAND_ERRORS, EXIT_FAILED, report
from . import kafka_source

if TYPE_CHECKING:
    from .runconfig import RunConfig

_SIZE_UNITS: dict[str, float] = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
}
_TIME_UNITS: dict[str, float] = {"ms": 0.001, "s": 1, "": 1, "m": 60, "min": 60, "h": 3600}


def _quantity(text: str, units: dict[str, float], kind: str, examples: str) -> float | None:
    """A number with an optional unit from ``units`` (multiplied out), or None for ``off``."""
    if text.strip().lower() == "off":
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in units or float(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a {kind}: use e.g. {examples}, or off")
    return float(m.group(1)) * units[m.group(2).lower()]


def parse_size(text: str) -> int | None:
    """``128MiB``, ``1GiB``, ``64MB``, ``1048576`` (bytes) or ``off``."""
    value = _quantity(text, _SIZE_UNITS, "size", "128MiB, 1GiB, 64MB")
    return None if value is None else int(value)


def parse_duration(text: str) -> float | None:
    """``5s``, ``500ms``, ``5m``, ``1h``, ``30`` (seconds) or ``off``."""
    return _quantity(text, _TIME_UNITS, "duration", "500ms, 5s, 5m, 1h")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"expected a port number from 0 to 65535 (0: a free one), not {text!r}")
    return int(text)


def _conf(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE, e.g. spark.driver.memory=4g")
    return key.strip(), value


def _add_run(commands: argparse._SubParsersAction[Any]) -> None:
    text = "stream a landing directory of Parquet, JSON or CSV files (or Kafka topics) into exactly-once Parquet files"
    run = commands.add_parser(
        "run",
        help=text,
        description=text + ". Ctrl-C or SIGTERM stops after the batch in progress; what the log store still "
        "holds is written by the next run. Exit codes: 0 done or stopped, 1 failed, 2 bad usage, 3 another "
        "query holds the state directory, 5 a log segment the sink needs is missing or damaged (see `filesink "
        "recover status`), 130 stopped at once by a second Ctrl-C.",
    )
    run.add_argument(
        "--input", type=Path, metavar="DIR", help="the landing directory to read (required but with --format kafka)"
    )
    run.add_argument(
        "--format",
        default="parquet",
        choices=["parquet", "json", "csv", "kafka"],
        help="input file format, or kafka to read Kafka topics (docs/kafka.md) (default: parquet)",
    )
    run.add_argument("--output", required=True, metavar="URL", help="output directory or s3://bucket/prefix")
    run.add_argument(
        "--table-format",
        default="directory",
        choices=[f.value for f in TableFormat],
        help="what the output is: Parquet files in a directory, a Delta table at --output, or an Iceberg table "
        "(--table) with its data at --output; fixed when the sink is created (default: directory)",
    )
    run.add_argument(
        "--table",
        metavar="NAMESPACE.NAME",
        help="with --table-format iceberg: the table's identifier in the catalog, e.g. db.events (required there)",
    )
    run.add_argument(
        "--catalog",
        action="append",
        default=[],
        type=catalog_property,
        metavar="KEY=VALUE",
        help="with --table-format iceberg: a pyiceberg catalog property, e.g. uri=postgresql+psycopg2://... "
        "(repeatable; default: an embedded SQLite catalog in a local --output; an s3:// output needs one)",
    )
    run.add_argument(
        "--state-dir",
        required=True,
        type=Path,
        metavar="DIR",
        help="the sink's local state directory (state database, log store, checkpoint); one per query",
    )
    run.add_argument(
        "--key",
        action="append",
        default=[],
        metavar="COL",
        help="column that assigns rows to vnodes (repeatable; default: all columns)",
    )
    run.add_argument(
        "--partition-by",
        action="append",
        default=[],
        metavar="COL",
        help="write Hive-style COL=value directories (repeatable)",
    )
    run.add_argument(
        "--trigger", type=parse_duration, default=5.0, metavar="DURATION", help="micro-batch interval (default: 5s)"
    )
    run.add_argument(
        "--parallelism",
        type=_positive,
        metavar="N",
        help="file writers (and local Spark cores); may change between runs (default: the CPU count)",
    )
    run.add_argument(
        "--target-file-size",
        type=parse_size,
        default=128 * 2**20,
        metavar="SIZE",
        help="close a file when it reaches about this size, e.g. 64MiB, 1GiB, off (default: 128MiB)",
    )
    run.add_argument(
        "--max-file-age",
        type=parse_duration,
        default=300.0,
        metavar="DURATION",
        help="close a file once its oldest row waited this long, also when idle; e.g. 30s, 5m, off (default: 5m)",
    )
    run.add_argument(
        "--available-now",
        action="store_true",
        help="process the files there now, write every file, and exit 0 (instead of running until stopped)",
    )
    run.add_argument(
        "--log-store",
        metavar="URL",
        help="where the log store keeps its segments, e.g. s3://bucket/sink-log, reachable by every executor "
        "(default: STATE_DIR/log, enough for local Spark)",
    )
    run.add_argument(
        "--accept-state-loss",
        action="store_true",
        help="let a new, empty state start at a batch id above 0 (its checkpoint has moved on): the rows a lost "
        "state held and had not written are not in the output; also for a new sink on a query that ran before",
    )
    run.add_argument(
        "--accept-duplicates",
        action="store_true",
        help="with --accept-state-loss: let batch 0 (a new checkpoint) write to an output that already holds rows, "
        "which are then written again (refused without it)",
    )
    run.add_argument(
        "--fill-missing-columns",
        action="store_true",
        help="a batch without some of the sink's columns gets them as nulls of their recorded types (refused "
        "without it; see docs/schema-evolution.md)",
    )
    run.add_argument(
        "--single-driver",
        action="store_true",
        help="go on where the log store's S3 server has no conditional create (ignores or refuses PUT with "
        "If-None-Match: *), which otherwise stops the start: you promise that at most one driver or recover command "
        "runs on this sink at a time, since nothing fences a second one",
    )
    run.add_argument("--master", metavar="URL", help="Spark master, e.g. spark://host:7077 (default: local Spark)")
    run.add_argument(
        "--remote",
        metavar="URL",
        default=os.environ.get("SPARK_REMOTE") or None,
        help="run through the Spark Connect server at URL, e.g. sc://host:15002 (default: $SPARK_REMOTE if set); "
        "every path is then the server's",
    )
    run.add_argument(
        "--checkpoint", type=Path, metavar="DIR", help="Spark checkpoint directory (default: STATE_DIR/checkpoint)"
    )
    run.add_argument(
        "--schema",
        metavar="DDL",
        help="input schema, e.g. 'id bigint, name string' (default: the sink's, or inferred from the files)",
    )
    run.add_argument(
        "--drop-missing-input",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help="give up the rows of FILE, a file of the batch this start runs again that is missing from the input "
        "directory (the start is refused while one is missing, naming each); they will not be in the output "
        "(repeatable)",
    )
    run.add_argument(
        "--max-files-per-trigger", type=_positive, metavar="N", help="read at most N new files per micro-batch"
    )
    run.add_argument(
        "--conf",
        action="append",
        default=[],
        type=_conf,
        metavar="KEY=VALUE",
        help="a Spark configuration setting, e.g. spark.driver.memory=4g (repeatable)",
    )
    run.add_argument(
        "--metrics-port",
        type=_port,
        metavar="N",
        help="serve the sink's metrics for Prometheus at http://ADDRESS:N/metrics (0: a free port, printed at "
        "start; needs the metrics extra)",
    )
    run.add_argument(
        "--metrics-address",
        default="127.0.0.1",
        metavar="ADDRESS",
        help="the address --metrics-port listens on (default: 127.0.0.1; 0.0.0.0 for every interface)",
    )
    run.add_argument(
        "--log-format",
        choices=["text", "json"],
        default="text",
        help="text (default): lines for people; json: one JSON object per line on stdout per batch, per roll that "
        "committed files and per notice (progress and errors stay on stderr)",
    )
    s3options.add_arguments(run)
    kafka_source.add_arguments(run)


def table_usage(
    table_format: str, table: str | None, catalog: Mapping[str, str], output: str | None = None
) -> str | None:
    """What is wrong with ``--table-format``, ``--table`` and ``--catalog`` (and ``--output``) together (what the
    sink's own ``TableFormatError`` says of its options, in the options' names), or None."""
    if table_format != "iceberg" and (table or catalog):
        given = [o for o, on in (("--table", table), ("--catalog", catalog)) if on]
        what = f"{given[0]} is an option" if len(given) == 1 else "--table and --catalog are options"
        why = (
            "a Delta table is named by its path alone (--output)"
            if table_format == "delta"
            else f"give --table-format iceberg, or leave {'it' if len(given) == 1 else 'them'} out"
        )
        return f"{what} of --table-format iceberg, not of {table_format}: {why}"
    if table_format == "iceberg" and not table:
        return (
            "--table-format iceberg needs --table NAMESPACE.NAME (e.g. --table db.events), the table's identifier "
            "in the catalog"
        )
    if table_format == "iceberg" and output is not None and needs_catalog(output, catalog):
        return cli_catalog_refusal(output)
    return None


def _add_demo(commands: argparse._SubParsersAction[Any]) -> None:
    text = (
        "generate events, stream them through the sink, kill the job once mid-way and restart it, then verify "
        "with DuckDB that the output (or table) holds every input row exactly once"
    )
    demo = commands.add_parser("demo", help=text, description=text + ". Exit code 0 when the check passes.")
    demo.add_argument(
        "--dir",
        type=Path,
        default=Path("demo-output"),
        help="working directory; the demo's landing, state and output directories in it are emptied first "
        "(default: demo-output)",
    )
    demo.add_argument(
        "--files", type=_positive, default=12, metavar="N", help="input files, one per micro-batch (default: 12)"
    )
    demo.add_argument(
        "--rows", type=_positive, default=50_000, metavar="N", help="rows per input file (default: 50000)"
    )
    demo.add_argument(
        "--s3", action="store_true", help="write to a SeaweedFS S3 server started for the demo on 127.0.0.1"
    )
    demo.add_argument(
        "--table-format",
        default="directory",
        choices=[f.value for f in TableFormat],
        help="write a Delta table, or an Iceberg table (demo.events, in an embedded catalog), instead of a "
        "directory, and check the table as its readers see it (default: directory)",
    )


def _add_kafka_broker(commands: argparse._SubParsersAction[Any]) -> None:
    text = (
        "start a Kafka broker on 127.0.0.1 to try `filesink run --format kafka` with (one KRaft node, Apache "
        "Kafka's jars fetched once into the user's cache), create topics, and write generated events into the "
        "first, until Ctrl-C"
    )
    broker = commands.add_parser("kafka-broker", help=text, description=text + ". Not a production broker.")
    broker.add_argument(
        "--dir",
        type=Path,
        default=Path("kafka-broker"),
        help="the broker's storage, formatted at the first start and kept (default: kafka-broker)",
    )
    broker.add_argument("--port", type=int, default=9092, help="the port on 127.0.0.1 (default: 9092; 0: a free one)")
    broker.add_argument(
        "--topic",
        action="append",
        default=None,
        metavar="NAME",
        help="a topic to create if it is missing (repeatable; default: events)",
    )
    broker.add_argument(
        "--partitions", type=_positive, default=4, metavar="N", help="partitions of each new topic (default: 4)"
    )
    broker.add_argument(
        "--produce",
        type=int,
        default=100,
        metavar="N",
        help="generated events a second written into the first topic (default: 100; 0: none)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="filesink", description="Exactly-once Parquet sink for Spark.")
    commands = parser.add_subparsers(dest="group", required=True, metavar="COMMAND")
    _add_run(commands)
    _add_demo(commands)
    _add_kafka_broker(commands)
    add_recover(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _dispatch(parser, args)
    except COMMAND_ERRORS as e:
        return report(e)
    except Exception as e:
        from py4j.protocol import Py4JError
        from pyspark.errors import PySparkException

        if not isinstance(e, PySparkException | Py4JError):
            raise
        from .runquery import spark_error_summary

        lines = "\n  ".join(spark_error_summary(e))
        print(
            f"error: Spark failed:\n  {lines}\nCheck --master (or --remote) and the --conf settings.", file=sys.stderr
        )
        return EXIT_FAILED


def _dispatch(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.group == "recover":
        return recover(args, parser)
    if args.group == "kafka-broker":
        from ..demo.kafka_broker import serve

        if args.produce < 0 or not 0 <= args.port < 65536:
            parser.error("--produce takes 0 or more events a second, and --port a port number (0: a free one)")
        topics = args.topic or ["events"]
        return serve(
            args.dir,
            port=args.port,
            topics=topics,
            partitions=args.partitions,
            rate=args.produce,
            out=lambda text: print(text, flush=True),
        )
    if args.group == "demo":
        from ..demo import demo

        if args.s3 and args.table_format == "iceberg":
            parser.error(
                "--s3 and --table-format iceberg exclude each other: an Iceberg table on S3 needs a catalog server, "
                "and the demo's table uses an embedded catalog beside a local output"
            )
        return demo(args.dir, files=args.files, rows=args.rows, s3=args.s3, table_format=args.table_format)
    if args.target_file_size is None and args.max_file_age is None:
        parser.error("--target-file-size and --max-file-age cannot both be off: files would never be closed")
    if args.accept_duplicates and not args.accept_state_loss:
        parser.error("--accept-duplicates is for a sink that replaces a lost one: give it with --accept-state-loss")
    if args.trigger is None:
        parser.error("--trigger needs an interval (use --available-now to run once)")
    if args.remote and args.master:
        parser.error("--master and --remote (or SPARK_REMOTE) exclude each other: give one of them")
    if args.remote and args.drop_missing_input:
        parser.error(
            "--drop-missing-input is not taken with --remote (or SPARK_REMOTE): the checkpoint and the input are the "
            "server's, so this command cannot check which files a batch misses. Put the file back under its name"
        )
    if args.remote and not args.remote.startswith("sc://"):
        parser.error(f"--remote takes a Spark Connect URL such as sc://host:15002, not {args.remote!r}")
    problem = kafka_source.usage(args) or table_usage(args.table_format, args.table, dict(args.catalog), args.output)
    if problem:
        parser.error(problem)
    from rich.console import Console

    from .run import run

    config = run_config(args)
    if config.log_format == "json":
        from . import jsonlog

        return run(config, Console(stderr=True), out=jsonlog.notice)
    return run(config, Console(stderr=True), out=lambda text: print(text, flush=True))


def run_config(args: argparse.Namespace) -> RunConfig:
    """The :class:`RunConfig` of parsed ``filesink run`` arguments (checked by :func:`_dispatch` first)."""
    from .runconfig import RunConfig

    return RunConfig(
        input=args.input.absolute() if args.input else Path(),  # unused with --format kafka
        format=args.format,
        output=args.output,
        state_dir=args.state_dir.absolute(),
        keys=args.key,
        partition_by=args.partition_by,
        trigger_seconds=args.trigger,
        parallelism=args.parallelism,
        target_file_size=args.target_file_size,
        max_file_age=args.max_file_age,
        available_now=args.available_now,
        s3_endpoint=args.s3_endpoint,
        region=args.region,
        extra_storage_options=s3options.build(
            json_options=args.storage_options_json, options=args.storage_option, environ={}
        ),
        master=args.master,
        checkpoint=args.checkpoint.absolute() if args.checkpoint else None,
        schema=args.schema,
        max_files_per_trigger=args.max_files_per_trigger,
        drop_missing_input=[p.absolute() for p in args.drop_missing_input],
        spark_conf=dict(args.conf),
        log_store=args.log_store,
        accept_state_loss=args.accept_state_loss,
        accept_duplicates=args.accept_duplicates,
        single_driver=args.single_driver,
        fill_missing_columns=args.fill_missing_columns,
        remote=args.remote,
        table_format=args.table_format,
        table=args.table,
        catalog=dict(args.catalog),
        kafka=kafka_source.options_of(args),
        metrics_port=args.metrics_port,
        metrics_address=args.metrics_address,
        log_format=args.log_format,
    )


if __name__ == "__main__":
    sys.exit(main())
