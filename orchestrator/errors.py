"""One exception family for everything a user can get wrong.

Each error carries a one-line message that names the file, line, key or URI at fault.
Entry points in ``jobs/`` catch :class:`SieveError` and print that line without a traceback.
"""


class SieveError(Exception):
    """Base class: a problem with the user's input or environment, not a bug."""


class ConfigError(SieveError):
    """A config file or override is missing, malformed, or has a bad key or value."""


class DataError(SieveError):
    """An input data file is missing or malformed (the message names file and line)."""


class ModelSourceError(SieveError):
    """A model name is not a local model folder, an s3:// URI or ``default``."""


class StorageError(SieveError):
    """A local or s3:// location cannot be read or written."""


class NoSuchKey(StorageError):
    """An s3:// object that is not there (which may still be a prefix with objects below it)."""


class StorageUnreachable(StorageError):
    """The S3 endpoint did not answer."""


class TrackingError(SieveError):
    """The MLflow tracking server or registry cannot be used."""


class TrackingUnreachable(TrackingError):
    """The tracking server did not answer (refused, unresolvable, timing out): an outage, worth a retry."""


class TrackingRejected(SieveError):
    """The tracking server (or the client on its behalf) refused a record: retrying it would be refused
    again, so it is kept aside rather than parked as an outage."""
