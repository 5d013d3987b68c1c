"""Log store append/read throughput against the raw bandwidth of the same disk.

Not a test (pytest does not collect it). Run from the repository root::

    python tests/benchmarks/bench_logstore.py [--rows N] [--dir DIR] [--repeat K]

Each round appends one segment for a new epoch with ``append_segment`` and, right before and right after it,
writes the same number of bytes raw with the same durability steps (temp file, write, flush, fsync, rename,
fsync of the directory); the append ratio of the round is the mean raw write time over the append time. The
round then seals the epoch, reads it back through ``LogStore.read`` and reads the segment file raw (both warm:
the file was just written). Medians over the rounds are reported. Every file stays until the end of the run, so
no write reuses the blocks another one just freed (on thin-provisioned virtual disks that changes the speed).
See ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from logstore import VNODE_COLUMN, AppendTarget, LogLocation, LogStore, append_segment
from logstore.storage import fsync_dir

VNODES = 256
APPEND_GOAL = 0.7
READ_CHUNK = 4 * 2**20
MB = 1e6
EVENTS = ["click", "view", "search", "add_to_cart", "purchase", "refund", "signup", "logout"]


# -- data ------------------------------------------------------------------------------------------------


def _uniform_ints(n: int, high: int, seed: int, type_: pa.DataType) -> pa.Array:
    """``n`` pseudo-random integers in ``0..high-1`` (fixed seed)."""
    return pc.cast(pc.floor(pc.multiply(pc.random(n, initializer=seed), high)), type_)


def make_table(rows: int) -> pa.Table:
    """Rows as a Spark task would hand them over: not sorted by vnode."""
    ids = pa.array(range(rows), pa.int64())
    micros = pc.add(pc.multiply(ids, 1_000), 1_767_225_600_000_000)  # 2026-01-01, one row per millisecond
    return pa.table(
        {
            "id": ids,
            "user_id": _uniform_ints(rows, 1_000_000, 1, pa.int64()),
            "amount": pc.round(pc.multiply(pc.random(rows, initializer=2), 500.0), 2),
            "event": pa.array(EVENTS).take(_uniform_ints(rows, len(EVENTS), 3, pa.int32())),
            "ts": micros.cast(pa.timestamp("us", tz="UTC")),
            VNODE_COLUMN: _uniform_ints(rows, VNODES, 4, pa.int32()),
        }
    )


# -- environment -----------------------------------------------------------------------------------------


def filesystem_type(path: Path) -> tuple[str, str]:
    """``(mount point, filesystem type)`` holding ``path``, from /proc/self/mounts (Linux), else unknown."""
    target = os.path.realpath(path)
    best, best_len = ("?", "unknown"), -1
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return best
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        mount = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])  # space is \040
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= best_len:  # the last, longest match is the mount in effect
            best, best_len = (mount, fields[2]), len(mount)
    return best


MEMORY_FILESYSTEMS = {"tmpfs", "ramfs", "devtmpfs"}


def default_base_dir() -> Path:
    """The current directory, whose filesystem is normally a real disk (unlike /tmp on many systems)."""
    return Path.cwd()


def shm_dir() -> Path | None:
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and filesystem_type(shm)[1] in MEMORY_FILESYSTEMS:
        return shm
    return None


# -- raw baselines ---------------------------------------------------------------------------------------


def raw_write(directory: Path, data: bytes) -> float:
    """Seconds to write ``data`` durably: temp file, write, flush, fsync, rename, fsync the directory."""
    name = uuid.uuid4().hex
    tmp, final = directory / f".{name}.tmp", directory / f"{name}.raw"
    start = time.perf_counter()
    with open(tmp, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    fsync_dir(directory)
    return time.perf_counter() - start  # the file stays until the end of the run (see the module docstring)


def raw_read(path: Path) -> tuple[float, int]:
    """Seconds to read a whole file in READ_CHUNK pieces, and the bytes read."""
    total = 0
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(READ_CHUNK):
            total += len(chunk)
    return time.perf_counter() - start, total


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


# -- append breakdown ------------------------------------------------------------------------------------


def append_breakdown(
    target: AppendTarget, table: pa.Table, directory: Path
) -> tuple[dict[str, float], pa.RecordBatch, list[tuple[int, int, int]]]:
    """Seconds per stage of ``append_segment``, each stage redone separately with the log store's internals.

    The work of ``logstore/append.py`` done one stage after the other on the whole table: order check and
    stable sort by vnode (``sort_indices``, then ``logstore.reorder``: one ``take``, or two passes for large
    variable-width columns), run detection and dropping the vnode column, then
    ``segment.encode`` (IPC serialization and CRC-32 per block, footer), then ``storage.write_durable`` of the
    encoded parts on the benchmark's disk. ``append_segment`` does the same work group by group (``take`` and
    encode of about ``GROUP_BYTES`` of rows at a time) while a writer thread writes the previous groups, so
    one append takes less than the sum of these stages. Also returns the sorted rows and their vnode runs.
    """
    from logstore import segment, storage
    from logstore.append import _vnode_runs
    from logstore.reorder import Reorder

    stages: dict[str, float] = {}
    start = time.perf_counter()
    vnodes = table[VNODE_COLUMN].combine_chunks()
    in_order = pc.all(pc.greater_equal(vnodes[1:], vnodes[:-1])).as_py()
    stages["order check"] = time.perf_counter() - start

    start = time.perf_counter()
    order = None if in_order else pc.sort_indices(vnodes)
    stages["sort_indices (vnode column)"] = time.perf_counter() - start

    start = time.perf_counter()
    table = table.combine_chunks()
    if order is not None:
        table, vnodes = Reorder(table, order).take(0, table.num_rows), vnodes.take(order)
    stages["take (reorder all columns by vnode)"] = time.perf_counter() - start

    start = time.perf_counter()
    runs = _vnode_runs(vnodes, target, "benchmark")
    batches = table.drop_columns([VNODE_COLUMN]).to_batches()
    batch = batches[0] if len(batches) == 1 else pa.concat_batches(batches)
    stages["vnode runs + drop column"] = time.perf_counter() - start

    start = time.perf_counter()
    parts, _ = segment.encode(
        batch, runs, name="breakdown", epoch=0, sink_id=target.sink_id, max_block_bytes=target.max_block_bytes
    )
    stages["encode (IPC + CRC-32 + footer)"] = time.perf_counter() - start

    path = directory / f"{uuid.uuid4().hex}.seg"
    start = time.perf_counter()
    storage.write_durable(path, parts)
    stages["durable write (write+fsync+rename+dir fsync)"] = time.perf_counter() - start
    return stages, batch, runs  # the file stays until the end of the run


# -- compressed blocks -----------------------------------------------------------------------------------

CODECS = (None, "lz4", "zstd")
"""Block compressions compared by :func:`compression_tradeoff` (None: the segments as they are)."""


def compression_tradeoff(
    target: AppendTarget, batch: pa.RecordBatch, runs: list[tuple[int, int, int]], directory: Path
) -> dict[str, dict[str, float]]:
    """What compressing each block of a segment would cost and save: per codec, the segment's MB, the CPU
    seconds to encode its blocks (as the log store does: IPC serialization and CRC-32) and compress them, the
    seconds to write that many bytes durably, and the CPU seconds to decompress and decode the blocks again
    (what the file writer would add when reading them).

    ``batch`` and ``runs`` are the rows sorted by vnode and their vnode runs (:func:`append_breakdown`); the
    blocks are those the segment encoder makes of them, each compressed whole with pyarrow's codec, as a
    segment format with compressed blocks would store them. CPU time is the process's
    (``time.process_time``), so a codec's own threads count too.
    """
    from logstore import segment

    per_block = segment.rows_per_block(batch.nbytes, batch.num_rows, target.max_block_bytes)
    results: dict[str, dict[str, float]] = {}
    for codec in CODECS:
        start = time.process_time()
        encoded = []
        encoder = segment.SegmentEncoder(name="tradeoff", epoch=0, sink_id=target.sink_id)
        for buf in encoder.blocks(batch, runs, per_block):
            encoded.append((pa.compress(buf, codec=codec, asbytes=False), buf.size) if codec else (buf, buf.size))
        encode = time.process_time() - start
        size = sum(buf.size for buf, _ in encoded)
        write = raw_write(directory, os.urandom(size))
        start = time.process_time()
        for buf, raw_size in encoded:
            plain = pa.decompress(buf, raw_size, codec=codec, asbytes=False) if codec else buf
            pa.ipc.read_record_batch(plain, batch.schema)
        decode = time.process_time() - start
        results[codec or "none (today)"] = {"MB": size / MB, "encode": encode, "write": write, "decode": decode}
    return results


# -- main ------------------------------------------------------------------------------------------------


def median(values: list[float]) -> float:
    return statistics.median(values)


def mbps(size: int, seconds: float) -> float:
    return size / MB / seconds if seconds > 0 else float("inf")


def spread(values: list[float]) -> str:
    return f"{min(values):.0f}-{max(values):.0f}"


def run(rows: int, base: Path, repeat: int) -> None:
    mount, fstype = filesystem_type(base)
    print(f"log store benchmark: {rows:,} rows, {repeat} round(s), {VNODES} vnodes (random __vnode values)")
    print(
        f"python {platform.python_version()}, pyarrow {pa.__version__} (memory pool "
        f"{pa.default_memory_pool().backend_name}), {os.cpu_count()} CPU(s)"
    )
    print(f"disk: {base} (filesystem {fstype}, mounted at {mount})")
    if fstype in MEMORY_FILESYSTEMS:
        print(f"WARNING: {base} is on {fstype}, i.e. memory: this does not measure a disk. Pass --dir on a disk.")

    elapsed, table = timed(lambda: make_table(rows))
    types = ", ".join(f"{f.name} {f.type}" for f in table.schema)
    print(f"table: generated in {elapsed:.2f} s, {table.nbytes / MB:.1f} MB in memory ({types})")

    # Per round: one segment, two raw files, one breakdown file and the compressed-block files (at most two
    # segments' worth), all kept; plus the warm-up segment.
    needed = int(table.nbytes * (6 * repeat + 1) * 1.1)
    free = shutil.disk_usage(base).free
    if free < needed:
        raise SystemExit(
            f"{base} has {free / MB:.0f} MB free; this run keeps about {needed / MB:.0f} MB of files until it ends. "
            "Use fewer --rows or --repeat, or another --dir."
        )

    work = Path(tempfile.mkdtemp(prefix="bench_logstore-", dir=base))
    shm = shm_dir()
    shm_work = Path(tempfile.mkdtemp(prefix="bench_logstore-", dir=shm)) if shm is not None else None
    try:
        store = LogStore.open(work / "state", vnodes=VNODES)
        raw_dir, scratch = work / "raw", work / "scratch"
        raw_dir.mkdir()
        scratch.mkdir()
        fsync_dir(work)

        # Warm-up epoch, not counted: the first append in a process also pays for the allocator's first growth.
        cold, desc = timed(lambda: append_segment(store.target, 0, table, writer_id="bench"))
        store.seal(0, [desc])
        for item in store.read(range(0, VNODES), -1, 0):
            _ = item.batch.num_rows
        size = desc.size
        blocks = sum(len(r.blocks) for r in desc.runs)
        print(
            f"segment: {size / MB:.1f} MB ({size:,} bytes), {blocks} blocks over {len(desc.runs)} vnodes; "
            f"warm-up append (not counted): {cold:.2f} s"
        )
        payload = os.urandom(size)
        shm_target = AppendTarget(LogLocation(str(shm_work)), VNODES, store.sink_id) if shm_work else None

        keys = ("append", "raw_write", "read", "raw_read", "append_ratio", "read_ratio")
        results: dict[str, list[float]] = {k: [] for k in keys}
        raw_writes: list[float] = []
        shm_appends: list[float] = []
        breakdowns: list[dict[str, float]] = []
        tradeoffs: list[dict[str, dict[str, float]]] = []
        append_cpu: list[tuple[float, float]] = []  # (user, kernel) CPU seconds of each append, all threads
        print()
        print("MB/s, MB = 10^6 bytes of the segment file; raw write = before / after the append")
        print(f"{'round':>5} | {'append':>7} {'raw write':>11} {'ratio':>6} | {'read':>7} {'raw read':>8} {'ratio':>6}")
        for epoch in range(1, repeat + 1):
            t_before = raw_write(raw_dir, payload)
            cpu = os.times()
            t_append, desc = timed(lambda e=epoch: append_segment(store.target, e, table, writer_id="bench"))
            cpu_after = os.times()
            append_cpu.append((cpu_after.user - cpu.user, cpu_after.system - cpu.system))
            t_after = raw_write(raw_dir, payload)
            t_raw_write = (t_before + t_after) / 2
            store.seal(epoch, [desc])

            def read_back(e: int = epoch) -> int:
                n = 0
                for item in store.read(range(0, VNODES), e - 1, e):
                    n += item.batch.num_rows
                return n

            t_read, read_rows = timed(read_back)
            if read_rows != rows:
                raise SystemExit(f"read back {read_rows} rows of epoch {epoch}, appended {rows}")
            t_raw_read, raw_bytes = raw_read(Path(store.storage.display(desc.name)))
            if raw_bytes != desc.size:
                raise SystemExit(f"raw read of {desc.name}: {raw_bytes} bytes, its descriptor says {desc.size}")

            r = results
            r["append"].append(mbps(size, t_append))
            r["raw_write"].append(mbps(size, t_raw_write))
            r["read"].append(mbps(size, t_read))
            r["raw_read"].append(mbps(size, t_raw_read))
            r["append_ratio"].append(t_raw_write / t_append)
            r["read_ratio"].append(t_raw_read / t_read)
            raw_writes += [mbps(size, t_before), mbps(size, t_after)]
            raw_pair = f"{mbps(size, t_before):.0f}/{mbps(size, t_after):.0f}"
            print(
                f"{epoch:>5} | {r['append'][-1]:>7.0f} {raw_pair:>11} {r['append_ratio'][-1]:>6.2f} | "
                f"{r['read'][-1]:>7.0f} {r['raw_read'][-1]:>8.0f} {r['read_ratio'][-1]:>6.2f}"
            )

            # For the breakdown, after the side-by-side measurements so as not to disturb them.
            if shm_target is not None and shm_work is not None:
                t_shm, shm_desc = timed(lambda e=epoch: append_segment(shm_target, e, table, writer_id="bench"))
                shm_appends.append(t_shm)
                os.unlink(shm_work / shm_desc.name)
            try:
                stages, sorted_rows, runs = append_breakdown(store.target, table, scratch)
                breakdowns.append(stages)
                tradeoffs.append(compression_tradeoff(store.target, sorted_rows, runs, scratch))
            except Exception as e:  # the breakdown uses internals; never let it sink the benchmark
                if not breakdowns:
                    print(f"      (append breakdown unavailable: {type(e).__name__}: {e})")

        med = {k: median(v) for k, v in results.items()}
        goal_met = med["append_ratio"] >= APPEND_GOAL
        t_append_med = size / MB / med["append"]
        print()
        print(f"median of {repeat} round(s), {size / MB:.1f} MB segment of {rows:,} rows:")
        print(f"  append               {med['append']:7.0f} MB/s  {t_append_med:.3f} s")
        print(
            f"    CPU of the append    user {median([u for u, _ in append_cpu]):.3f} s, kernel "
            f"{median([k for _, k in append_cpu]):.3f} s (all threads; the kernel's share is mostly copying the "
            "segment into the page cache)"
        )
        print(f"  raw write + fsync    {med['raw_write']:7.0f} MB/s  {size / MB / med['raw_write']:.3f} s")
        print(
            f"  append / raw write   {med['append_ratio']:7.2f}       goal >= {APPEND_GOAL}: "
            f"{'met' if goal_met else 'NOT met'}"
        )
        print(f"  read (warm)          {med['read']:7.0f} MB/s  {size / MB / med['read']:.3f} s")
        print(f"  raw read (warm)      {med['raw_read']:7.0f} MB/s  {size / MB / med['raw_read']:.3f} s")
        print(f"  read / raw read      {med['read_ratio']:7.2f}")
        print(
            "  note: both reads are warm (the segment was just written and is in the page cache), so they measure\n"
            "  the CPU cost of reading (one open per segment, pread per block, CRC-32, IPC decode), not the disk."
        )
        if max(raw_writes) > 2 * min(raw_writes):
            print(
                f"  note: raw write bandwidth varied more than 2x in this run ({spread(raw_writes)} MB/s), as on\n"
                "  thin-provisioned virtual disks; ratios are noisy, use --repeat 10 or more for a stable figure."
            )

        print()
        print("append breakdown, median seconds (stages redone one by one with the internals of logstore/append.py;")
        print("append_segment overlaps the CPU stages with the durable write, so it takes less than their sum):")
        if shm_appends:
            t_shm = median(shm_appends)
            print(
                f"  {'append_segment to tmpfs (all but the disk)':<46} {t_shm:.3f} s  "
                f"= {t_shm / t_append_med:.0%} of the append on disk"
            )
        if breakdowns:
            stage_medians = {k: median([b[k] for b in breakdowns]) for k in breakdowns[0]}
            total = sum(stage_medians.values())
            for key, value in stage_medians.items():
                print(f"  {key:<46} {value:.3f} s  {value / total:4.0%}")
            print(f"  {'sum of stages':<46} {total:.3f} s")
        if tradeoffs:
            print()
            print("compressed blocks, medians (each block compressed whole with pyarrow's codec; CPU seconds of this")
            print("process; the write is of that many bytes with the durable steps; decode is what reading adds):")
            print(f"  {'codec':<14} {'MB':>7} {'encode s':>9} {'write s':>8} {'encode+write':>13} {'decode s':>9}")
            for codec in tradeoffs[0]:
                m = {k: median([t[codec][k] for t in tradeoffs]) for k in tradeoffs[0][codec]}
                print(
                    f"  {codec:<14} {m['MB']:>7.1f} {m['encode']:>9.3f} {m['write']:>8.3f} "
                    f"{m['encode'] + m['write']:>13.3f} {m['decode']:>9.3f}"
                )
        if not goal_met:
            print(
                f"append ratio {med['append_ratio']:.2f} is below {APPEND_GOAL}: the CPU work (sort/take and encode) "
                "is not hidden behind the disk write and fsync; see the breakdown."
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if shm_work is not None:
            shutil.rmtree(shm_work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Log store append/read throughput against raw disk bandwidth.")
    parser.add_argument("--rows", type=int, default=2_000_000, help="rows per segment (default 2,000,000)")
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="a directory on the disk to measure; a temp dir is made in it and removed (default: the current dir)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="rounds; medians are reported (default 3)")
    args = parser.parse_args(argv)
    if args.rows < 1 or args.repeat < 1:
        parser.error("--rows and --repeat must be at least 1")
    base = (args.dir or default_base_dir()).resolve()
    if not base.is_dir():
        parser.error(f"--dir {base} is not a directory")
    run(args.rows, base, args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
