#!/usr/bin/env python3
"""Independent .dmexp reader (Python standard library only): checks the layout and the
CRC, prints the header, and prints the first values of one tensor as f32 bit patterns.
Importable: load(path) gives the checked header and each tensor's dims and stored bytes.

usage: dmexp_read.py FILE [TENSOR] [--count N]    (spec: docs/formats/dmexp.md)"""
import math, struct, sys, tomllib, zlib  # noqa: E401

SIZES = {"f32": 4, "f16": 2, "bf16": 2}


def widen(dtype, raw):
    """Stored bytes -> Python floats, exactly (every f16/bf16/f32 value is a double)."""
    if dtype == "f32":
        return list(struct.unpack(f"<{len(raw) // 4}f", raw))
    halves = struct.unpack(f"<{len(raw) // 2}H", raw)
    if dtype == "bf16":  # bf16 is the top half of an f32
        return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in halves]
    return [struct.unpack("<e", struct.pack("<H", h))[0] for h in halves]


def f32_bits(x):  # a float's f32 bit pattern: exact, and easy to compare across languages
    return "0x%08x" % struct.unpack("<I", struct.pack("<f", x))[0]


def fail(message):
    sys.exit(f"dmexp_read: {message}")


def read(data):
    """Checks a whole file's bytes (prefix, lengths, CRC, header, tensor list) and returns
    (prefix, header, places, payload): prefix is (version, header_bytes, payload_bytes, crc),
    places maps each tensor name to (payload offset in bytes, number of values), in file order.
    Calls fail() on anything malformed."""
    if len(data) < 24:
        fail(f"{len(data)} bytes is shorter than the 24-byte prefix")
    magic, version, hlen, plen, crc = struct.unpack("<7sBIQI", data[:24])
    if magic != b"DMEXPRT":
        fail(f"not a .dmexp export: it starts with {data[:8]!r}")
    if version != 1:
        fail(f"unknown format version {version} (this reader knows 1)")
    if len(data) != 24 + hlen + plen:
        fail(f"file is {len(data)} bytes, the prefix promises {24 + hlen + plen}")
    payload = data[24 + hlen :]
    if zlib.crc32(payload) != crc:
        fail("payload checksum mismatch")
    header = tomllib.loads(data[24 : 24 + hlen].decode("utf-8"))
    if header.get("format") != version or header.get("dtype") not in SIZES:
        fail(f"header format {header.get('format')!r} / dtype {header.get('dtype')!r} not understood")
    size = SIZES[header["dtype"]]
    offset, places = 0, {}
    for t in header["tensors"]:
        n = math.prod(t["dims"])
        if n < 1 or t["overflowed"] != 0 or t["name"] in places:
            fail(f"tensor {t['name']!r}: empty dims, overflowed values or a duplicate name")
        places[t["name"]] = (offset, n)
        offset += n * size
    counted = sum(n for _, n in places.values())
    if offset != plen or len(places) != header["num_tensors"] or counted != header["num_params"]:
        fail("the tensors listed do not fill the payload exactly")
    return (version, hlen, plen, crc), header, places, payload


def load(path):
    """The checked export at `path`: (header, {name: (dims, raw stored bytes)}), tensors in
    file order. Widen a tensor's bytes with widen(header["dtype"], raw) (exact, but slow for
    millions of values: a caller with numpy can do the same bit operation vectorised)."""
    with open(path, "rb") as f:
        _, header, places, payload = read(f.read())
    size = SIZES[header["dtype"]]
    dims = {t["name"]: list(t["dims"]) for t in header["tensors"]}
    return header, {name: (dims[name], payload[start : start + n * size])
                    for name, (start, n) in places.items()}


def main(args):
    count = 8
    if "--count" in args:
        i = args.index("--count")
        count, args = int(args[i + 1]), args[:i] + args[i + 2 :]
    if not args:
        fail(__doc__)
    (version, hlen, plen, crc), header, places, payload = read(open(args[0], "rb").read())
    dtype, size = header["dtype"], SIZES[header["dtype"]]
    print(f"format DMEXPRT v{version}\nheader_bytes {hlen}\npayload_bytes {plen}\ncrc32 0x{crc:08x} ok")
    for key in ("dtype", "source", "step", "num_params", "num_tensors", "flushed"):
        print(key, header[key])
    for key in ("max_abs", "min_nonzero_abs"):
        print(key, f32_bits(header[key]))
    for t in header["tensors"]:
        offset, n = places[t["name"]]
        print(f"tensor {t['name']} dims={t['dims']} offset={offset} bytes={n * size}")
    if len(args) > 1:
        start, n = places.get(args[1]) or fail(f"no tensor named {args[1]!r}")
        values = widen(dtype, payload[start : start + min(n, count) * size])
        print("values", args[1], " ".join(f32_bits(v) for v in values))

if __name__ == "__main__":
    main(sys.argv[1:])
