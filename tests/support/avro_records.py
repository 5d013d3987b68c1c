"""A small reader of Avro object container files (the format of Iceberg's manifests and manifest lists), written for
these tests from the Avro specification so that the conformance checks read what is in the file, not what the
library that wrote it makes of it: records as dicts by field name, values as stored (a decimal as its bytes, a date
as its days, a map with non-string keys as the array of key/value records it is written as).

Codecs: ``null``, ``deflate`` and ``zstandard`` (when the ``zstandard`` package is there).
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass
from typing import Any

MAGIC = b"Obj\x01"


@dataclass(frozen=True)
class AvroFile:
    schema: Any
    """The writer's schema (parsed JSON)."""
    metadata: dict[str, bytes]
    """The file's metadata (``avro.schema``, ``avro.codec`` and the writer's own keys)."""
    records: list[Any]


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.at + n > len(self.data):
            raise ValueError(f"an Avro value runs past the end of its data ({n} bytes at {self.at})")
        out = self.data[self.at : self.at + n]
        self.at += n
        return out

    def long(self) -> int:
        shift, out = 0, 0
        while True:
            byte = self.take(1)[0]
            out |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return (out >> 1) ^ -(out & 1)
            shift += 7
            if shift > 70:
                raise ValueError("an Avro varint longer than 10 bytes")

    def bytes_(self) -> bytes:
        return self.take(self.long())


class _Decoder:
    """Values of a writer's schema, named types resolved as they are defined."""

    def __init__(self, schema: Any) -> None:
        self.named: dict[str, Any] = {}
        self.schema = schema

    def read(self, r: _Reader, schema: Any, namespace: str = "") -> Any:
        if isinstance(schema, list):  # a union
            return self.read(r, schema[r.long()], namespace)
        if isinstance(schema, str):
            return self._primitive(r, schema, namespace)
        kind = schema["type"]
        if kind == "record" or kind == "error":
            name = self._name(schema, namespace)
            self.named[name] = schema
            space = name.rsplit(".", 1)[0] if "." in name else namespace
            return {f["name"]: self.read(r, f["type"], space) for f in schema["fields"]}
        if kind == "enum":
            self.named[self._name(schema, namespace)] = schema
            return schema["symbols"][r.long()]
        if kind == "fixed":
            self.named[self._name(schema, namespace)] = schema
            return r.take(schema["size"])
        if kind == "array":
            out: list[Any] = []
            for _ in self._blocks(r):
                out.append(self.read(r, schema["items"], namespace))
            return out
        if kind == "map":
            found: dict[str, Any] = {}
            for _ in self._blocks(r):
                key = r.bytes_().decode()
                found[key] = self.read(r, schema["values"], namespace)
            return found
        return self._primitive(r, kind, namespace)

    @staticmethod
    def _name(schema: dict[str, Any], namespace: str) -> str:
        name = schema["name"]
        space = schema.get("namespace", namespace)
        return name if "." in name or not space else f"{space}.{name}"

    @staticmethod
    def _blocks(r: _Reader) -> Any:
        while True:
            count = r.long()
            if count == 0:
                return
            if count < 0:
                count = -count
                r.long()  # the block's size in bytes
            yield from range(count)

    def _primitive(self, r: _Reader, kind: str, namespace: str) -> Any:
        if kind == "null":
            return None
        if kind == "boolean":
            return r.take(1) != b"\x00"
        if kind in ("int", "long"):
            return r.long()
        if kind == "float":
            return struct.unpack("<f", r.take(4))[0]
        if kind == "double":
            return struct.unpack("<d", r.take(8))[0]
        if kind == "bytes":
            return r.bytes_()
        if kind == "string":
            return r.bytes_().decode()
        name = kind if "." in kind or not namespace or kind in self.named else f"{namespace}.{kind}"
        if name in self.named:
            return self.read(r, self.named[name], namespace)
        if kind in self.named:
            return self.read(r, self.named[kind], namespace)
        raise ValueError(f"an Avro type this reader does not know: {kind!r}")


def read_avro(data: bytes) -> AvroFile:
    """The records of an Avro object container file's bytes."""
    r = _Reader(data)
    if r.take(4) != MAGIC:
        raise ValueError("not an Avro object container file (no Obj\\x01 magic)")
    metadata: dict[str, bytes] = {}
    for _ in _Decoder._blocks(r):
        key = r.bytes_().decode()
        metadata[key] = r.bytes_()
    sync = r.take(16)
    schema = json.loads(metadata["avro.schema"])
    codec = metadata.get("avro.codec", b"null").decode()
    decoder = _Decoder(schema)
    records: list[Any] = []
    while r.at < len(data):
        count = r.long()
        block = r.bytes_()
        if codec == "deflate":
            block = zlib.decompress(block, -15)
        elif codec == "zstandard":
            import zstandard

            block = zstandard.ZstdDecompressor().decompressobj().decompress(block)
        elif codec != "null":
            raise ValueError(f"an Avro codec this reader does not know: {codec}")
        inner = _Reader(block)
        for _ in range(count):
            records.append(decoder.read(inner, schema))
        if inner.at != len(block):
            raise ValueError(f"an Avro block holds {len(block) - inner.at} bytes after its {count} records")
        if r.take(16) != sync:
            raise ValueError("an Avro block does not end with the file's sync marker")
    return AvroFile(schema, metadata, records)
