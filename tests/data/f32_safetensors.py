"""f32_safetensors.py — the one writer of the small f32 checkpoints that tests/data's make_ckpt.py scripts make
(no numpy: struct). save(path, tensors): tensors is a list of (name, shape, values), values a list of floats or
their packed little-endian f32 bytes, written in that order."""
import json
import struct


def pack(values):
    """values as little-endian f32 bytes."""
    return struct.pack("<%df" % len(values), *values)


def save(path, tensors):
    hdr, blobs, off = {}, [], 0
    for name, shape, values in tensors:
        blob = values if isinstance(values, (bytes, bytearray)) else pack(values)
        hdr[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    h = json.dumps(hdr).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)
