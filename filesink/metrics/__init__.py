"""A sink's figures: :mod:`.figures` (``SinkMetrics``, the book the sink keeps them in, the JSON event records) and
:mod:`.prometheus` (their exposition for Prometheus, imported only with ``metrics_port``)."""
