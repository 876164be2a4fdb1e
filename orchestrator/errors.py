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


class TrialsFailed(SieveError):
    """Trials of a job ended without a result (killed, out of memory, an error of their own): its figures would
    silently lack them, so the job ends non-zero; what finished is kept, and ``--resume`` trains the rest."""


class TrainingDiverged(SieveError):
    """The loss became NaN or infinite: every later step would train on it, so training stops at once."""


def sieve_cause(exc: BaseException | None) -> SieveError | None:
    """The :class:`SieveError` a worker raised, found inside what Ray hands the driver (a Tune trial's error
    wraps Ray Train's, which wraps the worker's): the user's one line, not three layers of traceback."""
    seen, todo = set(), [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, SieveError):
            return e
        todo += [e.__cause__, e.__context__, getattr(e, "cause", None)]
        failures = getattr(e, "worker_failures", None)  # Ray Train: {rank: the worker's exception}
        todo += list(failures.values()) if isinstance(failures, dict) else []
    return None
