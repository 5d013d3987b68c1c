"""The ``filesink`` command (:mod:`.main`) and ``filesink run``'s pipeline (:mod:`.run`, its stages top to bottom):
the input checked before Spark starts (:mod:`.preflight`, :mod:`.inputschema`, :mod:`.sourcelog`), the options as
one run's configuration (:mod:`.runconfig`), Spark and the query started (:mod:`.sparkstart`, :mod:`.localspark`,
:mod:`.warmup`, :mod:`.runquery`; the Kafka source of :mod:`.kafka_source` and :mod:`.kafka_gaps`; a Spark Connect
server through :mod:`.connect_run`), and what it says while it runs (:mod:`.progress`, :mod:`.jsonlog`,
:mod:`.startnotices`). ``filesink recover`` is :mod:`recovery.cli`'s."""
