"""One object per ArrayRecord on the wire: the same Arrays, fewer transfers.

Flower 1.41 moves a message as content-addressed objects, each Array (and each chunk of it) its own object with
its own request to the SuperLink or SuperNode: ~70 objects for a tiny-model round, which took 0.4-4.3 s per
message on a busy 2-core machine whatever their size. :func:`pack` replaces every ArrayRecord of a message's
content by one Array holding the serialized bytes of its Arrays back to back, with their layout (name, dtype,
shape, stype, length) in a ConfigRecord; :func:`unpack` rebuilds byte-identical Arrays. Lossless: the handlers and
strategies see exactly the records they would have seen. Both ends are fedvit's: the ServerApp's grid packs what
it sends and unpacks what it receives, the ClientApp's ``wire_mod`` the reverse; unpacked content passes through.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

LAYOUT_RECORD = "fedvit-packing"  # ConfigRecord: ArrayRecord name -> JSON list of [name, dtype, shape, stype, bytes]
PACKED_ARRAY = "packed"
PACKED_STYPE = "fedvit.concatenated-arrays"


def is_packed(content: RecordDict) -> bool:
    return LAYOUT_RECORD in content.config_records


def pack(content: RecordDict) -> RecordDict:
    """``content`` with each ArrayRecord as one Array (records in the same order; other records unchanged)."""
    packed, layout = RecordDict(), {}
    for name, record in content.items():
        if isinstance(record, ArrayRecord):
            arrays = list(record.items())
            layout[name] = json.dumps([[k, a.dtype, list(a.shape), a.stype, len(a.data)] for k, a in arrays])
            data = b"".join(a.data for _, a in arrays)
            one = Array(dtype="uint8", shape=(len(data),), stype=PACKED_STYPE, data=data)
            record = ArrayRecord({PACKED_ARRAY: one})
        packed[name] = record
    packed[LAYOUT_RECORD] = ConfigRecord(layout)
    return packed


def unpack(content: RecordDict) -> RecordDict:
    """The content :func:`pack` was given (ArrayRecords rebuilt Array by Array, byte for byte)."""
    layout = content.config_records[LAYOUT_RECORD]
    unpacked = RecordDict()
    for name, record in content.items():
        if name == LAYOUT_RECORD:
            continue
        if name in layout:
            if not isinstance(record, ArrayRecord) or list(record.keys()) != [PACKED_ARRAY]:
                raise ValueError(f"packed record {name!r} does not hold one {PACKED_ARRAY!r} array")
            data, offset, arrays = record[PACKED_ARRAY].data, 0, {}
            for key, dtype, shape, stype, length in json.loads(str(layout[name])):
                arrays[key] = Array(dtype=dtype, shape=tuple(shape), stype=stype, data=data[offset : offset + length])
                offset += length
            if offset != len(data):
                raise ValueError(f"packed record {name!r}: {len(data)} bytes, its layout describes {offset}")
            record = ArrayRecord(arrays)
        unpacked[name] = record
    return unpacked


def wire_mod(msg: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
    """ClientApp mod: unpack a message the ServerApp packed and pack the reply the same way; every other mod and
    handler sees plain records."""
    if not msg.has_content() or not is_packed(msg.content):
        return call_next(msg, context)
    packed = msg.content
    msg.content = unpack(packed)
    try:
        reply = call_next(msg, context)
    finally:
        msg.content = packed  # the message as it arrived, for whoever holds it after this mod
    if reply.has_content():
        reply.content = pack(reply.content)
    return reply
