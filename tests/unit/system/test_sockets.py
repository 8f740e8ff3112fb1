"""The listening ports read from the kernel's /proc/net/tcp tables (testbed.system.sockets)."""
from __future__ import annotations

import os
import socket

import pytest

from testbed import errors
from testbed.system.sockets import listening_ports, read_listening_ports, wait_listening

TCP4 = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:14B5 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1
   1: 0100007F:07E8 0100007F:D2F0 01 00000000:00000000 00:00000000 00000000     0        0 2 1
   2: 0A000002:1538 00000000:0000 06 00000000:00000000 00:00000000 00000000     0        0 0 3
"""
TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue
   0: 00000000000000000000000000000000:14B5 00000000000000000000000000000000:0000 0A 00000000:0
"""


def test_only_listening_sockets_count_in_both_families():
    assert listening_ports(TCP4) == {0x14B5}  # 5301; established and time-wait are not
    assert listening_ports(TCP6) == {5301}
    assert listening_ports(TCP4.splitlines()[0]) == set()


def test_a_socket_of_this_process_is_seen_listening_then_gone():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert port in read_listening_ports(os.getpid())
        assert wait_listening(os.getpid(), [port], 1.0, "here") < 1.0
    with pytest.raises(errors.TestbedError, match=rf"here: nothing listening on TCP port\(s\) {port} "):
        wait_listening(os.getpid(), [port], 0.05, "here")
