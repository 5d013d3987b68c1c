"""The schema rules: the sink's one schema and how a batch is conformed to it (:mod:`.conform`), what evolution
takes or refuses (:mod:`.evolution`), and Hive-style partition directories (:mod:`.partitioning`)."""
