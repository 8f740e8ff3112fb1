"""Errors the user caused or can act on; the CLI prints them as one line, never a traceback."""


class TestbedError(Exception):
    """A failure with a message that tells the user what to do."""


class ConfigError(TestbedError):
    """A bad parameter, flag or scenario field; the message names the field."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class BusyError(TestbedError):
    """Another run holds the machine (one emulation per machine at a time)."""
