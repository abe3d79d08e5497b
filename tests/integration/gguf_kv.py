"""Copy a GGUF file with key-values added or replaced (strings and u32;
standard library only). The tests use it to give a small model a chat
template it does not have (a tools-capable one, say), or a longer context,
without shipping another file.

GGUF v2/v3 layout (facts from the format's specification): magic "GGUF",
u32 version, u64 tensor count, u64 key-value count, the key-values, the
tensor infos, padding to `general.alignment` (32 by default), then the
tensor data, whose offsets are relative to its start. Only the metadata
before the data moves, so the data is copied unchanged after new padding.
"""

import struct

_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY, _U32 = 8, 9, 4


def _skip_value(buf, off, vtype):
    if vtype == _STRING:
        (n,) = struct.unpack_from("<Q", buf, off)
        return off + 8 + n
    if vtype == _ARRAY:
        atype, n = struct.unpack_from("<IQ", buf, off)
        off += 12
        if atype in _SCALAR:
            return off + _SCALAR[atype] * n
        for _ in range(n):
            off = _skip_value(buf, off, atype)
        return off
    return off + _SCALAR[vtype]


def _string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def set_string(src, dst, key, value):
    set_values(src, dst, {key: value})


def set_values(src, dst, values):
    """values: {key: str or int (written as u32)}."""
    with open(src, "rb") as f:
        buf = f.read()
    if buf[:4] != b"GGUF":
        raise ValueError("%s is not a GGUF file" % src)
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    off = 24
    kvs = []
    align = 32
    for _ in range(n_kv):
        start = off
        (klen,) = struct.unpack_from("<Q", buf, off)
        k = buf[off + 8:off + 8 + klen].decode("utf-8")
        off += 8 + klen
        (vtype,) = struct.unpack_from("<I", buf, off)
        off = _skip_value(buf, off + 4, vtype)
        if k == "general.alignment" and vtype == _U32:
            (align,) = struct.unpack_from("<I", buf, off - 4)
        if k not in values:
            kvs.append(buf[start:off])
    info_start = off
    for _ in range(n_tensors):
        (nlen,) = struct.unpack_from("<Q", buf, off)
        off += 8 + nlen
        (ndim,) = struct.unpack_from("<I", buf, off)
        off += 4 + 8 * ndim + 4 + 8
    infos = buf[info_start:off]
    data = buf[(off + align - 1) // align * align:]
    for k, v in values.items():
        if isinstance(v, str):
            kvs.append(_string(k) + struct.pack("<I", _STRING) + _string(v))
        else:
            kvs.append(_string(k) + struct.pack("<II", _U32, v))
    head = b"GGUF" + struct.pack("<IQQ", version, n_tensors, len(kvs)) + b"".join(kvs) + infos
    head += b"\0" * ((-len(head)) % align)
    with open(dst, "wb") as f:
        f.write(head)
        f.write(data)
