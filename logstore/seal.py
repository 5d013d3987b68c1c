"""The append from the driver and the seal: an epoch and its segments recorded in one transaction, durable in the
home first (the log store's checkpoint); the discard of a refused batch's segments."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from . import guards, segment
from .append import append_segment
from .errors import EpochOrderError, EpochSealedError, SegmentCorruptError, SegmentError, SegmentMissingError
from .failpoints import failpoint
from .segment import SegmentDescriptor, describe_vnodes
from .statedb import db_errors
from .storecore import StoreCore, _epoch_record, log


class Seal(StoreCore):
    """Append and seal: the epochs' order, the segments' check against the log store, the seal's transaction."""

    def append(self, epoch: int, data: Any, *, writer_id: str = "driver") -> SegmentDescriptor | None:
        """Append from the driver (tasks call :func:`logstore.append_segment` with :attr:`target`)."""
        self._check_unsealed(epoch, "append to")
        return append_segment(self.target, epoch, data, writer_id=writer_id)

    def discard(self, epoch: int, descriptors: Iterable[SegmentDescriptor]) -> None:
        """Delete the segment files an append wrote for ``epoch`` that will not be sealed (its batch was refused).
        Best effort: a file left behind is unsealed garbage, which the next sweep removes."""
        self._check_unsealed(epoch, "discard segments of")
        for d in descriptors:
            try:
                self.storage.delete(d.name)
            except OSError as e:
                log.warning("could not delete segment %s of refused epoch %d: %s", d.name, epoch, e)

    @db_errors("check the epoch order")
    def _check_unsealed(self, epoch: int, action: str) -> None:
        last = self.last_sealed_epoch
        if epoch < last:
            raise EpochOrderError(
                f"cannot {action} epoch {epoch}: epoch {last} is already sealed in {self._where}, and epochs "
                "must increase. This happens when the query's checkpoint was reset or deleted, or when two "
                "queries write to one state directory; give the query a new state directory or restore its "
                "checkpoint."
            )
        if epoch == last:
            raise EpochSealedError(
                f"cannot {action} epoch {epoch}: it is already sealed in {self._where}. A replayed batch must "
                "skip its append (compare the batch id with last_sealed_epoch first)."
            )

    @db_errors("seal an epoch")
    def seal(self, epoch: int, descriptors: Iterable[SegmentDescriptor | None]) -> None:
        """Record ``epoch`` and its segments in one transaction: the checkpoint of the log store.

        Every descriptor must come from :func:`append_segment` for this epoch, and its file must be in the
        log store with the recorded size. Segments of the epoch that are not listed become garbage.
        """
        if epoch < 0:
            raise ValueError(f"epoch {epoch} is negative; epochs are Spark batch ids (0, 1, 2, ...)")
        descs = [d for d in descriptors if d is not None]
        self._check_unsealed(epoch, "seal")
        try:
            self._check_descriptors(epoch, descs)
        except SegmentError:  # a newer run's start sweeps a fenced run's unsealed segments: say that, not damage
            self.check_term(f"seal epoch {epoch}")
            raise
        sealed_at = time.time()
        # Durable in the home first, then fenced: a rebuild finds every epoch the database sealed, and a record a
        # fenced driver writes after the newer run read the home does not count (see logstore.home).
        self.home.write_epoch(epoch, self.term or 0, _epoch_record(descs, sealed_at))
        failpoint("logstore.seal.home_written")
        if guards.on("seal.term_after_home_record"):
            self.check_term(f"seal epoch {epoch}")
        with self.db.atomic():
            if guards.on("seal.order_under_transaction"):
                self._check_unsealed(epoch, "seal")  # again, under the write transaction
            self._insert_epoch(epoch, descs, sealed_at)
            failpoint("logstore.seal.before_commit")
        failpoint("logstore.seal.after_commit")

    def _check_descriptors(self, epoch: int, descs: list[SegmentDescriptor]) -> None:
        names = [d.name for d in descs]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise ValueError(f"seal of epoch {epoch}: segment {dup} is listed twice")
        prefix = segment.epoch_dir(epoch) + "/"
        for d in descs:
            if d.epoch != epoch or not d.name.startswith(prefix):
                raise ValueError(f"seal of epoch {epoch}: segment {d.name} was appended for epoch {d.epoch}")
            if d.sink_id != self.sink_id:
                raise ValueError(
                    f"seal of epoch {epoch}: segment {d.name} was appended for sink {d.sink_id!r}, "
                    f"not this one ({self.sink_id})"
                )
            bad = [v for v in d.vnodes if not 0 <= v < self.vnodes]
            if bad:
                raise ValueError(
                    f"seal of epoch {epoch}: segment {d.name} has vnodes {bad} outside 0..{self.vnodes - 1}"
                )
        if not descs:
            return
        present = dict(self.storage.list_files(segment.epoch_dir(epoch)))
        for d in descs:
            size = present.get(d.name)
            where = f"{self.storage.display(d.name)} (epoch {epoch}, vnodes {describe_vnodes(d.vnodes)})"
            if size is None:
                raise SegmentMissingError(f"cannot seal epoch {epoch}: segment {where} is not in the log store")
            if size != d.size:
                raise SegmentCorruptError(
                    f"cannot seal epoch {epoch}: segment {where} has {size} bytes, its writer recorded {d.size}"
                )
