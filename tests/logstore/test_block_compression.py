"""Blocks of a log store on an object store are compressed (zstd, each block's message compressed whole); a local log
store's are not. Every kind decodes to the same rows, including the per-buffer Arrow IPC body compression of
format 1 segments, a segment may hold several kinds, and the checks of a block (length, CRC-32) are of the bytes
as stored, so a changed compressed byte is found before it is decoded."""

from __future__ import annotations

import json
import struct
import zlib

import pyarrow as pa
import pytest

from logstore import LogLocation, LogStore, read_plan
from logstore.append import OBJECT_STORE_COMPRESSION, compression_for
from logstore.errors import SegmentCorruptError
from logstore.segment import (
    MAGIC,
    TRAILER_SIZE,
    Block,
    SegmentEncoder,
    block_problem,
    decode_block,
    encode,
    parse_file,
    serialize_block,
)
from logstore.storage import SEGMENT_CONTENT_TYPE


def rows(n: int, first: int = 0) -> pa.RecordBatch:
    return pa.record_batch(
        {
            "id": pa.array(range(first, first + n), pa.int64()),
            "text": [f"user-{i % 50} clicked item {i % 7} on page {i % 3}" for i in range(first, first + n)],
            "maybe": pa.array([None if i % 5 == 0 else i * 0.5 for i in range(first, first + n)]),
        }
    )


@pytest.mark.parametrize("codec", ["zstd", "lz4", "ipc:zstd", "ipc:lz4"])
def test_a_compressed_block_decodes_to_the_same_rows_and_is_smaller(codec):
    batch = rows(5000)
    plain, packed = serialize_block(batch, None), serialize_block(batch, codec)
    assert packed.size < plain.size / 2
    assert decode_block(packed.to_pybytes(), batch.schema).equals(batch)
    assert decode_block(plain.to_pybytes(), batch.schema).equals(batch)
    # whole-block kinds carry a header naming the codec; the IPC kind is an IPC message (continuation marker)
    head = packed.to_pybytes()[:4]
    assert head == ({"zstd": b"ZSTD", "lz4": b"LZ4F"}.get(codec) or b"\xff\xff\xff\xff")


def test_one_segment_may_hold_plain_and_compressed_blocks():
    """A segment is described block by block: an encoder's setting may differ from block to block (as a log store
    written before compression, with format 1's compression and now differ from segment to segment)."""
    encoder = SegmentEncoder(name="00000000000000000000/w.seg", epoch=0, sink_id="s")
    parts = [encoder.block(0, rows(100)), encoder.block(1, rows(100, 100))]
    encoder.compression = "ipc:zstd"
    parts.append(encoder.block(2, rows(100, 200)))
    encoder.compression = "zstd"
    parts.append(encoder.block(3, rows(100, 300)))
    schema = rows(400).schema
    encoder.finish(schema)
    blocks = [b for run in encoder.descriptor.runs for b in run.blocks]
    assert [b.rows for b in blocks] == [100, 100, 100, 100]
    got = [decode_block(p.to_pybytes(), schema) for p in parts]
    assert pa.Table.from_batches(got).equals(pa.Table.from_batches([rows(400)]))


def test_an_unknown_compression_is_refused():
    with pytest.raises(ValueError, match="unknown block compression 'brotli'"):
        serialize_block(rows(10), "brotli")


def test_a_compressed_block_that_does_not_decompress_is_an_error_not_rows():
    """Bytes that pass their checks but do not decompress (a writer's bug, not damage) raise the error the reader
    turns into SegmentCorruptError with the segment named; they never decode to other rows."""
    batch = rows(500)
    packed = bytearray(serialize_block(batch, "zstd").to_pybytes())
    with pytest.raises((pa.ArrowInvalid, OSError)):
        decode_block(bytes(packed[:20]), batch.schema)  # cut short
    longer = bytes(packed[:4]) + struct.pack("<Q", 10 * len(packed)) + bytes(packed[12:])
    with pytest.raises((pa.ArrowInvalid, OSError)):
        decode_block(longer, batch.schema)  # the header's length is not the message's
    with pytest.raises((pa.ArrowInvalid, OSError)):
        decode_block(b"ZSTD\x01", batch.schema)  # shorter than the header


def _footer(data: bytes) -> tuple[int, dict[str, object]]:
    """Where a segment file's footer starts, and its JSON."""
    footer_len, _ = struct.unpack_from("<II", data, len(data) - TRAILER_SIZE)
    start = len(data) - TRAILER_SIZE - footer_len
    return start, json.loads(data[start : len(data) - TRAILER_SIZE])


def _with_format(data: bytes, version: object) -> bytes:
    """A segment file's bytes with its footer's format number changed (and its checksum made to match)."""
    start, meta = _footer(data)
    meta["format"] = version
    footer = json.dumps(meta, separators=(",", ":")).encode()
    return data[:start] + footer + struct.pack("<II", len(footer), zlib.crc32(footer)) + MAGIC


def test_segments_of_format_1_are_read_and_an_unknown_format_is_refused():
    batch = rows(300)
    kwargs = {"name": "00000000000000000000/w.seg", "epoch": 0, "sink_id": "s", "max_block_bytes": 2**30}
    old_parts, _ = encode(batch, [(0, 0, 300)], compression="ipc:zstd", **kwargs)
    old = _with_format(b"".join(bytes(p) for p in old_parts), 1)
    described = parse_file(old, where="old.seg")
    block = described.runs[0].blocks[0]
    assert decode_block(old[block.offset : block.offset + block.length], batch.schema).equals(batch)
    new_parts, _ = encode(batch, [(0, 0, 300)], compression="zstd", **kwargs)
    new = b"".join(bytes(p) for p in new_parts)
    assert _footer(new)[1]["format"] == 2
    assert parse_file(new, where="new.seg").rows == 300
    with pytest.raises(SegmentCorruptError, match=r"new\.seg: unknown segment format 3 \(this version reads"):
        parse_file(_with_format(new, 3), where="new.seg")


def test_a_changed_byte_of_a_compressed_block_is_found_by_its_checksum():
    batch = rows(2000)
    parts, descriptor = encode(
        batch,
        [(0, 0, 2000)],
        name="00000000000000000000/w.seg",
        epoch=0,
        sink_id="s",
        max_block_bytes=2**30,
        compression="zstd",
    )
    block = descriptor.runs[0].blocks[0]
    data = bytearray(parts[1].to_pybytes())
    assert block_problem(bytes(data), block) is None
    data[len(data) // 2] ^= 0x01
    assert "checksum mismatch" in (block_problem(bytes(data), block) or "")
    assert block == Block(block.offset, len(data), 2000, zlib.crc32(parts[1].to_pybytes()))


def test_an_object_store_compresses_and_local_disk_does_not(tmp_path, s3_prefix, s3_options):
    assert compression_for(LogLocation(str(tmp_path / "log"))) is None
    assert compression_for(LogLocation("file://" + str(tmp_path / "log"))) is None
    assert compression_for(LogLocation("s3://bucket/log")) == OBJECT_STORE_COMPRESSION
    data = pa.table({"id": pa.array(range(3000), pa.int64()), "text": [f"row {i % 10}" * 8 for i in range(3000)]})
    sizes = {}
    for where, url, options in (("local", str(tmp_path / "log"), None), ("s3", s3_prefix + "/log", s3_options)):
        store = LogStore.open(tmp_path / f"state-{where}", url, vnodes=4, storage_options=options)
        try:
            vnodes = pa.array([i % 4 for i in range(3000)], pa.int32())
            descriptor = store.append(0, data.append_column("__vnode", vnodes))
            store.seal(0, [descriptor])
            sizes[where] = descriptor.size
            plan = store.plan_read(dict.fromkeys(range(4), -1), 0)
            back = pa.Table.from_batches([b.batch for b in read_plan(store.location.open(), plan)])
            assert sorted(back.column("id").to_pylist()) == list(range(3000))
            if where == "s3":
                fs = store.location.open().fs  # type: ignore[attr-defined]
                bucket, key, _ = fs.split_path(f"{s3_prefix}/log/{descriptor.name}")
                assert fs.call_s3("head_object", Bucket=bucket, Key=key)["ContentType"] == SEGMENT_CONTENT_TYPE
        finally:
            store.close()
    assert sizes["s3"] < sizes["local"] / 2, sizes
