"""``filesink run --format kafka``: the Kafka options of the command, their checks at parse time, the Kafka source
jar that Spark needs, and the stream they make (Spark's ``kafka`` source, its key and value decoded or kept as
bytes, with the Kafka columns ``topic``, ``partition``, ``offset`` and ``timestamp``). See ``docs/kafka.md``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import mavenjars
from ..errors import JarFetchError, KafkaSourceError

VALUE_FORMATS = ("string", "json", "binary")
KAFKA_COLUMNS = ("topic", "partition", "offset", "timestamp")
"""The Kafka columns every row keeps (with ``key`` and the value's columns)."""
RESERVED = ("subscribe", "subscribePattern", "assign", "kafka.bootstrap.servers", "startingOffsets")
"""Spark's Kafka options that have an option of their own here."""
SOURCE_CLASS = "org.apache.spark.sql.kafka010.KafkaSourceProvider"


def source_artifact(spark_version: str) -> str:
    """The Maven coordinate of Spark's Kafka source for ``spark_version`` (Scala 2.13, as Spark 4 is built)."""
    return f"org.apache.spark:spark-sql-kafka-0-10_2.13:{spark_version}"


@dataclass(frozen=True)
class KafkaOptions:
    """What ``filesink run --format kafka`` reads: see ``docs/kafka.md``."""

    bootstrap: str
    topics: tuple[str, ...] = ()
    topic_pattern: str | None = None
    starting_offsets: str = "earliest"
    value: str = "string"
    schema: str | None = None
    """The value's JSON schema (``--schema``) with ``value`` ``json``."""
    options: dict[str, str] = field(default_factory=dict)
    """Spark's other Kafka source options (``maxOffsetsPerTrigger``, ``failOnDataLoss``, ``kafka.*``)."""

    def source_options(self) -> dict[str, str]:
        chosen = {"subscribe": ",".join(self.topics)} if self.topics else {"subscribePattern": str(self.topic_pattern)}
        return {
            "kafka.bootstrap.servers": self.bootstrap,
            **chosen,
            "startingOffsets": self.starting_offsets,
            **self.options,
        }

    @property
    def fails_on_data_loss(self) -> bool:
        return self.options.get("failOnDataLoss", "true").strip().lower() != "false"


def skips_lost(kafka: KafkaOptions | None) -> bool:
    """Whether a Kafka query skips records Kafka no longer holds (``failOnDataLoss=false``): then ``filesink run``
    looks for them in its progress (:mod:`filesink.cli.kafka_gaps`)."""
    return kafka is not None and not kafka.fails_on_data_loss


def _option(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE, e.g. maxOffsetsPerTrigger=10000")
    return key.strip(), value


def add_arguments(run: argparse.ArgumentParser) -> None:
    """The Kafka options of ``filesink run`` (taken with ``--format kafka`` only)."""
    group = run.add_argument_group("Kafka input (--format kafka; see docs/kafka.md)")
    group.add_argument("--kafka-bootstrap", metavar="HOST:PORT[,...]", help="the Kafka brokers to read from")
    group.add_argument("--topics", metavar="T1[,T2...]", help="the topics to read (comma-separated)")
    group.add_argument("--topic-pattern", metavar="REGEX", help="read every topic whose name matches REGEX")
    group.add_argument(
        "--starting-offsets",
        default="earliest",
        metavar="WHERE",
        help="where a new query starts: earliest, latest, or Spark's JSON of offsets per topic and partition, "
        'e.g. \'{"events":{"0":42,"1":-2}}\' (default: earliest; a restart goes on from its checkpoint)',
    )
    group.add_argument(
        "--kafka-value",
        default="string",
        choices=VALUE_FORMATS,
        help="the value as a UTF-8 string column, as the columns of JSON given by --schema, or as bytes; the key "
        "is a string, or bytes with binary (default: string)",
    )
    group.add_argument(
        "--kafka-option",
        action="append",
        default=[],
        type=_option,
        metavar="KEY=VALUE",
        help="an option of Spark's Kafka source, e.g. maxOffsetsPerTrigger=10000, failOnDataLoss=false, "
        "kafka.security.protocol=SSL (repeatable)",
    )


FILE_OPTIONS = ("--input", "--max-files-per-trigger", "--drop-missing-input")


def usage(args: argparse.Namespace) -> str | None:
    """What is wrong with the Kafka options of parsed ``filesink run`` arguments, or None."""
    given = [
        o
        for o, v in (
            ("--kafka-bootstrap", args.kafka_bootstrap),
            ("--topics", args.topics),
            ("--topic-pattern", args.topic_pattern),
            ("--kafka-option", args.kafka_option),
        )
        if v
    ]
    if args.format != "kafka":
        if args.input is None:
            return "--input DIR is required (the landing directory), except with --format kafka"
        if given:
            return f"{', '.join(given)}: options of --format kafka, not of --format {args.format}"
        if args.kafka_value != "string" or args.starting_offsets != "earliest":
            return "--kafka-value and --starting-offsets are options of --format kafka"
        return None
    files = [
        o
        for o, v in zip(FILE_OPTIONS, (args.input, args.max_files_per_trigger, args.drop_missing_input), strict=True)
        if v
    ]
    if files:
        return f"{', '.join(files)}: options of a landing directory, not of --format kafka (which reads topics)"
    if args.remote:
        return "--format kafka is not taken with --remote (or SPARK_REMOTE) yet: run with local Spark or --master"
    if not args.kafka_bootstrap:
        return "--format kafka needs --kafka-bootstrap HOST:PORT, the brokers to read from"
    if bool(args.topics) == bool(args.topic_pattern):
        return "--format kafka needs one of --topics T1,T2 and --topic-pattern REGEX (not both)"
    if args.topics and not all(t.strip() for t in args.topics.split(",")):
        return f"--topics {args.topics!r} names an empty topic: give names separated by commas"
    if args.kafka_value == "json" and not args.schema:
        return "--kafka-value json needs --schema, the value's JSON schema, e.g. --schema 'id bigint, name string'"
    if args.kafka_value != "json" and args.schema:
        return "--schema with --format kafka is the JSON value's schema: give it with --kafka-value json"
    problem = _offsets_usage(args.starting_offsets)
    if problem:
        return problem
    for key, value in args.kafka_option:
        if key in RESERVED:
            return (
                f"--kafka-option {key}: set it with its own option (--kafka-bootstrap, --topics, --topic-pattern, "
                "--starting-offsets)"
            )
        if key in ("failOnDataLoss",) and value.strip().lower() not in ("true", "false"):
            return f"--kafka-option failOnDataLoss={value}: take true or false"
        if key in ("maxOffsetsPerTrigger", "minOffsetsPerTrigger") and not value.strip().isdigit():
            return f"--kafka-option {key}={value}: take a positive number of records"
    if args.kafka_value == "json":
        from .preflight import ddl_columns

        clash = [c for c in ddl_columns(args.schema) if c in (*KAFKA_COLUMNS, "key")]
        if clash:
            return f"--schema names {', '.join(clash)}, which the Kafka columns already are: rename them"
    return None


def _offsets_usage(text: str) -> str | None:
    if text in ("earliest", "latest"):
        return None
    try:
        offsets = json.loads(text)
    except ValueError:
        offsets = None
    good = isinstance(offsets, dict) and all(
        isinstance(parts, dict) and all(isinstance(o, int) for o in parts.values()) for parts in offsets.values()
    )
    if not good:
        return (
            f"--starting-offsets {text!r} is not earliest, latest or JSON of offsets per topic and partition, "
            'e.g. \'{"events":{"0":42,"1":-2}}\' (-2 earliest, -1 latest)'
        )
    return None


def options_of(args: argparse.Namespace) -> KafkaOptions | None:
    """The :class:`KafkaOptions` of parsed arguments checked by :func:`usage` (None but for ``--format kafka``)."""
    if args.format != "kafka":
        return None
    return KafkaOptions(
        bootstrap=args.kafka_bootstrap,
        topics=tuple(t.strip() for t in args.topics.split(",")) if args.topics else (),
        topic_pattern=args.topic_pattern,
        starting_offsets=args.starting_offsets,
        value=args.kafka_value,
        schema=args.schema,
        options=dict(args.kafka_option),
    )


KAFKA_SPARK = "4.1.1"
"""The Spark that ``--format kafka`` is tested on: the newest whose Kafka source is on Maven Central (none is
published for Spark 4.2 or 4.3 yet). The ``kafka`` extra and ``scripts/kafka.sh`` install its pyspark."""


def spark_conf(
    conf: dict[str, str], spark_version: str, say: Callable[[str], None] = lambda line: None
) -> dict[str, str]:
    """``conf`` with the jars of Spark's Kafka source for ``spark_version`` (``spark.jars``), fetched once into the
    user's cache (:mod:`filesink.mavenjars`: from Maven Central, or the repositories of ``spark.jars.repositories``
    or ``spark.jars.ivySettings``), without the jars pyspark ships. Taken as it is when the user gives the jars
    (``spark.jars``) or packages (``spark.jars.packages``: Spark's own resolver fetches them). Raises
    :class:`KafkaSourceError`, quoting what failed, before anything is opened."""
    if "spark.jars" in conf or "spark.jars.packages" in conf:
        return conf
    artifact = source_artifact(spark_version)
    try:
        jars = mavenjars.fetch(
            [artifact],
            exclude=mavenjars.shipped_names(mavenjars.pyspark_jars()),
            repositories=mavenjars.Repositories.of_spark_conf(conf),
            what=f"Spark {spark_version}'s Kafka source",
            say=say,
        )
    except JarFetchError as e:
        raise missing_jar(spark_version, str(e), published=not e.unpublished) from None
    return {**conf, "spark.jars": ",".join(str(j) for j in jars)}


def missing_jar(spark_version: str, cause: str, published: bool = False) -> KafkaSourceError:
    """The error of a Spark without its Kafka source: ``cause`` (what failed); ``published`` false when the Kafka
    source of ``spark_version`` is not published (then the Spark to run with instead)."""
    if published:
        return KafkaSourceError(f"{cause}. Nothing was written.")
    artifact = source_artifact(spark_version)
    other = (
        f"run with pyspark {KAFKA_SPARK}, the Spark this project runs Kafka on: in an environment of its own, "
        "pip install 'exactly-once-parquet-sink[kafka]' (from a clone: bash scripts/kafka.sh makes .venv-kafka)"
        if spark_version != KAFKA_SPARK
        else "check the network or name a mirror with --conf spark.jars.repositories=URL"
    )
    return KafkaSourceError(
        f"Spark {spark_version} has no Kafka source: {cause}. To read Kafka, {other}; or give the jars of Spark's "
        f"Kafka source ({artifact}) with their dependencies (kafka-clients, commons-pool2, "
        "spark-token-provider-kafka-0-10) as --conf spark.jars=a.jar,b.jar (docs/kafka.md). Nothing was written."
    )


def packages_failed(spark_version: str, cause: str) -> KafkaSourceError:
    """The error of a Spark that did not start with the ``spark.jars.packages`` the user gave (Spark's resolver
    printed what failed above: its ``:: problems summary ::``)."""
    return KafkaSourceError(
        f"Spark {spark_version} did not start with the packages given by --conf spark.jars.packages ({cause}). "
        "Spark's resolver printed above what failed (its problems summary: an artifact 'not found', a 'download "
        "failed'). Leave spark.jars.packages out to have the run fetch Spark's Kafka source itself, from Maven "
        f"Central into its own cache ({source_artifact(spark_version)}), or give the jars with --conf "
        "spark.jars=a.jar,b.jar (docs/kafka.md). Nothing was written."
    )


DATA_LOSS_NOTICE = (
    "note: failOnDataLoss=false: records Kafka deleted (retention, a deleted topic) before this query read them "
    "are skipped without failing the query, and the output has a gap there (docs/kafka.md)"
)


REPLAY_PROGRESS_BUG = ('because the return value of "scala.Option.get()" is null', "IterableOps.map")
"""The words of SPARK-55271: Spark 4.1's Kafka source fails the progress report of a batch replayed from the offset
log after a restart (its ``metrics()`` reads latest offsets that only a planned batch sets), after that batch was
written and committed."""


def replay_progress_bug(summary: list[str]) -> bool:
    """Whether the query failed with SPARK-55271 (:data:`REPLAY_PROGRESS_BUG`)."""
    return any(all(words in line for words in REPLAY_PROGRESS_BUG) for line in summary)


def kafka_fix(summary: list[str]) -> str:
    """What to do after a failed batch of a Kafka query (Spark's error lines in ``summary``)."""
    if replay_progress_bug(summary):
        return (
            "This is a known bug of Spark 4.1's Kafka source (SPARK-55271): after a restart, the batch an earlier "
            "run left unfinished is run again, and Spark's progress report of it fails after the batch was written "
            "and committed. Nothing is lost or doubled, and it happens once per restart: run the same command "
            "again (docs/kafka.md)."
        )
    if any("Some data may have been lost" in line for line in summary):
        return (
            "Kafka no longer holds records this query has not read (deleted by retention, or the topic was "
            "recreated), and failOnDataLoss is true: every start fails the same way. To give those records up and "
            "go on, run the same command with --kafka-option failOnDataLoss=false; the output then has a gap in "
            "those partitions' offsets (docs/kafka.md)."
        )
    if any(words in line for line in summary for words in MALFORMED_VALUE):
        return (
            "A record's value in that batch is not JSON that --schema describes (--kafka-value json parses in "
            "FAILFAST mode, so that no record becomes a row of nulls), and a Kafka record cannot be corrected: "
            "every run stops at it. Find it by reading the topic with --kafka-value string into another --output "
            "and --state-dir (every row has its topic, partition and offset); then widen --schema if the value is "
            "valid, or, to go on without the records before it, start a new query with --starting-offsets past "
            "it (docs/kafka.md)."
        )
    return "Fix the cause and run the same command again: it resumes with that batch, read again from Kafka."


MALFORMED_VALUE = ("MALFORMED_RECORD_IN_PARSING", "Malformed records are detected in record parsing")
"""What Spark says when ``from_json`` in FAILFAST mode meets a value that is not JSON of the schema."""


def columns(kafka: KafkaOptions) -> list[str]:
    """The columns of :func:`open_stream`'s rows, before Spark starts."""
    from .preflight import ddl_columns

    value = ddl_columns(kafka.schema) if kafka.value == "json" and kafka.schema else ["value"]
    return ["key", *value, *KAFKA_COLUMNS]


def open_stream(spark: Any, kafka: KafkaOptions) -> Any:
    """The streaming DataFrame of ``kafka``: ``key``, the value's column(s), ``topic``, ``partition``, ``offset``,
    ``timestamp``. Raises :class:`KafkaSourceError` when Spark has no Kafka source or refuses an option."""
    from pyspark.errors import PySparkException
    from pyspark.sql import functions as F

    reader = spark.readStream.format("kafka")
    for key, value in kafka.source_options().items():
        reader = reader.option(key, value)
    try:
        raw = reader.load()
    except PySparkException as e:
        text = str(e)
        if "DATA_SOURCE_NOT_FOUND" in text or "Failed to find data source" in text:
            raise missing_jar(spark.version, "Spark found no data source named kafka") from None
        first = text.strip().splitlines()[0] if text.strip() else type(e).__name__
        raise KafkaSourceError(f"Spark's Kafka source refused the options: {first}") from None
    kept = [F.col(c) for c in KAFKA_COLUMNS]
    if kafka.value == "binary":
        return raw.select(F.col("key"), F.col("value"), *kept)
    text_key = F.col("key").cast("string").alias("key")
    if kafka.value == "string":
        return raw.select(text_key, F.col("value").cast("string").alias("value"), *kept)
    parsed = F.from_json(F.col("value").cast("string"), str(kafka.schema), {"mode": "FAILFAST"}).alias("_value")
    return raw.select(text_key, parsed, *kept).select("key", "_value.*", *KAFKA_COLUMNS)
