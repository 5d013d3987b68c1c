"""Whether the log store's location honours a conditional create: probed at every start, never assumed.

A run owns the sink through the newest writer term record, ``home/terms/<T>.json``, which it creates only if
absent (:meth:`logstore.home.DurableHome.take_term`). That is exclusive only where the store honours the
condition: a hard link on local disk, a PUT with ``If-None-Match: *`` on S3. Some S3 servers ignore the header
(``rclone serve s3`` replaces the object and answers 200) or refuse it (501 NotImplemented), and then
:meth:`~logstore.storage.Storage.create` is a check, then a write: two runs starting together can take the same
term, both believe they own the sink, and fencing no longer stops either.

:func:`probe_conditional_create` asks the store itself, with no list of servers: it creates a probe object under
the durable home, creates the same key again with the condition only (no check first), and deletes it: two PUTs
and one DELETE on S3. :func:`require_conditional_create` turns the answer into the start's decision: a store
that does not honour the condition stops the start with :class:`~logstore.errors.ConditionalCreateError`, unless
the operator accepted single-driver operation (``single_driver=True``), which logs a warning and goes on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from enum import StrEnum

from .errors import ConditionalCreateError
from .home import HOME, TERMS
from .storage import FsspecStorage, PutAnswer, Storage

log = logging.getLogger(__name__)

PROBE_DIR = f"{HOME}/probe"
"""Where the probe object goes, as ``<PROBE_DIR>/<random>.json`` (a new name each time, so that two runs probing
at once never see each other's object). The probe deletes it; one left by a run killed while probing is
harmless (nothing reads ``home/probe/``) and may be deleted."""

SINGLE_DRIVER = (
    "single_driver=True (the sink's option; on the command line `filesink run --single-driver` and "
    "`filesink recover apply --single-driver`)"
)
"""The option that accepts single-driver operation, as every message names it."""


class ConditionalCreate(StrEnum):
    """What the store does with a second conditional create of an object that exists."""

    HONOURED = "honoured"
    """It refused the write (S3: 412 PreconditionFailed; local disk: the hard link found the name taken)."""
    IGNORED = "ignored"
    """It wrote anyway: the object was replaced, as if there had been no condition."""
    REFUSED = "refused"
    """It does not support the condition (S3: 501 NotImplemented and the like)."""


@dataclass(frozen=True)
class ProbeResult:
    """The outcome of :func:`probe_conditional_create`, with what the store answered."""

    outcome: ConditionalCreate
    where: str
    """The probe object's full path or URL (:meth:`~logstore.storage.Storage.display`)."""
    seen: str
    """The store's answer that decided: ``HTTP 412 PreconditionFailed``, ``HTTP 200``, ``HTTP 501 NotImplemented``."""
    server: str | None = None
    """The S3 endpoint (None: AWS's default endpoint, or not S3)."""

    @property
    def honoured(self) -> bool:
        return self.outcome is ConditionalCreate.HONOURED

    def saw(self) -> str:
        """What the probe saw, in words."""
        if self.outcome is ConditionalCreate.HONOURED:
            return f"a second conditional create of {self.where} was refused ({self.seen}): the condition is honoured"
        if self.outcome is ConditionalCreate.IGNORED:
            return (
                f"a second conditional create of {self.where}, which existed, succeeded ({self.seen}): the server "
                "ignored the condition and replaced the object"
            )
        return f"a conditional create of {self.where} was refused as unsupported ({self.seen})"


def _server(storage: Storage) -> str | None:
    if not isinstance(storage, FsspecStorage):
        return None
    fs = storage.fs
    endpoint = getattr(fs, "endpoint_url", None) or (getattr(fs, "client_kwargs", None) or {}).get("endpoint_url")
    return str(endpoint) if endpoint else None


def probe_conditional_create(storage: Storage) -> ProbeResult:
    """Whether ``storage`` honours a conditional create, asked of the store itself: create a probe object under
    the durable home (``home/probe/<random>.json``) with the condition, create it again with the condition only
    (no check first: :meth:`~logstore.storage.Storage.conditional_put`), then delete it.

    Two PUTs and one DELETE on S3 (one PUT and no DELETE where the first create is refused). A store that answers
    a create of a new object as if the object existed cannot create anything: :class:`ConditionalCreateError`. An
    object that holds the probe's own bytes after such an answer is a create whose answer was lost and retried (an
    S3 fault campaign met it): the probe starts again once on a new name, and refuses only a second such answer.
    Errors of the store (unreachable, no permission) raise ``OSError`` naming the probe object; the probe object
    is deleted whatever happens after it was written."""
    server = _server(storage)

    def record(attempt: int) -> bytes:
        return json.dumps({"probe": "conditional create", "attempt": attempt, "at": time.time()}).encode()

    for tries in range(2):
        relpath = f"{PROBE_DIR}/{uuid.uuid4().hex}.json"
        where = storage.display(relpath)
        written = False
        try:
            mine = record(1)
            first = storage.conditional_put(relpath, mine)
            if first.answer is PutAnswer.REFUSED:
                return ProbeResult(ConditionalCreate.REFUSED, where, first.seen, server)
            written = True  # an EXISTS here is a store that claims a new name exists: delete whatever is there
            if first.answer is PutAnswer.EXISTS and tries == 0 and _holds(storage, relpath, mine):
                # The object holds this probe's own bytes under a random name: most likely the create went
                # through, its answer was lost and the client's retry met it. Probe once more on a new name; a
                # store that answers so every time is refused below.
                storage.delete(relpath)
                continue
            if first.answer is PutAnswer.EXISTS:
                raise ConditionalCreateError(
                    f"the sink's durable home at {storage.display(HOME)} is on {_store(storage, server)}, which "
                    f"answered a conditional create of a new object, {where}, as if the object existed ({first.seen}). "
                    f"With such answers the sink cannot create the records it owns the sink by "
                    f"({storage.display(TERMS)}/<T>.json): the server gets conditional create (PUT with If-None-Match: "
                    "*) wrong. Use a server that supports it (AWS S3, MinIO, SeaweedFS, or a newer version of this "
                    "one). Nothing of the sink was written."
                )
            second = storage.conditional_put(relpath, record(2))
        except BaseException:
            if written:
                with contextlib.suppress(Exception):  # the error that stopped the probe is the one to report
                    storage.delete(relpath)
            raise
        storage.delete(relpath)
        outcome = {
            PutAnswer.EXISTS: ConditionalCreate.HONOURED,
            PutAnswer.CREATED: ConditionalCreate.IGNORED,
            PutAnswer.REFUSED: ConditionalCreate.REFUSED,
        }[second.answer]
        return ProbeResult(outcome, where, second.seen, server)
    raise AssertionError("not reached: the second probe returns or raises")


def _holds(storage: Storage, relpath: str, data: bytes) -> bool:
    """Whether the object at ``relpath`` holds exactly ``data`` (False if it cannot be read)."""
    try:
        return storage.read_all(relpath) == data
    except OSError:
        return False


def _store(storage: Storage, server: str | None) -> str:
    """The store, as a message names it: the S3 server's endpoint where there is one."""
    if server:
        return f"the S3 server at {server}"
    return "the object store" if isinstance(storage, FsspecStorage) else "the file system"


def not_honoured_message(storage: Storage, probe: ProbeResult) -> str:
    """What :func:`require_conditional_create` says about a store that does not honour the condition."""
    return (
        f"the sink's durable home at {storage.display(HOME)} is on {_store(storage, probe.server)}, which does not "
        "support conditional create: PUT with If-None-Match: * (create an object only if it does not exist). The "
        f"probe at start saw it: {probe.saw()}. The sink's ownership rests on it: each start (and `filesink recover "
        f"apply`) creates the next writer term record in {storage.display(TERMS)} only if it is absent. Without the "
        "condition, two drivers starting at the same time could take the same term and both own the sink; fencing "
        "then stops neither, and rows can be written twice to the output or lost. Nothing of the sink was changed "
        "(the probe object was deleted). Either use a store that honours the condition (AWS S3, MinIO, SeaweedFS, a "
        "newer version of this server, or a local or shared file system) or accept single-driver operation with "
        f"{SINGLE_DRIVER}. With it you promise that at most one driver or recover command runs on this sink at a "
        "time: nothing fences a second one."
    )


_warned: set[str] = set()
_warned_lock = threading.Lock()


def require_conditional_create(storage: Storage, *, single_driver: bool) -> None:
    """Probe ``storage`` (:func:`probe_conditional_create`) and stop unless it honours conditional create.

    A store that ignores or refuses the condition raises :class:`ConditionalCreateError` saying where, what the
    probe saw, why ownership needs it and how to go on; with ``single_driver`` (the operator's promise that at
    most one driver or recover command runs at a time), it logs a warning instead (once per location and
    process) and returns."""
    probe = probe_conditional_create(storage)
    if probe.honoured:
        return
    if not single_driver:
        raise ConditionalCreateError(not_honoured_message(storage, probe))
    location = storage.display(HOME)
    with _warned_lock:
        if location in _warned:
            return
        _warned.add(location)
    log.warning(
        "the sink's durable home at %s is on %s, which does not support conditional create (PUT with If-None-Match: "
        "*): %s. Going on in single-driver operation (single_driver=True): nothing fences a second driver or recover "
        "command of this sink, so never run two at a time.",
        location,
        _store(storage, probe.server),
        probe.saw(),
    )
