"""``recover move-log-store``: record that the sink's log store was moved on purpose (the output's claim, then the
state directory's database), refused if the old location was used after the copy; and what it prints."""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import time
from pathlib import Path
from typing import Any

from filesink.committer.ledger import Ledger
from filesink.errors import EXIT_OK, LogStoreMovedError, SinkLockedError
from filesink.lock import StateLock, lock_holder
from filesink.output import OutputLocation
from filesink.output.claim import CLAIM_NAME, move_claim, read_claim
from logstore import LogLocation, LogStore, NoLogStoreError
from logstore.home import CLAIM_FILE, FILES, SINK_RECORD, DurableHome, HomeView, describe_age
from logstore.statedb import STATE_DB_NAME, connect, translated
from logstore.storage import is_local

from .errors import NotASinkError
from .lease import OWNER_LEASE
from .opening import storage_options_of


def _options_for(url: str, options: dict[str, Any]) -> dict[str, Any]:
    return {} if is_local(url) else options


def _home_at(url: str, options: dict[str, Any], sink_id: str) -> DurableHome | None:
    """The durable home of sink ``sink_id`` at ``url``, or None if the location holds none (gone, or another's)."""
    storage = LogLocation(url, _options_for(url, options)).open()
    try:
        claim = json.loads(storage.read_all(CLAIM_FILE))
    except (FileNotFoundError, ValueError):
        return None
    return DurableHome(storage) if isinstance(claim, dict) and claim.get("sink_id") == sink_id else None


def _newest(home: DurableHome) -> tuple[int, int]:
    """(newest writer term, last sealed epoch) a durable home records (0 and -1 for none)."""
    return home.newest_term() or 0, max(home.epoch_numbers(), default=-1)


def _live_run(home: DurableHome) -> tuple[int, float] | None:
    """(term, seconds since it was alive) of a run that may still be working on ``home``: renewed within the lease
    and not stopped cleanly, unless it ran on this machine and its state directory's lock is free (it is gone)."""
    found = home.live_owner(OWNER_LEASE)
    if found is None:
        return None
    term, age, record = found
    state = record.get("state")
    if (
        record.get("host") == socket.gethostname()
        and isinstance(state, str)
        and Path(state).is_absolute()
        and Path(state).name == STATE_DB_NAME
        and lock_holder(Path(state).parent) is None
    ):
        return None
    return term, age


def _set_aside(state_dir: Path) -> Path:
    """Move the state database out of the way (its write-ahead log checkpointed into it first, so that the one
    file holds it all); return where it went."""
    path = state_dir / STATE_DB_NAME
    with translated(str(path), "checkpoint the state database before setting it aside"):
        db = connect(path)
        try:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            db.close()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    aside = state_dir / f"{STATE_DB_NAME}.before-move-{stamp}"
    n = 1
    while aside.exists():
        n += 1
        aside = state_dir / f"{STATE_DB_NAME}.before-move-{stamp}-{n}"
    path.rename(aside)
    for suffix in ("-wal", "-shm"):  # empty after the checkpoint; never to be paired with a new database
        with contextlib.suppress(FileNotFoundError):
            path.with_name(path.name + suffix).unlink()
    return aside


def _rebuild(state_dir: Path, url: str, options: dict[str, Any]) -> None:
    """A state database in ``state_dir`` rebuilt from the durable home at ``url`` (nothing is written there), as
    ``recover apply --state-dir DIR --log-store URL`` rebuilds it; the sink's start goes on from it."""
    store = LogStore.open(state_dir, url, storage_options=_options_for(url, options) or None, require_home=True)
    try:
        ledger = Ledger(store)
        ledger.config_from_home()
        store.sync_from_home(adopt=False)
        ledger.sync_pending()
    finally:
        store.close()


def _not_in_home(state_dir: Path, options: dict[str, Any], home: HomeView, files: set[str]) -> list[str]:
    """What the state database holds that the durable home does not (sealed before the sink had a durable home):
    a rebuild from the home would lose it."""
    store = LogStore.open_existing(state_dir, storage_options=options, readonly=True)
    try:
        held = {epoch for _, epoch, *_ in store.backlog_changes(None).rows}
        pending = set(Ledger(store).pending_names())
    finally:
        store.close()
    epochs = {int(r["epoch"]) for r in home.epochs}
    return [f"sealed epoch {e}" for e in sorted(held - epochs)] + [f"pending file {n}" for n in sorted(pending - files)]


def move_log_store(args: argparse.Namespace) -> int:
    """``recover move-log-store``: check, then rewrite the output's claim, then the state database; each step is
    skipped when it is done already, so a run that was interrupted is finished by running it again."""
    options = storage_options_of(args)
    state_dir = Path(args.state_dir).absolute() if args.state_dir else None
    if args.log_store:
        url = str(args.log_store)
    else:
        assert state_dir is not None  # recover() asks for one of the two
        url = str(state_dir / "log")
    try:
        new_store = LogStore.from_home(url, storage_options=_options_for(url, options))
    except NoLogStoreError as e:
        raise NotASinkError(f"{url} is not a sink's log store: {e}") from None
    try:
        sink_id, new, home = new_store.sink_id, new_store.location.canonical, new_store.home
        record = home.read(SINK_RECORD)
        if not isinstance(record, dict) or "output" not in record:
            raise NotASinkError(f"{new} holds no record of the sink's output ({home.storage.display(SINK_RECORD)})")
        view = home.view()
        files = {p.removeprefix(FILES + "/").removesuffix(".json") for p in home.names(FILES)}
        new_term, new_epoch = _newest(home)
    finally:
        new_store.close()
    output_url = str(record["output"])
    output = OutputLocation(output_url, _options_for(output_url, options))
    claim = read_claim(output)
    if claim is not None and claim.sink_id != sink_id:
        move_claim(output, sink_id, None, new)  # raises OutputClaimedError: another sink's output
    recorded = LogStore.recorded_location(state_dir) if state_dir is not None else None
    olds = sorted({x for x in (claim.log_store if claim else None, recorded) if x is not None and x != new})
    if len(olds) > 1:
        raise LogStoreMovedError(
            f"the output {output_url} names the log store of sink {sink_id} at {olds[0]}, and the state database in "
            f"{state_dir} records it at {olds[1]}: it is unclear which one the log store at {new} was moved from. "
            "Nothing was changed. Give the state directory that goes with the output's claim, or none."
        )
    old = olds[0] if olds else None
    old_home = _home_at(old, options, sink_id) if old is not None else None
    if old_home is not None:
        old_term, old_epoch = _newest(old_home)
        if old_term > new_term or old_epoch > new_epoch:
            raise LogStoreMovedError(
                f"the log store at {old} was used after it was copied to {new}: its durable home holds writer term "
                f"{old_term} and sealed epoch {old_epoch}, the copy only term {new_term} and epoch {new_epoch}. "
                f"Moving now would lose what the sink did there since. Nothing was changed. Stop every query that "
                f"uses {old}, then copy it to {new} again (replacing the copy) and run this again; or go on with the "
                f"log store at {old}."
            )
        alive = _live_run(old_home)
        if alive is not None:
            raise SinkLockedError(
                f"a run of sink {sink_id} with its log store at {old} holds writer term {alive[0]} and was "
                f"{describe_age(alive[1])}: it may still write there, and moving the log store now would leave two "
                f"runs that do not fence each other. Nothing was changed. Stop the query, copy {old} to {new} again "
                f"(replacing the copy), and run this again (a run killed without stopping counts as alive for "
                f"{OWNER_LEASE:.0f} s, unless it ran on this machine)."
            )
    if state_dir is not None:
        state_dir.mkdir(parents=True, exist_ok=True)  # a new state directory: rebuilt from the new location
    lock = StateLock(state_dir) if state_dir is not None else None
    try:
        if state_dir is not None and recorded is not None and recorded != new:
            missing = _not_in_home(state_dir, options, view, files)
            if missing:
                raise LogStoreMovedError(
                    f"the state database in {state_dir} holds what the durable home at {new} does not record "
                    f"({', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}): it was sealed before the sink "
                    f"had a durable home, and a rebuild from the home would lose it. Nothing was changed. Start the "
                    f"sink once with its log store at {recorded} (that makes it durable there), stop it, copy the "
                    "log store again and run this again."
                )
        moved = move_claim(output, sink_id, old, new)
        database = None
        if state_dir is not None:
            aside = _set_aside(state_dir) if recorded is not None and recorded != new else None
            if recorded != new:
                _rebuild(state_dir, url, options)
            database = {"recorded": recorded, "set_aside": str(aside) if aside else None, "rebuilt": recorded != new}
    finally:
        if lock is not None:
            lock.release()
    result = {
        "sink_id": sink_id,
        "output": output_url,
        "from": old,
        "to": new,
        "claim_moved": moved,
        "state_database": database,
        "old_home": None if old_home is None else {"writer_term": old_term, "last_sealed_epoch": old_epoch},
    }
    print(json.dumps(result, indent=2)) if args.json else _print_move(result, state_dir)
    return EXIT_OK


def _print_move(r: dict[str, Any], state_dir: Path | None) -> None:
    new = r["to"]
    print(f"sink {r['sink_id']}: its log store is at {new}" + (f" (moved from {r['from']})" if r["from"] else ""))
    claim = "now names" if r["claim_moved"] else "already named"
    print(f"  output {r['output']}: its claim ({CLAIM_NAME}) {claim} the log store at {new}")
    d = r["state_database"]
    if d is not None:
        if not d["rebuilt"]:
            print(f"  state directory {state_dir}: its database already records the log store at {new}")
        elif d["set_aside"]:
            print(
                f"  state directory {state_dir}: its database recorded the log store at {d['recorded']}; set aside "
                f"as {d['set_aside']}, and rebuilt from the durable home at {new}"
            )
        else:
            print(f"  state directory {state_dir}: its database was rebuilt from the durable home at {new}")
    if r["from"] is not None and r["old_home"] is None:
        print(f"  {r['from']}: holds no durable home of this sink (any more)")
    elif r["from"] is not None:
        print(
            f"  {r['from']}: still holds the durable home it was copied from (not newer than the copy). Do not use it "
            "again: a sink started with its log store there is refused. Delete it once the sink runs from the new "
            "location"
        )
    where = f" and its state directory {state_dir}" if state_dir is not None else ""
    print(f"start the sink with its log store at {new} (log_store=, filesink run --log-store){where}")
