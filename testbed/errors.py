"""Errors the user caused or can act on; the CLI prints them as one line, never a traceback.
A user's text inside a message goes through ``short`` or ``shown``, so that no newline, control
character or megabyte of input breaks that line."""

# The exit status of every command: 0 passed and trusted, 1 a check failed or the run was not
# trusted, 2 bad input (UsageError), 3 the run failed, 130 interrupted; 4 a bug in the
# testbed, never a verdict, bad input or a failed run.
EXIT_OK, EXIT_VERDICT, EXIT_USAGE, EXIT_RUN_FAILED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_INTERNAL = 4


def short(value, limit: int = 40) -> str:
    """``value`` for a message: its repr (a string quoted, control characters escaped), cut
    to about ``limit`` characters."""
    if isinstance(value, str):
        return repr(value if len(value) <= limit else value[:limit] + "...")
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def shown(text: str, limit: int = 40) -> str:
    """``text`` as it is when it prints as one short line, else quoted (``short``)."""
    return text if text.isprintable() and len(text) <= limit else short(text, limit)


class TestbedError(Exception):
    """A failure with a message that tells the user what to do."""


class UsageError(TestbedError):
    """The command cannot start as asked, and nothing was made: a bad input (ConfigError), or
    a machine it cannot run on here (not root, Mininet missing). Exit status 2."""


class ConfigError(UsageError):
    """A bad parameter, flag or scenario field; the message names the field."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class BusyError(TestbedError):
    """Another run holds the machine (one emulation per machine at a time)."""
