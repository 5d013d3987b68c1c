"""The command line's usage errors: a mistyped option is named with the closest real one, before any other
complaint, and no abbreviation is taken for an option."""

from __future__ import annotations

import pytest

from filesink.cli.main import build_parser, main
from filesink.cli.runconfig import RunConfig
from filesink.cli.runquery import report_failure
from filesink.errors import EXIT_FAILED
from recovery.cli import main as recovery_main

RUN = ["run", "--input", "in", "--output", "out", "--state-dir", "state"]


def _usage_error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    assert e.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--ouput", "./x"], "filesink run: error: unrecognized option --ouput; did you mean --output?"),
        (
            [*RUN, "--partition", "d"],
            "filesink run: error: unrecognized option --partition; did you mean --partition-by?",
        ),
        ([*RUN, "--target-size=1MiB"], "unrecognized option --target-size; did you mean --target-file-size?"),
        (
            ["recover", "status", "--stat-dir", "s"],
            "filesink recover status: error: unrecognized option --stat-dir; did you mean --state-dir?",
        ),
        (["demo", "--file", "3"], "filesink demo: error: unrecognized option --file; did you mean --files?"),
        ([*RUN, "--frobnicate"], "unrecognized option --frobnicate; see `filesink run --help` for the options"),
    ],
)
def test_a_mistyped_option_is_named_with_the_closest_one(capsys, argv, message):
    assert _usage_error(capsys, argv).endswith(message)


def test_no_abbreviation_is_taken_for_an_option(capsys):
    # A prefix of exactly one option was taken for it before (argparse's allow_abbrev): now it is refused.
    assert "unrecognized option --available" in _usage_error(capsys, [*RUN, "--available"])
    assert "unrecognized option --accept-dup" in _usage_error(capsys, [*RUN, "--accept-dup"])


def test_what_is_spelled_out_still_parses():
    args = build_parser().parse_args([*RUN, "--partition-by", "d", "--parallelism", "2", "--conf", "a=-Xss4m"])
    assert args.partition_by == ["d"] and args.parallelism == 2 and args.conf == [("a", "-Xss4m")]


def test_python_m_recovery_names_a_mistyped_option_too(capsys):
    with pytest.raises(SystemExit) as e:
        recovery_main(["plan", "--log-stor", "s3://b/p"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().endswith("unrecognized option --log-stor; did you mean --log-store?")


@pytest.mark.parametrize(
    "spark_says",
    [
        "[CONCURRENT_STREAM_LOG_UPDATE] Multiple streaming queries are concurrently using file:/x/ckpt/sources/0",
        "java.util.ConcurrentModificationException: Multiple streaming jobs detected for 3",
    ],
)
def test_a_query_stopped_by_a_second_query_on_its_checkpoint_is_told_so(tmp_path, spark_says):
    """Two runs overlap (a rolling update): Spark stops one of them. The advice names the overlap, not a malformed
    input file."""
    config = RunConfig(input=tmp_path / "in", format="json", output=str(tmp_path / "out"), state_dir=tmp_path / "s")
    said: list[str] = []
    error = RuntimeError(f"StreamingQueryException: {spark_says}\n\tat org.apache.spark.Foo(Foo.scala:1)")
    assert report_failure(error, None, config, said.append) == EXIT_FAILED
    assert "Another streaming query uses the same checkpoint" in said[0] and str(tmp_path / "s") in said[0], said
    assert "malformed" not in said[0] and spark_says.split(" ", 1)[1][:30] in said[0], said


def test_any_other_query_failure_gets_the_input_advice(tmp_path):
    config = RunConfig(input=tmp_path / "in", format="json", output=str(tmp_path / "out"), state_dir=tmp_path / "s")
    said: list[str] = []
    assert report_failure(RuntimeError("[FAILED_READ_FILE] a.json"), None, config, said.append) == EXIT_FAILED
    assert f"replace the file in {config.input} that failed with a corrected copy under the same name" in said[0]
    assert "--drop-missing-input FILE" in said[0] and "Another streaming query" not in said[0], said


def _main_usage_error(capsys, argv: list[str]) -> str:
    """The usage error of ``filesink ARGV`` (checks after parsing too), before anything runs."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--table", "db.events"],
            "error: --table is an option of --table-format iceberg, not of directory: give "
            "--table-format iceberg, or leave it out",
        ),
        (
            ["--table-format", "delta", "--table", "db.events", "--catalog", "uri=x"],
            "error: --table and --catalog are options of --table-format iceberg, not of delta: a Delta "
            "table is named by its path alone (--output)",
        ),
        (
            ["--table-format", "iceberg", "--catalog", "uri=x"],
            "error: --table-format iceberg needs --table NAMESPACE.NAME (e.g. --table db.events), the "
            "table's identifier in the catalog",
        ),
        (["--table-format", "hudi"], "argument --table-format: invalid choice: 'hudi'"),
    ],
)
def test_table_options_of_run_are_checked_before_anything_runs(capsys, extra, message):
    assert message in _main_usage_error(capsys, [*RUN, *extra])


def test_a_catalog_property_that_is_not_key_value_is_refused_without_echoing_it(capsys):
    for argv in (
        [*RUN, "--catalog", "s3cr3t-token"],
        ["recover", "status", "--state-dir", "s", "--catalog", "=s3cr3t"],
    ):
        error = _usage_error(capsys, argv)
        assert "argument --catalog: a catalog property is KEY=VALUE" in error and "s3cr3t" not in error, error


def test_the_demo_writes_no_iceberg_table_on_s3(capsys):
    assert build_parser().parse_args(["demo", "--table-format", "delta"]).table_format == "delta"
    error = _main_usage_error(capsys, ["demo", "--s3", "--table-format", "iceberg"])
    assert "--s3 and --table-format iceberg exclude each other" in error


def test_recover_steps_take_catalog_properties():
    args = build_parser().parse_args(
        ["recover", "apply", "--state-dir", "s", "--catalog", "type=sql", "--catalog", "uri=sqlite:///c.db?x=1"]
    )
    assert dict(args.catalog) == {"type": "sql", "uri": "sqlite:///c.db?x=1"}


def test_table_options_of_run_reach_the_sink(tmp_path):
    """``--table-format``, ``--table`` and ``--catalog`` open the sink (no Spark: the sink opens before the query):
    the given catalog, not the embedded one, and the table recorded in the sink's identity."""
    pytest.importorskip("pyiceberg")
    from filesink.cli.main import run_config
    from filesink.cli.runconfig import make_sink
    from filesink.destination.iceberg import EMBEDDED_CATALOG

    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path / 'catalog.db'}", "warehouse": f"file://{tmp_path}"}
    argv = ["run", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out")]
    argv += ["--state-dir", str(tmp_path / "state"), "--table-format", "iceberg", "--table", "db.events"]
    argv += [arg for key, value in catalog.items() for arg in ("--catalog", f"{key}={value}")]
    config = run_config(build_parser().parse_args(argv))
    assert (config.table_format, config.table, config.catalog) == ("iceberg", "db.events", catalog)
    sink = make_sink(config, {})
    try:
        recorded = sink.ledger.config()
        assert recorded is not None and (recorded["table_format"], recorded["table"]) == ("iceberg", "db.events")
    finally:
        sink.close()
    assert (tmp_path / "catalog.db").is_file() and not (tmp_path / "out" / EMBEDDED_CATALOG).exists()
