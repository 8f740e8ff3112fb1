"""The bpf(2) system call for pinned maps (testbed.apply.bpf_syscall), without root and
without the kernel: each command's ``union bpf_attr`` packed as the UAPI header lays it out
(checked by compiling against the header), and ``PinnedMap``'s reads and writes over a
stand-in kernel that answers through the same memory. The system calls themselves run on a
live fabric (tests/integration/test_ecn_marking.py)."""
from __future__ import annotations

import ctypes
import errno
import os
import shutil
import struct
import subprocess

import pytest

from testbed.apply import bpf_syscall
from testbed.apply.bpf_syscall import (
    BATCH_ATTR,
    ELEM_ATTR,
    INFO_ATTR,
    MAP_INFO,
    OBJ_ATTR,
    batch_attr,
    batch_count,
    elem_attr,
    info_attr,
    join_entries,
    obj_get_attr,
    split_entries,
    syscall_number,
)

TOOL_TIMEOUT_S = 60


# --- the bpf(2) attributes ----------------------------------------------------------------------

# What each packed field must match in <linux/bpf.h>: (C expression, Python value).
UAPI_CHECKS = [
    ("offsetof(union bpf_attr, map_fd)", 0), ("offsetof(union bpf_attr, key)", 8),
    ("offsetof(union bpf_attr, value)", 16), ("offsetof(union bpf_attr, next_key)", 16),
    ("offsetof(union bpf_attr, flags)", 24), ("sizeof(((union bpf_attr *)0)->flags)", 8),
    ("offsetof(union bpf_attr, batch.in_batch)", 0),
    ("offsetof(union bpf_attr, batch.out_batch)", 8),
    ("offsetof(union bpf_attr, batch.keys)", 16),
    ("offsetof(union bpf_attr, batch.values)", 24),
    ("offsetof(union bpf_attr, batch.count)", bpf_syscall.BATCH_COUNT_OFFSET),
    ("offsetof(union bpf_attr, batch.map_fd)", 36),
    ("offsetof(union bpf_attr, batch.elem_flags)", 40),
    ("offsetof(union bpf_attr, batch.flags)", 48),
    ("sizeof(((union bpf_attr *)0)->batch)", BATCH_ATTR.size),
    ("offsetof(union bpf_attr, pathname)", 0), ("offsetof(union bpf_attr, bpf_fd)", 8),
    ("offsetof(union bpf_attr, file_flags)", 12),
    ("offsetof(union bpf_attr, info.bpf_fd)", 0), ("offsetof(union bpf_attr, info.info_len)", 4),
    ("offsetof(union bpf_attr, info.info)", 8), ("sizeof(((union bpf_attr *)0)->info)",
                                                INFO_ATTR.size),
    ("offsetof(struct bpf_map_info, key_size)", 8),
    ("offsetof(struct bpf_map_info, value_size)", 12),
    ("offsetof(struct bpf_map_info, max_entries)", 16),
    ("offsetof(struct bpf_map_info, map_flags)", 20),
    ("BPF_MAP_LOOKUP_ELEM", bpf_syscall.BPF_MAP_LOOKUP_ELEM),
    ("BPF_MAP_UPDATE_ELEM", bpf_syscall.BPF_MAP_UPDATE_ELEM),
    ("BPF_MAP_GET_NEXT_KEY", bpf_syscall.BPF_MAP_GET_NEXT_KEY),
    ("BPF_OBJ_GET", bpf_syscall.BPF_OBJ_GET),
    ("BPF_OBJ_GET_INFO_BY_FD", bpf_syscall.BPF_OBJ_GET_INFO_BY_FD),
    ("BPF_MAP_LOOKUP_BATCH", bpf_syscall.BPF_MAP_LOOKUP_BATCH),
    ("BPF_MAP_UPDATE_BATCH", bpf_syscall.BPF_MAP_UPDATE_BATCH),
    ("BPF_ANY", bpf_syscall.BPF_ANY), ("BPF_F_LOCK", bpf_syscall.BPF_F_LOCK),
    ("BPF_MAP_TYPE_HASH", bpf_syscall.BPF_MAP_TYPE_HASH),
]


def test_the_packed_attributes_match_the_kernels_header(tmp_path):
    clang = shutil.which("clang")
    if clang is None:
        pytest.fail("clang is not installed; scripts/install.sh installs it")
    checks = [f'_Static_assert(({expr}) == {value}, "{expr}");' for expr, value in UAPI_CHECKS]
    source = tmp_path / "attr.c"
    source.write_text("#include <stddef.h>\n#include <linux/bpf.h>\n" + "\n".join(checks) + "\n")
    out = subprocess.run([clang, "-fsyntax-only", str(source)], capture_output=True, text=True,
                         timeout=TOOL_TIMEOUT_S)
    assert out.returncode == 0, out.stderr


def test_the_attributes_pack_their_fields_in_place():
    attr = elem_attr(7, 0x1000, 0x2000, bpf_syscall.BPF_F_LOCK)
    assert len(attr) == ELEM_ATTR.size == 32
    assert ELEM_ATTR.unpack(attr) == (7, 0, 0x1000, 0x2000, bpf_syscall.BPF_F_LOCK)
    attr = batch_attr(9, 0x10, 0x20, 48, in_batch_addr=0x30, out_batch_addr=0x40,
                      elem_flags=bpf_syscall.BPF_F_LOCK)
    assert BATCH_ATTR.unpack(attr) == (0x30, 0x40, 0x10, 0x20, 48, 9, bpf_syscall.BPF_F_LOCK, 0)
    assert batch_count(attr) == 48
    assert OBJ_ATTR.unpack(obj_get_attr(0x5000)) == (0x5000, 0, 0, 0)
    assert INFO_ATTR.unpack(info_attr(3, 0x6000)) == (3, MAP_INFO.size, 0x6000)


def test_the_system_call_number_follows_the_machine():
    assert syscall_number("x86_64") == 321 and syscall_number("aarch64") == 280
    with pytest.raises(OSError) as err:
        syscall_number("mips")
    assert err.value.errno == errno.ENOSYS and "mips" in str(err.value)


def test_batch_arrays_round_trip_and_refuse_values_of_another_size():
    entries = {40: b"\x01" * 24, 42: b"\x02" * 24}
    keys, values = join_entries(entries, 24)
    assert len(keys) == 8 and len(values) == 48
    assert split_entries(keys, values, 2, 24) == entries
    assert split_entries(keys, values, 1, 24) == {40: b"\x01" * 24}  # only what was filled
    with pytest.raises(ValueError):
        join_entries({40: b"\x01" * 23}, 24)


class FakeKernel:
    """The bpf(2) commands PinnedMap uses, over one in-memory hash map pinned at ``path``:
    reads and writes the caller's memory at the attribute's addresses as the kernel does,
    hands out batches of at most ``chunk`` entries (so the cursor is followed), and answers
    EINVAL to batch commands when ``batch`` is off (an older kernel)."""

    def __init__(self, path: str, value_size: int, entries: dict[int, bytes],
                 batch: bool = True, chunk: int = 2):
        self.path, self.value_size, self.entries = path, value_size, dict(entries)
        self.batch, self.chunk = batch, chunk
        self.commands: list[tuple[int, int]] = []  # (command, flags)

    def __call__(self, cmd: int, attr, what: str) -> int:
        raw = attr.raw
        batch_cmd = cmd in (bpf_syscall.BPF_MAP_LOOKUP_BATCH, bpf_syscall.BPF_MAP_UPDATE_BATCH)
        flags = (BATCH_ATTR.unpack_from(raw)[6] if batch_cmd
                 else ELEM_ATTR.unpack_from(raw)[4] if cmd < bpf_syscall.BPF_OBJ_GET else 0)
        self.commands.append((cmd, flags))  # answered or refused
        if cmd == bpf_syscall.BPF_OBJ_GET:
            path = ctypes.string_at(OBJ_ATTR.unpack_from(raw)[0]).decode()
            if path != self.path:
                raise OSError(errno.ENOENT, f"{what}: no such pin")
            result = os.open(os.devnull, os.O_RDONLY)  # a real fd, closed by close()
        elif cmd == bpf_syscall.BPF_OBJ_GET_INFO_BY_FD:
            _, info_len, addr = INFO_ATTR.unpack_from(raw)
            info = MAP_INFO.pack(bpf_syscall.BPF_MAP_TYPE_HASH, 1, 4, self.value_size, 64, 0)
            ctypes.memmove(addr, info, min(info_len, len(info)))
            result = 0
        elif batch_cmd:
            result = self._batch(cmd, attr, what)
        else:
            _, _, key_addr, value_addr, _ = ELEM_ATTR.unpack_from(raw)
            result = self._elem(cmd, key_addr, value_addr, what)
        return result

    def _key(self, addr: int) -> int:
        return struct.unpack("=I", ctypes.string_at(addr, 4))[0]

    def _elem(self, cmd, key_addr, value_addr, what) -> int:
        if cmd == bpf_syscall.BPF_MAP_UPDATE_ELEM:
            self.entries[self._key(key_addr)] = ctypes.string_at(value_addr, self.value_size)
            return 0
        if cmd == bpf_syscall.BPF_MAP_LOOKUP_ELEM:
            key = self._key(key_addr)
            if key not in self.entries:
                raise OSError(errno.ENOENT, f"{what}: no entry")
            ctypes.memmove(value_addr, self.entries[key], self.value_size)
            return 0
        assert cmd == bpf_syscall.BPF_MAP_GET_NEXT_KEY
        keys = sorted(self.entries)
        later = keys if key_addr == 0 else [k for k in keys if k > self._key(key_addr)]
        if not later:
            raise OSError(errno.ENOENT, f"{what}: the last key")
        ctypes.memmove(value_addr, struct.pack("=I", later[0]), 4)
        return 0

    def _batch(self, cmd, attr, what) -> int:
        if not self.batch:
            raise OSError(errno.EINVAL, f"{what}: no batch commands here")
        in_batch, out_batch, keys, values, count, _, _, _ = BATCH_ATTR.unpack_from(attr.raw)
        if cmd == bpf_syscall.BPF_MAP_UPDATE_BATCH:
            for i in range(count):
                self.entries[self._key(keys + 4 * i)] = ctypes.string_at(
                    values + i * self.value_size, self.value_size)
            return 0
        start = self._key(in_batch) if in_batch else 0
        ordered = sorted(self.entries)[start:start + min(count, self.chunk)]
        for i, key in enumerate(ordered):
            ctypes.memmove(keys + 4 * i, struct.pack("=I", key), 4)
            ctypes.memmove(values + i * self.value_size, self.entries[key], self.value_size)
        ctypes.memmove(ctypes.addressof(attr) + bpf_syscall.BATCH_COUNT_OFFSET,
                       struct.pack("=I", len(ordered)), 4)
        ctypes.memmove(out_batch, struct.pack("=I", start + len(ordered)), 4)
        if start + len(ordered) >= len(self.entries):
            raise OSError(errno.ENOENT, f"{what}: the last batch")
        return 0


PIN = "/sys/fs/bpf/tc/globals/a_map"
VALUE = struct.Struct("=IIQQQQ")  # a value with a lock word first, as the marker's anchor


def anchor(seq: int) -> bytes:
    return VALUE.pack(0, 0, 1_000 * seq, 0, 0, seq)


@pytest.mark.parametrize("batch", [True, False])
def test_a_pinned_map_reads_every_entry_and_writes_many(monkeypatch, batch):
    kernel = FakeKernel(PIN, VALUE.size, {k: anchor(k) for k in (3, 40, 41, 42, 43)},
                        batch=batch)
    monkeypatch.setattr(bpf_syscall, "bpf", kernel)
    with bpf_syscall.PinnedMap(PIN, VALUE.size) as pinned:
        assert pinned.items() == {k: anchor(k) for k in (3, 40, 41, 42, 43)}
        assert pinned.lookup_many([40, 42, 77]) == {40: anchor(40), 42: anchor(42)}
        assert pinned.lookup(41) == anchor(41) and pinned.lookup(77) is None
        pinned.update_many({40: anchor(90), 42: anchor(91)}, bpf_syscall.BPF_F_LOCK)
        assert pinned.lookup_many([40, 42]) == {40: anchor(90), 42: anchor(91)}
        assert pinned.batch_ok is batch  # a kernel without batches is asked key by key
    used = {cmd for cmd, _ in kernel.commands}
    if batch:  # in chunks of two, following the cursor; the write in one call
        assert [cmd for cmd, _ in kernel.commands].count(bpf_syscall.BPF_MAP_LOOKUP_BATCH) == 9
        assert (bpf_syscall.BPF_MAP_UPDATE_BATCH, bpf_syscall.BPF_F_LOCK) in kernel.commands
        assert bpf_syscall.BPF_MAP_UPDATE_ELEM not in used
    else:
        assert bpf_syscall.BPF_MAP_GET_NEXT_KEY in used
        assert [f for cmd, f in kernel.commands if cmd == bpf_syscall.BPF_MAP_UPDATE_ELEM] == [
            bpf_syscall.BPF_F_LOCK] * 2


def test_a_pinned_map_of_another_layout_or_path_is_refused(monkeypatch):
    kernel = FakeKernel(PIN, VALUE.size, {})
    monkeypatch.setattr(bpf_syscall, "bpf", kernel)
    with pytest.raises(ValueError) as err:
        bpf_syscall.PinnedMap(PIN, VALUE.size - 8)  # an object built from older source
    assert "40-byte values, not 4 and 32" in str(err.value)
    with pytest.raises(FileNotFoundError):
        bpf_syscall.PinnedMap("/sys/fs/bpf/tc/globals/elsewhere", VALUE.size)
    with bpf_syscall.PinnedMap(PIN, VALUE.size) as pinned:
        assert pinned.items() == {}  # an empty map: one call, ENOENT at once
        with pytest.raises(ValueError):
            pinned.update(40, b"short")
