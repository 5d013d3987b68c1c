"""The roll: what the sink does after each batch's seal, at ``flush()``, and at the idle timer's tick, under the
sink's lock. Its eight steps read top to bottom in :meth:`Roll._roll_steps`: plan files at the barrier, pre-commit
them, write them (one Spark task per file), make them visible (a table's commit), commit them with the truncate
points (one transaction), write the output's mark, forget what the writers recorded, collect the log's garbage.

The per-epoch path uses the log store, the ledger, the planner, the writer and the output only, never
:mod:`recovery`. The file-writing task's closure captures the output and the planned tasks only, never the sink.
"""

from __future__ import annotations

import pickle
import threading
import time
from collections.abc import Iterator

import pyarrow as pa

from logstore import requestcounts
from logstore.failpoints import failpoint

from ..committer.damage import check_planned, diagnose
from ..committer.ledger import PlannedFile
from ..errors import NotSharedError, SinkFailedError
from ..metrics import figures as metrics_hooks
from ..output import forget_committed, remove_failed_attempts, write_mark
from ..rolling.planner import plan
from ..rolling.sizing import RESAMPLE_GROWTH, sample_ratio
from ..tasks import taskrows
from ..tasks.shared import refusal_message as unshared_message
from ..tasks.writer import WrittenObject, write_file
from .core import SinkCore, log

GC_SWEEP_EVERY = 20
"""Epochs between full listings of the log store for unsealed garbage (released segments go every epoch)."""


class Roll(SinkCore):
    """Files out of the log store: plan, pre-commit, write, commit; and the idle-rollover timer."""

    def _plan(self, *, force: bool) -> tuple[list[PlannedFile], list[int]]:
        """Plan files with the best estimate of Parquet bytes per log byte: learned from the latest committed
        files or, before the first, measured on a sample of the held rows (:mod:`filesink.rolling.sizing`). A sample is
        encoded when the size rule would close a file with at least ``RESAMPLE_GROWTH`` times the rows of the last
        sample, up to one row group of them: the estimate improves as the backlog grows, and a new sink's first
        files reach the target.
        """
        now = time.time()
        while True:
            learned = self._ledger.bytes_per_log_byte()
            ratio = learned if learned is not None else (self._sample.ratio if self._sample else 1.0)
            files, idle = plan(
                self._store,
                self.rollover,
                self.parallelism or 1,
                now=now,
                bytes_per_log_byte=ratio,
                force=force,
                backlog=self._backlog,
            )
            if learned is not None:
                return files, idle
            sampled = self._sample.rows if self._sample else 0
            if sampled >= self._row_group_rows:
                return files, idle
            larger = [f for f in files if f.reason == "size" and f.rows >= max(1, RESAMPLE_GROWTH * sampled)]
            if not larger:
                return files, idle
            largest = max(larger, key=lambda f: f.rows)
            self._sample = sample_ratio(self._file_task(largest, self._term), self._row_group_rows)

    def _roll(self, *, force: bool) -> None:
        started = time.monotonic()
        self._roll_steps(force=force)
        self._metrics.rolled(time.monotonic() - started)

    def _roll_steps(self, *, force: bool) -> None:
        failpoint("filesink.plan.before")
        try:
            files, idle = self._plan(force=force)
        except Exception as e:  # the size sample reads held rows: a damaged segment stops it
            damage = diagnose(self._store, e, None, "plan files")
            if damage is None:
                raise
            self._store.check_term("plan files")  # segments a newer owner released are not damage
            raise damage from e
        metrics_hooks.planned(self._metrics, self._backlog)
        written: dict[str, list[WrittenObject]] = {}
        if files:
            check_planned(self._store, files)  # a missing segment stops the roll before its pre-commit
            failpoint("filesink.precommit.before")
            self._ledger.precommit(files, self._term)
            self._metrics.pending(len(files))
            failpoint("filesink.precommit.after")
            try:
                written = self._write(files)
            except Exception as e:
                damage = diagnose(self._store, e, files, f"write {len(files)} files")
                if damage is None:
                    raise
                self._store.check_term(f"write {len(files)} files")  # released by a newer owner: not damage
                raise damage from e
            failpoint("filesink.write.after")
        committing = time.monotonic()
        if files and self._destination.options.is_table:
            self._make_visible(files, written)
        sizes = {name: sum(o.size for o in objects) for name, objects in written.items()}
        if files:
            failpoint("filesink.commit.before")
        self._ledger.commit(files, sizes, idle, self._term)
        if files:
            metrics_hooks.committed(self._metrics, files, sizes, time.monotonic() - committing, self._backlog)
            failpoint("filesink.commit.after")
            write_mark(self._output, self._store.sink_id, self._store.truncate_points())
            self.stats.file_sizes.extend(sizes[f.name] for f in files)
            self.stats.objects += sum(len(written[f.name]) for f in files)
            forget_committed(self._store.storage, self._term, written)
            self._remove_failed_attempts(written)
            self._destination.maintain()
        self._epochs_since_sweep += 1
        sweep = self._epochs_since_sweep >= GC_SWEEP_EVERY
        if sweep:
            self._epochs_since_sweep = 0
        self._store.collect_garbage(sweep=sweep)

    def _make_visible(self, files: list[PlannedFile], written: dict[str, list[WrittenObject]]) -> None:
        """A table's commit of the roll's files (the directory's objects are visible once written): after a term
        check, so that a run a newer one fenced does not commit; the table refuses a commit that races another."""
        schema = self._files_schema()
        assert schema is not None, "files are planned only once a seal recorded the schema"
        self._store.check_term(f"commit {len(files)} files to the {self._destination.name}")
        failpoint("filesink.table.before")
        self._destination.check_written(written)  # another writer's clean-up may have deleted them since
        self._destination.make_visible(files, written, schema)
        failpoint("filesink.table.after")

    def _remove_failed_attempts(self, written: dict[str, list[WrittenObject]]) -> None:
        """Remove temp files and uploads of task attempts that died or stalled while writing these files (now
        committed; Spark ran their tasks again). Best effort: recovery removes what is left at the next start."""
        keys = [o.key for objects in written.values() for o in objects]
        try:
            removed = remove_failed_attempts(self._output, self._term, list(written), keys)
        except Exception as e:
            log.warning("could not remove what failed task attempts left of the files just committed: %s", e)
            return
        if removed:
            log.info("removed %d temp files or uploads left by failed task attempts", removed)

    def _write(self, files: list[PlannedFile]) -> dict[str, list[WrittenObject]]:
        """Write the planned files, one Spark task per file (in this process when there is no Spark yet)."""
        tasks = [self._file_task(f, self._term) for f in files]
        output = self._output
        if self._spark is None:
            return {t.name: write_file(output, t) for t in tasks}
        self._probe_executors(
            f"No file was written: the files {', '.join(t.name for t in tasks)} stay pending (pre-committed), and "
            "the next start resolves them"
        )
        shared = self._shared

        def write_task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            from pyspark import TaskContext

            problem = shared.problem() if shared is not None else None
            ctx = TaskContext.get()
            for batch in batches:
                for index in batch.column(0).to_pylist():
                    task = tasks[index]
                    if problem is not None:  # nothing of the file written: this executor's output is not the driver's
                        yield taskrows.not_written(task.name, problem)
                    else:
                        before = requestcounts.snapshot()
                        objects = pickle.dumps(write_file(output, task))
                        counts = taskrows.task_counts(before, ctx.attemptNumber() if ctx else 0)
                        yield taskrows.written(task.name, objects, counts)

        # A mapInArrow job like the append (task i writes file i), not an RDD job: Spark runs both on the same
        # pool of Python workers, which are running and have their modules imported already, instead of
        # starting a second pool of workers for the files.
        count = len(tasks)
        jobs = self._spark.range(0, count, 1, count).mapInArrow(write_task, taskrows.WRITTEN_SCHEMA)
        rows = jobs.collect()
        self._metrics.tasks(r[taskrows.COUNTS_COLUMN] for r in rows)
        unshared = [r[taskrows.UNSHARED_COLUMN] for r in rows if r[taskrows.UNSHARED_COLUMN] is not None]
        if unshared:
            refused = [r.name for r in rows if r[taskrows.UNSHARED_COLUMN] is not None]
            raise NotSharedError(
                unshared_message(
                    unshared,
                    f"The files {', '.join(refused)} were not written on that executor. The files of this roll stay "
                    "pending (pre-committed): the next start resolves each of them exactly once (one that another "
                    "executor published is in the driver's output, and is committed). Fix the cause, then start the "
                    "query again",
                )
            )
        return {r.name: pickle.loads(r.objects) for r in rows}

    def _check_no_pending(self) -> None:
        """Refuse to go on after a roll failed between pre-commit and commit: its files are pending, maybe partly
        visible, and planning again over their vnodes could write their rows twice. Recovery resolves them."""
        pending = self._ledger.pending_names()
        if pending:
            raise SinkFailedError(
                f"files {', '.join(pending)} of {self.path} were pre-committed by a write that failed in this run and "
                "are not resolved. Close this sink and create a new one (restart the query): recovery at start "
                "commits or rewrites them. Nothing is lost."
            )

    # -- idle rollover ---------------------------------------------------------------------------------

    def _start_timer(self) -> None:
        if self._timer is not None or self.rollover.max_age_seconds is None:
            return
        interval = max(0.1, min(5.0, self.rollover.max_age_seconds / 4))
        self._timer = threading.Thread(target=self._tick, args=(interval,), name="filesink-idle-rollover", daemon=True)
        self._timer.start()

    def _tick(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                with self._lock:
                    if self._closed:
                        return
                    self._check_no_pending()
                    self._roll(force=False)
            except BaseException as e:  # reported by the next batch, flush or close
                self._metrics.fenced_at(e)
                self._timer_error = e
                return
