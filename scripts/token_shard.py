"""FTTOKSHD token shards: the one Python writer and reader (standard library only).

Used by scripts/tokenize_shards.py, tests/oracle/check_export.py and tests/test_chess_data.sh;
the C reader is src/token_shard.c. Layout (all integers little-endian; the C reader mmaps the file):
  offset  0  char[8] magic "FTTOKSHD"
          8  u32 version = 1
         12  u32 token_bytes (2 if vocab_size <= 65536 else 4)
         16  u32 vocab_size
         20  u32 bos_id (0xFFFFFFFF if none)
         24  u32 eos_id (0xFFFFFFFF if none)
         28  u32 reserved = 0
         32  u64 n_docs
         40  u64 n_tokens
         48  16 zero bytes
         64  u64 doc_offsets[n_docs + 1]   token index where doc i starts;
                                           offsets[0] = 0, offsets[n_docs] = n_tokens
          .  tokens[n_tokens], token_bytes each (u16 or u32)
  file size = 64 + 8 * (n_docs + 1) + token_bytes * n_tokens
"""
import array
import hashlib
import os
import struct
import sys

MAGIC = b"FTTOKSHD"
VERSION = 1
HEADER = struct.Struct("<8sIIIIIIQQ16x")  # 64 bytes
NONE_ID = 0xFFFFFFFF
assert HEADER.size == 64


class ShardError(ValueError):
    """A shard that breaks the layout; the message starts with the file's path."""


def token_bytes_for(vocab_size):
    """2 (u16 tokens) for vocabularies up to 65,536 entries, else 4 (u32)."""
    return 2 if vocab_size <= 65536 else 4


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _native(arr):
    """arr in little-endian byte order (a no-op on little-endian hosts)."""
    if sys.byteorder != "little":
        arr.byteswap()
    return arr


def write_shard(path, docs, vocab_size, bos_id, eos_id):
    """Write docs (a list of token-id lists, BOS/EOS already included) to path, atomically
    (path.tmp then rename). bos_id/eos_id may be None. Returns the manifest entry
    {file, docs, tokens, bytes, sha256}."""
    token_bytes = token_bytes_for(vocab_size)
    offsets = array.array("Q", [0])
    toks = array.array("H" if token_bytes == 2 else "I")
    for d in docs:
        toks.extend(d)
        offsets.append(len(toks))
    assert toks.itemsize == token_bytes and offsets.itemsize == 8
    hdr = HEADER.pack(MAGIC, VERSION, token_bytes, vocab_size,
                      NONE_ID if bos_id is None else bos_id,
                      NONE_ID if eos_id is None else eos_id,
                      0, len(docs), len(toks))
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(hdr)
        f.write(_native(offsets).tobytes())
        f.write(_native(toks).tobytes())
    os.replace(tmp, path)
    size = os.path.getsize(path)
    assert size == 64 + 8 * (len(docs) + 1) + token_bytes * len(toks)
    return {"file": os.path.basename(path), "docs": len(docs), "tokens": len(toks),
            "bytes": size, "sha256": sha256_file(path)}


def read_shard(path):
    """Read and check a whole shard as src/token_shard.c does (magic, version, reserved bytes, token
    width against the vocabulary, exact size, offsets, every token < vocab_size).
    Returns (header dict, offsets, tokens) with offsets and tokens as array.array;
    raises ShardError naming the file."""
    with open(path, "rb") as f:
        buf = f.read()
    if len(buf) < 64:
        raise ShardError("%s: shorter than the 64-byte header" % path)
    magic, ver, tb, vocab, bos, eos, res, n_docs, n_tokens = HEADER.unpack_from(buf, 0)
    if magic != MAGIC or ver != VERSION or res != 0 or buf[48:64] != bytes(16):
        raise ShardError("%s: bad magic/version/reserved" % path)
    if tb not in (2, 4) or tb != token_bytes_for(vocab):
        raise ShardError("%s: token_bytes %d inconsistent with vocab %d" % (path, tb, vocab))
    want = 64 + 8 * (n_docs + 1) + tb * n_tokens
    if len(buf) != want:
        raise ShardError("%s: size %d, header implies %d" % (path, len(buf), want))
    offsets = array.array("Q")
    offsets.frombytes(buf[64:64 + 8 * (n_docs + 1)])
    toks = array.array("H" if tb == 2 else "I")
    toks.frombytes(buf[64 + 8 * (n_docs + 1):])
    _native(offsets)
    _native(toks)
    if offsets[0] != 0 or offsets[-1] != n_tokens:
        raise ShardError("%s: offsets do not span the tokens" % path)
    if any(offsets[i] > offsets[i + 1] for i in range(n_docs)):
        raise ShardError("%s: offsets decrease" % path)
    if n_tokens and max(toks) >= vocab:
        raise ShardError("%s: token id >= vocab_size" % path)
    hdr = {"token_bytes": tb, "vocab_size": vocab,
           "bos_id": None if bos == NONE_ID else bos, "eos_id": None if eos == NONE_ID else eos,
           "n_docs": n_docs, "n_tokens": n_tokens}
    return hdr, offsets, toks


def shard_docs(path):
    """The documents of a shard as a list of token-id lists."""
    _, offs, toks = read_shard(path)
    return [toks[offs[i]:offs[i + 1]].tolist() for i in range(len(offs) - 1)]
