"""Work completions and completion queues: the records the reliable-connection state machines
(``rc``) produce and the verbs layer (``verbs``) hands to applications.

Names and numeric values follow libibverbs (``ibv_wc_opcode``, ``ibv_wc_status``), so a
completion from this transport and one from pyverbs read the same.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import IntEnum


class WrOpcode(IntEnum):
    """Send work request opcodes (``ibv_wr_opcode``) this transport implements."""
    RDMA_WRITE = 0
    SEND = 2


class WcOpcode(IntEnum):
    """Completion opcodes (``ibv_wc_opcode``)."""
    SEND = 0
    RDMA_WRITE = 1
    RECV = 128


class WcStatus(IntEnum):
    """Completion status (``ibv_wc_status``)."""
    SUCCESS = 0
    LOC_LEN_ERR = 1
    LOC_PROT_ERR = 4
    WR_FLUSH_ERR = 5
    REM_INV_REQ_ERR = 9
    REM_ACCESS_ERR = 10
    REM_OP_ERR = 11
    RETRY_EXC_ERR = 12
    RNR_RETRY_EXC_ERR = 13


WC_OPCODE_OF = {WrOpcode.RDMA_WRITE: WcOpcode.RDMA_WRITE, WrOpcode.SEND: WcOpcode.SEND}


@dataclass(frozen=True)
class WorkCompletion:
    wr_id: int
    status: WcStatus
    opcode: WcOpcode
    byte_len: int
    qp_num: int = 0


class CompletionQueue:
    """A FIFO of work completions; ``poll(n)`` takes up to n of them, oldest first.

    ``depth`` bounds the queue as a CQ's size does; a completion pushed to a full queue is
    counted in ``overruns`` and dropped (a real CQ would go to error).
    """

    def __init__(self, depth: int = 4096):
        if depth < 1:
            raise ValueError("a completion queue holds at least one entry")
        self.depth = depth
        self._entries: deque[WorkCompletion] = deque()
        self.completions = 0   # pushed since creation
        self.overruns = 0

    def push(self, completion: WorkCompletion) -> None:
        if len(self._entries) >= self.depth:
            self.overruns += 1
            return
        self._entries.append(completion)
        self.completions += 1

    def poll(self, max_entries: int = 1) -> list[WorkCompletion]:
        taken = []
        while self._entries and len(taken) < max_entries:
            taken.append(self._entries.popleft())
        return taken

    def __len__(self) -> int:
        return len(self._entries)
