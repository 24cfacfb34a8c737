"""What a storage failure means: wait for MongoDB, tell an operator, or reject one document."""

from __future__ import annotations

from typing import Literal

from pymongo.errors import (
    ConnectionFailure,
    OperationFailure,
    PyMongoError,
    WriteConcernError,
)
from scrapy.exceptions import DropItem

__all__ = [
    "ItemNotStoredError",
    "ItemRejectedError",
    "Severity",
    "describe",
    "is_authentication_failure",
    "severity",
]

Severity = Literal["transient", "permanent"]

# Server error codes (mongo/src/mongo/base/error_codes.yml) that pass once a replica set has
# elected a primary or the server is back; any other refusal needs an operator.
_TRANSIENT_CODES = frozenset({
    6,  # HostUnreachable
    7,  # HostNotFound
    24,  # LockTimeout
    50,  # MaxTimeMSExpired
    64,  # WriteConcernFailed (wtimeout)
    89,  # NetworkTimeout
    91,  # ShutdownInProgress
    112,  # WriteConflict
    189,  # PrimarySteppedDown
    262,  # ExceededTimeLimit
    9001,  # SocketException
    10107,  # NotWritablePrimary
    11600,  # InterruptedAtShutdown
    11602,  # InterruptedDueToReplStateChange
    13435,  # NotPrimaryNoSecondaryOk
    13436,  # NotPrimaryOrSecondary
})  # fmt: skip
_AUTHENTICATION_FAILED = 18
#: UnknownReplWriteConcern (a tag set nobody has), UnsatisfiableWriteConcern (too many members).
_UNSATISFIABLE = frozenset({79, 100})


class ItemNotStoredError(Exception):
    """Neither MongoDB nor the local journal took the item: it is not stored anywhere."""


class ItemRejectedError(DropItem):
    """MongoDB cannot take this document (too large, not encodable, refused): it went to rejects."""


def severity(exc: PyMongoError) -> Severity:
    """``transient`` for an outage (journal and retry), ``permanent`` for what needs an operator.

    Permanent: a bad password, a missing privilege, a conflicting index, an unsatisfiable write
    concern, a command the server does not implement, and any refusal not known to pass.
    """
    if isinstance(exc, ConnectionFailure | WriteConcernError):
        return "transient"
    if isinstance(exc, OperationFailure):
        labels = ("RetryableWriteError", "TransientTransactionError", "ResumableChangeStreamError")
        if exc.code in _TRANSIENT_CODES or any(exc.has_error_label(label) for label in labels):
            return "transient"
        if "SQLITE_BUSY" in str(exc):
            return "transient"  # FerretDB's SQLite backend locked past its busy timeout
        concern = (exc.details or {}).get("writeConcernErrors") or []
        if concern and not {error.get("code") for error in concern} & _UNSATISFIABLE:
            return "transient"  # written, but not yet acknowledged as asked
    return "permanent"


def is_authentication_failure(exc: BaseException) -> bool:
    """The server refused the credentials of ``MONGO_URI`` (they never fix themselves)."""
    return isinstance(exc, OperationFailure) and exc.code == _AUTHENTICATION_FAILED


def describe(exc: BaseException) -> str:
    """One line for the log: the exception's name, its server code, its first 200 characters."""
    text = str(exc).split(", Timeout:")[0]  # drop pymongo's topology description
    code = getattr(exc, "code", None)
    name = type(exc).__name__ if code is None else f"{type(exc).__name__} {code}"
    return f"{name}: {text[:200]}"
