"""Blocks of a log store on an object store are compressed (zstd, Arrow IPC body compression); a local log store's
are not. Either kind decodes to the same rows, a segment may hold both, and the checks of a block (length,
CRC-32) are of the bytes as stored, so a changed compressed byte is found before it is decoded."""

from __future__ import annotations

import zlib

import pyarrow as pa
import pytest

from logstore import LogLocation, LogStore, read_plan
from logstore.append import OBJECT_STORE_COMPRESSION, compression_for
from logstore.segment import Block, SegmentEncoder, block_problem, decode_block, encode, serialize_block


def rows(n: int, first: int = 0) -> pa.RecordBatch:
    return pa.record_batch(
        {
            "id": pa.array(range(first, first + n), pa.int64()),
            "text": [f"user-{i % 50} clicked item {i % 7} on page {i % 3}" for i in range(first, first + n)],
            "maybe": pa.array([None if i % 5 == 0 else i * 0.5 for i in range(first, first + n)]),
        }
    )


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_a_compressed_block_decodes_to_the_same_rows_and_is_smaller(codec):
    batch = rows(5000)
    plain, packed = serialize_block(batch, None), serialize_block(batch, codec)
    assert packed.size < plain.size / 2
    assert decode_block(packed.to_pybytes(), batch.schema).equals(batch)
    assert decode_block(plain.to_pybytes(), batch.schema).equals(batch)


def test_one_segment_may_hold_plain_and_compressed_blocks():
    """A segment is described block by block: an encoder's setting may differ from block to block (as a log store
    written before compression and after it differ from segment to segment)."""
    encoder = SegmentEncoder(name="00000000000000000000/w.seg", epoch=0, sink_id="s")
    parts = [encoder.block(0, rows(100)), encoder.block(1, rows(100, 100))]
    encoder.compression = "zstd"
    parts.append(encoder.block(2, rows(100, 200)))
    schema = rows(300).schema
    encoder.finish(schema)
    blocks = [b for run in encoder.descriptor.runs for b in run.blocks]
    assert [b.rows for b in blocks] == [100, 100, 100]
    got = [decode_block(p.to_pybytes(), schema) for p in parts]
    assert pa.Table.from_batches(got).equals(pa.Table.from_batches([rows(300)]))


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
        finally:
            store.close()
    assert sizes["s3"] < sizes["local"] / 2, sizes
