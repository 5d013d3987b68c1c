"""What runs in Spark's tasks: the rows an append must pass (:mod:`.admission`), writing one planned file as Parquet
(:mod:`.writer`, with the columns it gives a dictionary, :mod:`.dictionary`), the rows the tasks return to the
driver (:mod:`.taskrows`), and whether the executors see the driver's local directories (:mod:`.shared`)."""
