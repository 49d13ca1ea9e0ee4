"""TFRecord framing read independently of the code under test, for tests that damage shards."""

from __future__ import annotations

import struct


def record_offsets(data: bytes) -> list[int]:
    """Byte offsets of the records of a TFRecord file (u64 length, u32 crc, data, u32 crc)."""
    offsets, at = [], 0
    while at < len(data):
        offsets.append(at)
        at += 16 + struct.unpack("<Q", data[at:at + 8])[0]
    return offsets
