"""Keeping an os-ken app alive when one of its event handlers fails.

With os-ken 4.2's native hub (OSKEN_HUB_TYPE=native, the default) ``hub.TaskExit`` is plain
``Exception``: the app's event loop takes any exception out of a handler for a request to
stop, re-raises it, and the thread ends without a word. The controller would then silently
stop reacting to everything that app handles. ``survives`` logs the exception instead and
lets the loop take the next event.
"""
from __future__ import annotations

import functools


def survives(handler):
    """Decorate an app's event handler (under ``set_ev_cls``) so its exceptions are logged
    with the app's logger, not fatal to the app."""
    @functools.wraps(handler)
    def guarded(self, ev):
        try:
            return handler(self, ev)
        except Exception:
            self.logger.exception("%s failed on %s; carrying on", handler.__name__,
                                  type(ev).__name__)
    return guarded
