"""The Spark-facing exactly-once Parquet sink (built on :mod:`logstore`)."""
