"""The background thread an os-ken app keeps beside its event handlers (``PollingApp``):
started with the app, woken every ``poll_interval_s`` seconds to do one round of the app's
work, stopped with the app, after which the app's report file is closed.

os-ken 4.2 runs apps on native threads (os_ken.lib.hub with OSKEN_HUB_TYPE=native): the event
handlers run on the app's event thread, its rounds on this one, so the two share the app's
state and its report file under the app's ``lock``.
"""
from __future__ import annotations

import threading
from typing import IO

from os_ken.base import app_manager
from os_ken.lib import hub


class PollingApp(app_manager.OSKenApp):
    """An os-ken app with a thread of its own. A subclass, in its ``__init__``, sets
    ``poll_interval_s`` and its report file ``out`` (None: none); it says in ``polling``
    whether it needs the thread (default: when it has a report file), in ``poll_description``
    what the thread does (logged as it starts), and does one round in ``poll``. os-ken takes
    an app class only from the module that defines it, so loading an app's module finds that
    app, not this class."""

    poll_interval_s: float  # seconds between rounds, set by the subclass

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.out: IO[str] | None = None
        self.lock = threading.Lock()  # the app's state and ``out``, between the two threads
        self.stopping = threading.Event()  # set by ``stop``: the thread ends within an interval

    def polling(self) -> bool:
        return self.out is not None

    def poll_description(self) -> str:
        raise NotImplementedError

    def poll(self) -> None:
        raise NotImplementedError

    def start(self):
        super().start()
        if self.polling():
            self.threads.append(hub.spawn(self.poll_loop))
            self.logger.info("%s", self.poll_description())

    def stop(self):
        self.stopping.set()
        super().stop()  # joins the thread

    def close(self):
        if self.out:
            with self.lock:
                self.out.close()

    def poll_loop(self):
        while not self.stopping.wait(self.poll_interval_s):
            self.poll()
