"""One port's qdisc backlog (testbed.measure.backlog): the handle it asks for, the value and
the errors it returns, a real rtnetlink request answered by this machine's kernel (no root:
reading qdiscs needs none), and the divergence of a queue model from the real backlog,
computed by hand."""
from __future__ import annotations

import errno
import socket

import pytest

from testbed import errors
from testbed.measure.backlog import PortBacklog, backlog_divergence, handle_major
from testbed.measure.backlog import BUFFER_HANDLE

MTU = 1500


@pytest.mark.parametrize(("handle", "major"), [("10:", 0x10), (BUFFER_HANDLE, 0x10),
                                               ("5:", 5), ("ffff:", 0xFFFF)])
def test_handle_major(handle, major):
    assert handle_major(handle) == major


@pytest.mark.parametrize("handle", ["10", "10:1", ":", "", "x:"])
def test_a_handle_must_name_a_qdisc(handle):
    with pytest.raises(ValueError):
        handle_major(handle)


class FakeReader:
    """Answers reads as rtnetlink would: a backlog per (ifindex, major) asked, or an error."""

    def __init__(self, wanted, answers):
        self.wanted = wanted
        self.answers = answers
        self.sock = FakeSocket()

    def read(self):
        if isinstance(self.answers, OSError):
            raise self.answers
        return self.answers


class FakeSocket:
    closed = False

    def close(self):
        self.closed = True


def opened_with(answers):
    readers = []

    def open_reader(wanted):
        readers.append(FakeReader(wanted, answers))
        return readers[-1]

    return open_reader, readers


def test_it_asks_for_the_buffer_of_the_named_interface_and_returns_its_bytes():
    lo = socket.if_nametoindex("lo")
    open_reader, readers = opened_with({(lo, 0x10): 4500})
    with PortBacklog("lo", open_reader=open_reader) as backlog:
        assert backlog.read() == 4500
    (reader,) = readers
    assert reader.wanted == {(lo, 0x10)}
    assert reader.sock.closed


def test_a_given_ifindex_and_handle_are_used_as_given():
    open_reader, readers = opened_with({(7, 0x23): 0})
    assert PortBacklog("l0-eth3", ifindex=7, handle="23:", open_reader=open_reader).read() == 0
    assert readers[0].wanted == {(7, 0x23)}


def test_errors_name_the_port():
    with pytest.raises(errors.TestbedError, match="no-such-if0: no such interface"):
        PortBacklog("no-such-if0", open_reader=opened_with({})[0])
    open_reader, _ = opened_with(OSError(errno.ENOENT, "reading qdisc 10: on ifindex 7"))
    unreadable = r"l0-eth3: cannot read the backlog of qdisc 10: \(reading qdisc 10: on ifindex 7\)"
    with pytest.raises(errors.TestbedError, match=unreadable):
        PortBacklog("l0-eth3", ifindex=7, open_reader=open_reader).read()
    with pytest.raises(errors.TestbedError, match="l0-eth3: no answer for qdisc 10:"):
        PortBacklog("l0-eth3", ifindex=7, open_reader=opened_with({(7, 0x11): 1})[0]).read()


def test_the_kernel_answers_that_loopback_has_no_buffer_qdisc():
    """A real RTM_GETQDISC over rtnetlink: loopback has only its noqueue root, so the kernel
    answers ENOENT for handle 10:, and the error names the port."""
    with PortBacklog("lo") as backlog:
        with pytest.raises(errors.TestbedError, match=r"lo: cannot read the backlog of "
                                                      r"qdisc 10: .*No such file or directory"):
            backlog.read()


def test_divergence_of_a_model_from_the_real_backlog():
    real = [0, 1500, 3000, 4500]
    model = [0, 3000, 3000, 1500]  # differences 0, +1500, 0, -3000
    d = backlog_divergence(real, model, within_bytes=MTU)
    assert d["samples"] == 4
    assert d["mean_bytes"] == -375.0  # (0 + 1500 + 0 - 3000) / 4: the model runs low
    assert d["mean_abs_bytes"] == 1125.0  # (0 + 1500 + 0 + 3000) / 4
    # |differences| sorted 0, 0, 1500, 3000: rank 0.95 * 3 = 2.85 -> 1500 + 0.85 * 1500
    assert d["p95_abs_bytes"] == pytest.approx(2775.0)
    assert d["max_abs_bytes"] == 3000
    assert d["within_fraction"] == 0.75  # three of four within one frame
    assert backlog_divergence(real, real, MTU)["max_abs_bytes"] == 0


def test_divergence_needs_series_sampled_together():
    assert backlog_divergence([], [], MTU) is None
    with pytest.raises(ValueError, match="sampled together"):
        backlog_divergence([1, 2], [1], MTU)
