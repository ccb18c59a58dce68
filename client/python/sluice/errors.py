"""sluice.Error and its subclasses: one per absl/gRPC status code, carrying the C++ message.

Catch the subclass by what you would do about it: ``Unavailable`` (retry later: the dispatcher
or a worker is unreachable), ``InvalidArgument`` (fix the spec or the arguments), ``NotFound``
(a path or job that does not exist), ``DataLoss`` (a corrupt shard), ``FailedPrecondition``
(wrong state, e.g. a job of that name with another config), ``PermissionDenied``, and so on.
Every error has ``.code`` (the numeric status code) and ``.message`` (the C++ message).
"""
from __future__ import annotations


class Error(Exception):
    """Base class of every error the sluice client raises.

    Attributes:
        code: the absl/gRPC status code (an int, 1..16).
        message: the message of the C++ status.
    """

    code: int = 2  # UNKNOWN, for a bare Error

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return "%s: %s" % (_NAMES.get(self.code, "UNKNOWN"), self.message)


class Cancelled(Error):
    """The operation was cancelled."""
    code = 1


class Unknown(Error):
    """An error of no known code."""
    code = 2


class InvalidArgument(Error, ValueError):
    """Bad input: a spec, an argument or an option. Also a ValueError."""
    code = 3


class DeadlineExceeded(Error):
    """A call did not finish within its deadline (see Client's timeout)."""
    code = 4


class NotFound(Error):
    """A dataset, file or job that does not exist."""
    code = 5


class AlreadyExists(Error):
    """Something to be created exists already."""
    code = 6


class PermissionDenied(Error):
    """The service refused: e.g. a path outside the workers' data roots."""
    code = 7


class ResourceExhausted(Error):
    """A limit was reached (memory, queue, quota)."""
    code = 8


class FailedPrecondition(Error):
    """Wrong state: e.g. a job of this name with another config, a protocol mismatch."""
    code = 9


class Aborted(Error):
    """The operation was aborted (a conflict); retrying the whole operation may succeed."""
    code = 10


class OutOfRange(Error):
    """Past the end of a valid range."""
    code = 11


class Unimplemented(Error, NotImplementedError):
    """Not supported by this build or this server. Also a NotImplementedError."""
    code = 12


class Internal(Error):
    """A bug in sluice: please report it with the message."""
    code = 13


class Unavailable(Error):
    """The dispatcher or a worker cannot be reached now; retry later."""
    code = 14


class DataLoss(Error):
    """Corrupt or truncated data (e.g. a shard whose checksum does not match)."""
    code = 15


class Unauthenticated(Error):
    """Missing or bad credentials (TLS certificate or token)."""
    code = 16


_CLASSES = {cls.code: cls for cls in (
    Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
    PermissionDenied, ResourceExhausted, FailedPrecondition, Aborted, OutOfRange, Unimplemented,
    Internal, Unavailable, DataLoss, Unauthenticated)}
_NAMES = {
    1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND",
    6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION", 10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED",
    13: "INTERNAL", 14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED"}


def from_status(code: int, message: str) -> Error:
    """The Error subclass instance for a status code (Unknown for codes it does not know)."""
    cls = _CLASSES.get(code, Unknown)
    error = cls(message)
    if cls is Unknown:
        error.code = code
    return error


__all__ = ["Error", "from_status"] + [cls.__name__ for cls in _CLASSES.values()]
