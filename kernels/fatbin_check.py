#!/usr/bin/env python3
"""fatbin_check.py --sass "80 90" --ptx "90" OBJ...: check that every object nvcc built carries
machine code (SASS) for each listed sm_XX and PTX for each listed compute_XX, and nothing
else. `make nvcc-check` runs it on kernels/*.cu's objects; it prints one line per object.

It reads the objects' .nv_fatbin ELF section: a sequence of fat binaries (magic 0xBA55ED50,
u16 version, u16 header size, u64 payload size), each a sequence of entries (u16 kind:
1 = PTX, 2 = ELF/SASS; u16; u32 header size; u64 payload size; ...; u32 architecture at
byte 28). Exit 0 when every object matches, 1 otherwise (naming what is missing or extra).
"""
import argparse
import struct
import sys

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX, KIND_ELF = 1, 2


def elf_section(data, name):
    """The bytes of the named section of a 64-bit little-endian ELF file, or None."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF object")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    def header(i):
        return struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
    stroff = header(shstrndx)[4]
    for i in range(shnum):
        h = header(i)
        end = data.index(b"\0", stroff + h[0])
        if data[stroff + h[0]:end].decode() == name:
            return data[h[4]:h[4] + h[5]]
    return None


def fatbin_entries(blob):
    """[(kind, arch)] of every entry of every fat binary in the section."""
    out, off = [], 0
    while off + 16 <= len(blob):
        magic, _ver, hsize, size = struct.unpack_from("<IHHQ", blob, off)
        if magic != FATBIN_MAGIC:
            break
        e, end = off + hsize, off + hsize + size
        while e + 32 <= end:
            kind, _, ehsize, esize = struct.unpack_from("<HHIQ", blob, e)
            arch, = struct.unpack_from("<I", blob, e + 28)
            out.append((kind, arch))
            e += ehsize + esize
        off = end
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sass", default="", help="architectures that need SASS, e.g. '80 90'")
    ap.add_argument("--ptx", default="", help="architectures that need PTX, e.g. '90'")
    ap.add_argument("objects", nargs="+")
    a = ap.parse_args()
    want = {(KIND_ELF, int(x)) for x in a.sass.split()} | {(KIND_PTX, int(x)) for x in a.ptx.split()}
    name = {KIND_ELF: "sm_%d", KIND_PTX: "compute_%d (PTX)"}
    bad = 0
    for obj in a.objects:
        try:
            with open(obj, "rb") as f:
                sec = elf_section(f.read(), ".nv_fatbin")
        except (OSError, ValueError) as e:
            print("%s: cannot read: %s" % (obj, e))
            bad += 1
            continue
        have = set(fatbin_entries(sec or b""))
        desc = " ".join(name[k] % v for k, v in sorted(have, key=lambda t: (t[1], -t[0])) if k in name)
        missing, extra = want - have, have - want
        if missing or extra:
            bad += 1
            print("%s: %s; MISSING %s; EXTRA %s" % (obj, desc or "no fatbin",
                  " ".join(name[k] % v for k, v in sorted(missing)) or "-",
                  " ".join(name.get(k, "kind%d_%%d" % k) % v for k, v in sorted(extra)) or "-"))
        else:
            print("%s: %s" % (obj, desc))
    print("fatbin_check: %d of %d objects hold exactly %s" % (len(a.objects) - bad, len(a.objects),
          " ".join(name[k] % v for k, v in sorted(want, key=lambda t: (t[1], -t[0]))) or "nothing"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
