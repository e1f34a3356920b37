"""The exceptions kvgate raises, one class per kind of error, each carrying the Rust error's message."""


class KvgateError(Exception):
    """Base of every kvgate error."""


class PressureError(KvgateError):
    """The engine is short of memory or made no progress: retry later, or with a smaller load."""


class ImpossibleError(KvgateError):
    """The request can never run on this engine (it needs more than the engine's limits)."""


class InvalidError(KvgateError, ValueError):
    """A bad argument, config, trace or scenario; the message names the field and what is allowed."""


class InternalError(KvgateError):
    """A bug in kvgate: please report it with the message."""
