"""24-bit packet sequence number (PSN) arithmetic of the InfiniBand transport.

A PSN lives on the wire modulo 2^24 and wraps. The transport state machines keep unwrapped
packet indices internally (plain Python integers that never wrap) and convert at the wire
boundary: ``wire_psn(start, index)`` on the way out, ``unwrap(psn, reference)`` on the way
in, which picks the index nearest to a reference index (the responder's expected PSN, the
requester's oldest unacknowledged PSN). That is unambiguous while fewer than 2^23 PSNs are
outstanding, the limit the InfiniBand specification puts on a requester.
"""
from __future__ import annotations

PSN_BITS = 24
PSN_MODULO = 1 << PSN_BITS
PSN_MASK = PSN_MODULO - 1
PSN_HALF = PSN_MODULO >> 1   # 2^23: largest window in which a distance is unambiguous


def add(psn: int, count: int) -> int:
    """``psn + count`` modulo 2^24 (count may be negative)."""
    return (psn + count) & PSN_MASK


def distance(from_psn: int, to_psn: int) -> int:
    """Signed distance ``to - from`` in [-2^23, 2^23): positive when ``to`` is ahead."""
    return ((to_psn - from_psn + PSN_HALF) & PSN_MASK) - PSN_HALF


def in_window(psn: int, start_psn: int, size: int) -> bool:
    """Whether ``psn`` is one of the ``size`` PSNs starting at ``start_psn`` (with wrap)."""
    if not 0 <= size <= PSN_HALF:
        raise ValueError(f"window of {size} PSNs is ambiguous beyond 2^23")
    return 0 <= distance(start_psn, psn) < size


def wire_psn(start_psn: int, index: int) -> int:
    """The PSN on the wire of the packet ``index`` packets after ``start_psn``."""
    return (start_psn + index) & PSN_MASK


def unwrap(psn: int, start_psn: int, reference_index: int) -> int:
    """The packet index of wire ``psn`` nearest to ``reference_index`` (indices count from
    ``start_psn``). The result may be negative or beyond anything sent; callers range-check."""
    return reference_index + distance(wire_psn(start_psn, reference_index), psn)
