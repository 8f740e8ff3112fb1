"""The bpf(2) system call for the few things user space does with the testbed's pinned maps:
open one (BPF_OBJ_GET), check its key and value sizes (BPF_OBJ_GET_INFO_BY_FD), look up one
key, read every entry in one call (BPF_MAP_LOOKUP_BATCH; key by key where the kernel lacks
it) and write many in one call (BPF_MAP_UPDATE_BATCH; likewise). Through ctypes, so no
dependency: the ``union bpf_attr`` of each command is packed with ``struct`` below (pure, and
unit-tested), and the call goes through libc's ``syscall``.

Why not bpftool: a bpftool process per read costs milliseconds of a 2-core machine's time,
and the queue-depth sampler reads every 10 ms while the ECN anchor agent
(``testbed.apply.ecn_anchor``) reads and writes every 2 ms; a system call costs
microseconds. bpftool still fills the maps at bring-up, in one batch
(``testbed.plan.ecn_plan.ebpf_config_commands``).

Every map here is keyed by a u32 (a root-namespace ifindex, ``testbed.plan.bpf_maps``); values
are bytes, laid out by the caller's ``Layout``.
"""
from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
import threading
from collections.abc import Iterable, Mapping
from pathlib import PurePosixPath

from testbed.plan.bpf_maps import KEY_STRUCT

# The bpf system call's number by machine (include/uapi/asm-generic/unistd.h for arm64,
# arch/x86/entry/syscalls/syscall_64.tbl for x86_64).
SYSCALL_NUMBERS = {"x86_64": 321, "aarch64": 280}

# Commands (enum bpf_cmd) and flags, from include/uapi/linux/bpf.h.
BPF_MAP_LOOKUP_ELEM = 1
BPF_MAP_UPDATE_ELEM = 2
BPF_MAP_GET_NEXT_KEY = 4
BPF_OBJ_GET = 7
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_MAP_LOOKUP_BATCH = 24
BPF_MAP_UPDATE_BATCH = 26
BPF_ANY = 0
BPF_F_LOCK = 4  # copy the value under the bpf_spin_lock in it (in place, never torn)
BPF_MAP_TYPE_HASH = 1
ENOTSUPP = 524  # the kernel's own "not supported" (not in errno): batch ops on an older map

# union bpf_attr, one struct per command family. Pointers are __aligned_u64.
# BPF_MAP_*_ELEM: map_fd, (padding), key, value or next_key, flags
ELEM_ATTR = struct.Struct("=IIQQQ")
# BPF_MAP_*_BATCH: in_batch, out_batch, keys, values, count (in and out), map_fd,
# elem_flags, flags
BATCH_ATTR = struct.Struct("=QQQQIIQQ")
BATCH_COUNT_OFFSET = 32
# BPF_OBJ_GET: pathname, bpf_fd (0), file_flags, path_fd (0: relative to the cwd, unused)
OBJ_ATTR = struct.Struct("=QIIi")
# BPF_OBJ_GET_INFO_BY_FD: bpf_fd, info_len, info
INFO_ATTR = struct.Struct("=IIQ")
# struct bpf_map_info, as far as read here (the kernel fills at most info_len bytes)
MAP_INFO = struct.Struct("=IIIIII")  # type, id, key_size, value_size, max_entries, map_flags
BATCH_CURSOR_BYTES = 8  # a hash map's cursor is a u32 bucket index; an array's is its key


def syscall_number(machine: str | None = None) -> int:
    """The bpf system call's number on ``machine`` (default: this one)."""
    machine = machine or platform.machine()
    if machine not in SYSCALL_NUMBERS:
        raise OSError(errno.ENOSYS, f"the bpf system call's number on {machine} is not known "
                                    f"here (known: {', '.join(SYSCALL_NUMBERS)})")
    return SYSCALL_NUMBERS[machine]


def elem_attr(map_fd: int, key_addr: int, value_addr: int, flags: int = 0) -> bytes:
    return ELEM_ATTR.pack(map_fd, 0, key_addr, value_addr, flags)


def batch_attr(map_fd: int, keys_addr: int, values_addr: int, count: int,
               in_batch_addr: int = 0, out_batch_addr: int = 0, elem_flags: int = 0) -> bytes:
    return BATCH_ATTR.pack(in_batch_addr, out_batch_addr, keys_addr, values_addr, count, map_fd,
                           elem_flags, 0)


def obj_get_attr(path_addr: int) -> bytes:
    return OBJ_ATTR.pack(path_addr, 0, 0, 0)


def info_attr(fd: int, info_addr: int, info_len: int = MAP_INFO.size) -> bytes:
    return INFO_ATTR.pack(fd, info_len, info_addr)


def batch_count(attr: bytes | bytearray | ctypes.Array) -> int:
    """The entries a batch command filled or wrote, as the kernel writes back into the attr."""
    return struct.unpack_from("=I", attr, BATCH_COUNT_OFFSET)[0]


def split_entries(keys: bytes, values: bytes, count: int, value_size: int) -> dict[int, bytes]:
    """A batch's key and value arrays (``count`` entries) -> {key: value bytes}."""
    return {KEY_STRUCT.unpack_from(keys, i * KEY_STRUCT.size)[0]:
            bytes(values[i * value_size:(i + 1) * value_size]) for i in range(count)}


def join_entries(entries: Mapping[int, bytes], value_size: int) -> tuple[bytes, bytes]:
    """{key: value bytes} -> the key and value arrays a batch update takes."""
    for key, value in entries.items():
        if len(value) != value_size:
            raise ValueError(f"the value for key {key} has {len(value)} bytes, the map "
                             f"{value_size}")
    return (b"".join(KEY_STRUCT.pack(key) for key in entries), b"".join(entries.values()))


class _Libc:
    """libc's ``syscall``, found once."""

    call = None

    @classmethod
    def bpf(cls, cmd: int, attr: ctypes.Array) -> int:
        if cls.call is None:
            cls.number = syscall_number()
            libc = ctypes.CDLL(None, use_errno=True)
            libc.syscall.restype = ctypes.c_long
            cls.call = libc.syscall
        # syscall(2) is variadic and reads every argument as a long
        return cls.call(ctypes.c_long(cls.number), ctypes.c_long(cmd), attr,
                        ctypes.c_long(len(attr)))


def bpf(cmd: int, attr: ctypes.Array, what: str) -> int:
    """One bpf(2) call on the mutable ``attr``; its result, or OSError naming ``what``."""
    result = _Libc.bpf(cmd, attr)
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err) if err != ENOTSUPP else 'not supported'}")
    return result


def _addr(buf: ctypes.Array) -> int:
    return ctypes.addressof(buf)


class PinnedMap:
    """A BPF map pinned at ``path`` (u32 keys), opened read-write; ``value_size`` (bytes)
    is checked against the map's own. Close it when done (or use ``with``)."""

    def __init__(self, path: str | PurePosixPath, value_size: int):
        self.path = str(path)
        name = ctypes.create_string_buffer(os.fsencode(self.path))
        self.fd = bpf(BPF_OBJ_GET, ctypes.create_string_buffer(obj_get_attr(_addr(name)),
                                                                OBJ_ATTR.size),
                      f"opening the pinned map {self.path}")
        try:
            info = ctypes.create_string_buffer(MAP_INFO.size)
            bpf(BPF_OBJ_GET_INFO_BY_FD, ctypes.create_string_buffer(
                info_attr(self.fd, _addr(info)), INFO_ATTR.size), f"reading {self.path}'s info")
            self.map_type, _, key_size, self.value_size, self.max_entries, _ = \
                MAP_INFO.unpack(info.raw)
            if (key_size, self.value_size) != (KEY_STRUCT.size, value_size):
                raise ValueError(f"{self.path} has {key_size}-byte keys and {self.value_size}-"
                                 f"byte values, not {KEY_STRUCT.size} and {value_size}: the "
                                 "object was built from another source")
        except BaseException:
            os.close(self.fd)
            raise
        self.batch_ok = True  # until the kernel says otherwise
        self._batch_buffers: tuple[ctypes.Array, ...] | None = None  # made once, reused
        self._batch_lock = threading.Lock()  # by one reader at a time (a sampler thread)

    # -- reading ----------------------------------------------------------------------------
    def lookup(self, key: int, flags: int = 0) -> bytes | None:
        """The value of ``key``, or None when there is none."""
        k = ctypes.create_string_buffer(KEY_STRUCT.pack(key), KEY_STRUCT.size)
        v = ctypes.create_string_buffer(self.value_size)
        try:
            bpf(BPF_MAP_LOOKUP_ELEM, ctypes.create_string_buffer(
                elem_attr(self.fd, _addr(k), _addr(v), flags), ELEM_ATTR.size),
                f"looking up {key} in {self.path}")
        except FileNotFoundError:
            return None
        return v.raw

    def items(self) -> dict[int, bytes]:
        """Every entry: one BPF_MAP_LOOKUP_BATCH call while the map fits (its max_entries),
        else key by key."""
        if self.batch_ok:
            try:
                with self._batch_lock:
                    return self._batch_items()
            except OSError as err:
                if err.errno not in (errno.EINVAL, errno.EOPNOTSUPP, ENOTSUPP):
                    raise
                self.batch_ok = False
        out = {}
        for key in self._keys():
            value = self.lookup(key)
            if value is not None:
                out[key] = value
        return out

    def lookup_many(self, keys: Iterable[int]) -> dict[int, bytes]:
        """The entries of ``keys`` that exist: the whole map in one batch, filtered, else
        key by key."""
        wanted = set(keys)
        if self.batch_ok:
            return {k: v for k, v in self.items().items() if k in wanted}
        return {k: v for k in wanted if (v := self.lookup(k)) is not None}

    def _batch_items(self) -> dict[int, bytes]:
        count = self.max_entries  # room for every entry: one call reads them all
        if self._batch_buffers is None:
            self._batch_buffers = (ctypes.create_string_buffer(count * KEY_STRUCT.size),
                                   ctypes.create_string_buffer(count * self.value_size),
                                   ctypes.create_string_buffer(BATCH_CURSOR_BYTES))
        keys, values, cursor = self._batch_buffers
        out: dict[int, bytes] = {}
        in_batch = 0
        while True:
            attr = ctypes.create_string_buffer(batch_attr(
                self.fd, _addr(keys), _addr(values), count, in_batch, _addr(cursor)),
                BATCH_ATTR.size)
            try:
                bpf(BPF_MAP_LOOKUP_BATCH, attr, f"reading {self.path}")
                done = False
            except FileNotFoundError:  # ENOENT: the last entries (if any) are in
                done = True
            n = batch_count(attr.raw)
            out.update(split_entries(ctypes.string_at(keys, n * KEY_STRUCT.size),
                                     ctypes.string_at(values, n * self.value_size), n,
                                     self.value_size))
            if done:
                return out
            in_batch = _addr(cursor)

    def _keys(self) -> list[int]:
        keys, key = [], None
        nxt = ctypes.create_string_buffer(KEY_STRUCT.size)
        while True:
            cur = (ctypes.create_string_buffer(KEY_STRUCT.pack(key), KEY_STRUCT.size)
                   if key is not None else None)
            try:
                bpf(BPF_MAP_GET_NEXT_KEY, ctypes.create_string_buffer(
                    elem_attr(self.fd, _addr(cur) if cur is not None else 0, _addr(nxt)),
                    ELEM_ATTR.size), f"walking {self.path}")
            except FileNotFoundError:
                return keys
            key = KEY_STRUCT.unpack(nxt.raw)[0]
            keys.append(key)

    # -- writing ----------------------------------------------------------------------------
    def update_many(self, entries: Mapping[int, bytes], flags: int = BPF_ANY) -> None:
        """Write every {key: value}: one BPF_MAP_UPDATE_BATCH call, else key by key.
        ``flags``: BPF_ANY, or BPF_F_LOCK to write each value in place under its lock."""
        if not entries:
            return
        if self.batch_ok:
            keys, values = join_entries(entries, self.value_size)
            k = ctypes.create_string_buffer(keys, len(keys))
            v = ctypes.create_string_buffer(values, len(values))
            try:
                bpf(BPF_MAP_UPDATE_BATCH, ctypes.create_string_buffer(
                    batch_attr(self.fd, _addr(k), _addr(v), len(entries), elem_flags=flags),
                    BATCH_ATTR.size), f"writing {self.path}")
                return
            except OSError as err:
                if err.errno not in (errno.EINVAL, errno.EOPNOTSUPP, ENOTSUPP):
                    raise
                self.batch_ok = False
        for key, value in entries.items():
            self.update(key, value, flags)

    def update(self, key: int, value: bytes, flags: int = BPF_ANY) -> None:
        if len(value) != self.value_size:
            raise ValueError(f"{len(value)} bytes for a {self.value_size}-byte value")
        k = ctypes.create_string_buffer(KEY_STRUCT.pack(key), KEY_STRUCT.size)
        v = ctypes.create_string_buffer(value, len(value))
        bpf(BPF_MAP_UPDATE_ELEM, ctypes.create_string_buffer(
            elem_attr(self.fd, _addr(k), _addr(v), flags), ELEM_ATTR.size),
            f"writing {key} into {self.path}")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> PinnedMap:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
