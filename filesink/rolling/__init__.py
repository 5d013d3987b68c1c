"""When a file rolls and what it covers: the rules (:mod:`.rollover`), what the log store holds per vnode and epoch
(:mod:`.backlog`), the plan at a barrier and the task that writes a planned file (:mod:`.planner`), and the
Parquet bytes per log byte a new sink measures before its first file (:mod:`.sizing`)."""
