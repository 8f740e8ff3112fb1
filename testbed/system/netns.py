"""Entering a network namespace from this process: what the pause agent, the port backlog
readers and the RTT probe do to open sockets inside an emulated host."""
from __future__ import annotations

import ctypes
import os
import threading

CLONE_NEWNET = 0x40000000


def in_netns(path: str | None, make):
    """``make()`` run in the network namespace at ``path`` (None: this one): sockets keep
    the namespace they were made in. setns affects only the calling thread, so a throwaway
    thread enters it."""
    if path is None:
        return make()
    result: dict = {}

    def enter():
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(path, os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                result["error"] = OSError(ctypes.get_errno(), f"setns {path}")
                return
            result["value"] = make()
        except Exception as exc:  # handed to the caller's thread
            result["error"] = exc
        finally:
            os.close(fd)

    thread = threading.Thread(target=enter)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]
