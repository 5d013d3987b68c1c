"""The options of ``filesink run`` (:class:`RunConfig`) and what they make: the sink, the reader of the input and
the writer of the streaming query; the same for a run on local or classic Spark and through a Spark Connect server
(the stages of :mod:`filesink.cli.run`; what differs under Spark Connect is in :mod:`filesink.cli.connect_run`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import s3options
from ..rolling.rollover import Rollover
from ..sink.face import ExactlyOnceParquetSink
from .kafka_source import KafkaOptions


@dataclass
class RunConfig:
    """The options of ``filesink run`` (see ``docs/cli.md``)."""

    input: Path
    format: str
    output: str
    state_dir: Path
    keys: list[str] = field(default_factory=list)
    partition_by: list[str] = field(default_factory=list)
    trigger_seconds: float = 5.0
    parallelism: int | None = None
    target_file_size: int | None = 128 * 2**20
    max_file_age: float | None = 300.0
    available_now: bool = False
    s3_endpoint: str | None = None
    region: str | None = None
    extra_storage_options: dict[str, Any] = field(default_factory=dict)
    """Storage options from ``--storage-options`` and ``--storage-option`` (:mod:`filesink.s3options`)."""
    master: str | None = None
    checkpoint: Path | None = None
    schema: str | None = None
    max_files_per_trigger: int | None = None
    drop_missing_input: list[Path] = field(default_factory=list)
    """``--drop-missing-input``: files of the batch to run again whose rows are given up
    (:mod:`filesink.cli.sourcelog`)."""
    spark_conf: dict[str, str] = field(default_factory=dict)
    log_store: str | None = None
    accept_state_loss: bool = False
    accept_duplicates: bool = False
    """``--accept-duplicates``: with ``--accept-state-loss``, batch 0 may write to an output that holds rows."""
    fill_missing_columns: bool = False
    """``--fill-missing-columns``: a batch without some of the sink's columns gets them as nulls."""
    single_driver: bool = False
    """``--single-driver``: go on where the log store's location has no conditional create (``docs/recovery.md``)."""
    remote: str | None = None
    """A Spark Connect URL (``--remote``, or ``SPARK_REMOTE``): the job runs through that server, where every
    path is the server's (:mod:`filesink.cli.connect_run`)."""
    table_format: str = "directory"
    """``--table-format``: ``directory``, ``delta`` or ``iceberg`` (the sink's ``table_format``)."""
    table: str | None = None
    """``--table``: the Iceberg table's identifier, ``<namespace>.<name>``."""
    catalog: dict[str, str] = field(default_factory=dict)
    """``--catalog``: pyiceberg's catalog properties (empty: the sink's default, an embedded catalog)."""
    kafka: KafkaOptions | None = None
    """``--format kafka``: the topics to read (:mod:`filesink.cli.kafka_source`); ``input`` is then unused."""
    metrics_port: int | None = None
    """``--metrics-port``: serve the sink's metrics for Prometheus (the sink's ``metrics_port``)."""
    metrics_address: str = "127.0.0.1"
    """``--metrics-address``: where ``--metrics-port`` listens."""
    log_format: str = "text"
    """``--log-format``: ``text``, or ``json`` (:mod:`filesink.cli.jsonlog`)."""

    @property
    def checkpoint_dir(self) -> Path:
        return self.checkpoint or self.state_dir / "checkpoint"

    def storage_options(self) -> dict[str, Any]:
        """s3fs options: ``--s3-endpoint``, ``--region``, ``--storage-option(s)``; credentials from the AWS
        variables or profile. Credentials set in this process's environment are passed on explicitly, so that
        executors on other machines (``--master``), which append to and read from the log store, use the same
        ones."""
        return s3options.build(endpoint=self.s3_endpoint, region=self.region, json_options=self.extra_storage_options)


def make_sink(config: RunConfig, options: dict[str, Any]) -> ExactlyOnceParquetSink:
    """The sink ``config`` describes (opened here, or under Spark Connect a description opened by the server)."""
    return ExactlyOnceParquetSink(
        config.output,
        config.state_dir,
        log_store=config.log_store,
        accept_state_loss=config.accept_state_loss,
        accept_duplicates=config.accept_duplicates,
        single_driver=config.single_driver,
        fill_missing_columns=config.fill_missing_columns,
        key_columns=config.keys or None,
        partition_by=config.partition_by or None,
        parallelism=config.parallelism,
        rollover=Rollover(target_file_size=config.target_file_size, max_age_seconds=config.max_file_age),
        storage_options=options,
        checkpoint_location=str(config.checkpoint_dir),
        table_format=config.table_format,
        catalog=config.catalog or None,
        table=config.table,
        metrics_port=config.metrics_port,
        metrics_address=config.metrics_address,
    )


def input_reader(spark: Any, config: RunConfig, streaming: bool) -> Any:
    reader = (spark.readStream if streaming else spark.read).format(config.format)
    if config.format != "parquet":  # a malformed line fails its batch, instead of becoming a row of nulls
        reader = reader.option("mode", "FAILFAST")
    if config.format == "csv":
        reader = reader.option("header", "true")
        if not streaming:
            reader = reader.option("inferSchema", "true")
    if streaming and config.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", config.max_files_per_trigger)
    return reader


def stream_writer(stream: Any, function: Any, config: RunConfig) -> Any:
    """``stream`` written by ``foreachBatch(function)``, with the checkpoint and trigger of ``config``."""
    writer = stream.writeStream.foreachBatch(function).option("checkpointLocation", str(config.checkpoint_dir))
    if config.available_now:
        return writer.trigger(availableNow=True)
    return writer.trigger(processingTime=f"{config.trigger_seconds} seconds")
