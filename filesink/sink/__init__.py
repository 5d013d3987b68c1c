"""The sink object and its roles on the driver, in the manner of Flink's Sink V2: the face users construct
(:mod:`.face`, ``ExactlyOnceParquetSink``), the state its roles share (:mod:`.core`), its start (:mod:`.start`:
the lock, the stores opened, the claims, recovery through :mod:`recovery.startup`), a batch's admission
(:mod:`.batch`, with the schema history of :mod:`.schema_versions`), the append (:mod:`.append`), the roll's eight
steps (:mod:`.roll`), the sinks open on a Spark Connect server (:mod:`.connect`), what a pickled sink carries
(:mod:`.description`) and the query id read from a checkpoint (:mod:`.checkpoint`).

``from filesink import ExactlyOnceParquetSink`` is the public way in; this package imports nothing until one of its
modules is asked for (Spark tasks import :mod:`filesink` and never need the sink)."""
