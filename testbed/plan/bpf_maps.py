"""The testbed's eBPF programs' maps as plain data: value layouts field by field (as the C
structs declare them), packing and unpacking, and the bpftool commands that write and dump a
map pinned by name in tc's global pin folder. Every map is keyed by a root-namespace
ifindex."""
from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from pathlib import PurePosixPath

PIN_DIR = PurePosixPath("/sys/fs/bpf/tc/globals")
U32_MAX = 2**32 - 1
# field name -> struct code, in C order (no implicit padding: "=" matches the compiler)
Layout = tuple[tuple[str, str], ...]
KEY_STRUCT = struct.Struct("=I")  # ifindex


def layout_struct(layout: Layout) -> struct.Struct:
    return struct.Struct("=" + "".join(code for _, code in layout))


def pack_value(layout: Layout, values: Mapping[str, int]) -> bytes:
    """A map value from field values; fields not given are zero."""
    unknown = set(values) - {name for name, _ in layout}
    if unknown:
        raise ValueError(f"fields not in the layout: {sorted(unknown)}")
    return layout_struct(layout).pack(*(values.get(name, 0) for name, _ in layout))


def unpack_value(layout: Layout, data: bytes) -> dict[str, int]:
    return dict(zip((name for name, _ in layout), layout_struct(layout).unpack(data)))


def pin_path(map_name: str) -> PurePosixPath:
    return PIN_DIR / map_name


def hex_bytes(data: bytes) -> list[str]:
    return [f"{byte:02x}" for byte in data]


def update_command(map_name: str, ifindex: int, value: bytes) -> list[str]:
    """bpftool writing ``value`` for ``ifindex`` into the pinned map ``map_name``."""
    if not 1 <= ifindex <= U32_MAX:
        raise ValueError(f"ifindex must be in [1, {U32_MAX}], got {ifindex}")
    return ["bpftool", "map", "update", "pinned", str(pin_path(map_name)),
            "key", "hex", *hex_bytes(KEY_STRUCT.pack(ifindex)), "value", "hex", *hex_bytes(value)]


def dump_command(map_name: str) -> list[str]:
    """bpftool printing a pinned map as JSON (``parse_dump``)."""
    return ["bpftool", "-j", "map", "dump", "pinned", str(pin_path(map_name))]


def parse_dump(layout: Layout, text: str) -> dict[int, dict[str, int]]:
    """``bpftool -j map dump`` output -> {ifindex: fields}, from the raw key and value bytes
    (no BTF needed in bpftool's output)."""
    entries = {}
    for entry in json.loads(text or "[]"):
        key = bytes(int(byte, 16) for byte in entry["key"])
        value = bytes(int(byte, 16) for byte in entry["value"])
        (ifindex,) = KEY_STRUCT.unpack(key)
        entries[ifindex] = unpack_value(layout, value)
    return entries
