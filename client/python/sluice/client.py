"""sluice.Client and its BatchIterator: a training process's share of a job, as numpy arrays."""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from sluice import _sluice
from sluice import errors
from sluice.pipeline import Pipeline

#: A pipeline: a YAML/JSON file path, YAML/JSON text, a dict in that layout, or a Pipeline.
Spec = Union[str, "os.PathLike[str]", Pipeline, Mapping[str, Any]]
#: A batch: a numpy array per numeric column (bytes/str for opaque columns) plus "index".
Batch = Dict[str, Any]
# One state_dict(), or those of all consumers of a job saved at the same step.
RestoreState = Union[Mapping[str, Any], Sequence[Mapping[str, Any]]]

_STATE_VERSION = 1


@dataclasses.dataclass(frozen=True)
class TLS:
    """Transport security for Client: PEM file paths and a bearer-token file.

    ca: the CA that signed the dispatcher's and workers' certificates; cert/key: this client's
    certificate and key (mutual TLS); token_file: a file holding the token sent with every call;
    server_name: the name the servers' certificates carry, checked instead of the host dialled
    (on Kubernetes workers are dialled by pod IP and share one certificate naming a service).
    """

    ca: Optional[str] = None
    cert: Optional[str] = None
    key: Optional[str] = None
    token_file: Optional[str] = None
    server_name: Optional[str] = None

    @classmethod
    def from_env(cls) -> Optional["TLS"]:
        """The SLUICE_TLS_CA, SLUICE_TLS_CERT, SLUICE_TLS_KEY, SLUICE_AUTH_TOKEN_FILE and
        SLUICE_TLS_SERVER_NAME environment variables (the sluice CLI's), or None without
        SLUICE_TLS_CA."""
        env = os.environ.get
        if not env("SLUICE_TLS_CA"):
            return None
        return cls(ca=env("SLUICE_TLS_CA"), cert=env("SLUICE_TLS_CERT"),
                   key=env("SLUICE_TLS_KEY"), token_file=env("SLUICE_AUTH_TOKEN_FILE"),
                   server_name=env("SLUICE_TLS_SERVER_NAME"))


class Client:
    """A connection to a sluice dispatcher. Thread-safe; may open several iterators.

    Args:
        dispatcher: "host:port" of the dispatcher (`sluice local` prints it).
        timeout: seconds to connect, and the deadline of each call to the dispatcher.
        tls: transport security (see TLS); None: plaintext.
        dispatcher_lost_timeout: seconds an iterator keeps reading the splits it holds and
            retrying an unreachable dispatcher (stopped, paused, restarting) before it raises
            sluice.Unavailable.
        shared_memory_mb: the shared-memory ring offered to each worker, in MiB: workers on
            this host write batches there instead of sending them through loopback TCP
            (docs/architecture.md, "Co-located trainers and workers"); 0: off.

    Raises:
        sluice.Unavailable: nothing (or no sluice dispatcher) answers at `dispatcher` within
            `timeout`.
        sluice.FailedPrecondition: the dispatcher speaks another protocol version.
        sluice.InvalidArgument: bad options.
    """

    def __init__(self, dispatcher: str, *, timeout: float = 10.0,
                 tls: Optional[TLS] = None,
                 dispatcher_lost_timeout: float = 600.0, shared_memory_mb: int = 64) -> None:
        tls_fields = {} if tls is None else {
            k: str(v) for k, v in dataclasses.asdict(tls).items() if v is not None}
        self.dispatcher = dispatcher
        if not dispatcher_lost_timeout > 0:
            raise errors.InvalidArgument("dispatcher_lost_timeout must be > 0 seconds, got %r"
                                         % (dispatcher_lost_timeout,))
        if not 0 <= shared_memory_mb <= 16384:
            raise errors.InvalidArgument("shared_memory_mb must be 0 (off) or 1..16384, got %r"
                                         % (shared_memory_mb,))
        self._client = _sluice.Client(dispatcher, float(timeout), tls_fields,
                                      float(dispatcher_lost_timeout), int(shared_memory_mb))

    def open(self, spec: Spec, *, data: Optional[str] = None, job: str, epochs: int = 1,
             seed: int = 0, consumer_index: int = 0, num_consumers: int = 1,
             deterministic: bool = False, drop_remainder: bool = False, split_size: int = 0,
             restore_state: Optional[RestoreState] = None,
             finish: Optional[str] = None, priority: int = 0,
             min_workers: int = 0, sharing: Optional[str] = None,
             cache: Optional[str] = None) -> "BatchIterator":
        """Starts reading this consumer's share of the job named `job`.

        Consumers of one training run open the same `job` with the same spec, each with its own
        `consumer_index` in [0, num_consumers). Every record is delivered exactly once per epoch
        to the job's consumers (shares are padded to equal size with a few records read twice,
        unless `drop_remainder`).

        Args:
            spec: the pipeline: a path to a .yaml/.yml/.json file, YAML/JSON text, a dict in that
                layout, or a sluice.Pipeline.
            data: a Unirecord dataset folder replacing the spec's source, as the data workers
                see it (a worker reads its manifest; this process need not have the folder).
            job: the job's name; consumers of one run share it.
            epochs: epochs to read (0: until the iterator is closed).
            seed: the job seed (order and augmentation).
            deterministic: return batches in the split sequence's order, the same for a given
                seed whatever the number of workers (otherwise arrival order: faster).
            split_size: records per split (0: the dispatcher's default).
            restore_state: an iterator's state_dict(), to continue where it stopped; or the
                state_dict()s that all consumers of the job saved at the same step (a list, one
                per old consumer): with another num_consumers, this consumer reads its equal
                share (+-1 batch) of what they had not returned, in the epoch's order; every
                new consumer passes the same list.
            finish: where normalize [, hwc2chw] [, cast to float32] before the batch runs:
                "auto" (in this process when the column is uint8: 4x fewer bytes on the wire),
                "worker" or "client"; None keeps the spec's `finish` (default auto). The arrays
                are the same either way.
            priority: when the dispatcher's worker pool is bounded (--max-workers), a job of
                higher priority gets its need first (default 0).
            min_workers: workers reserved for this job when the pool is bounded
                (while every job's reservation fits the pool; else the largest are dropped).
            sharing: "auto" to share production with the other jobs of the same dataset,
                pipeline, seed and layout that opt in (each batch produced once for all of
                them, each job still exactly once; docs/sharing.md); None or "off": not.
            cache: "auto" to let the dispatcher cache the pipeline's deterministic prefix from
                the second epoch when its measured cost says reading it back is cheaper than
                computing it (docs/cache.md, "cache: auto"); None or "off": only an explicit
                cache node caches.

        Returns:
            A BatchIterator yielding dicts {column: numpy array, ..., "index": int64 array}.

        Raises:
            sluice.InvalidArgument: a bad spec (naming the node and field) or argument.
            sluice.NotFound: the spec file or the dataset does not exist.
            sluice.PermissionDenied: the dataset is outside the workers' --data-root.
            sluice.FailedPrecondition: a job of that name exists with another config.
            sluice.Unavailable: the dispatcher cannot be reached.
        """
        text, is_file = _spec_text(spec)
        options = dict(spec=text, spec_is_file=is_file, data="" if data is None else str(data),
                       job=job, epochs=epochs, seed=seed, consumer_index=consumer_index,
                       num_consumers=num_consumers, deterministic=deterministic,
                       drop_remainder=drop_remainder, split_size=split_size,
                       finish="" if finish is None else finish, priority=priority,
                       min_workers=min_workers, sharing="" if sharing is None else sharing,
                       cache="" if cache is None else cache)
        _check_integers(options)
        return BatchIterator(self, options, restore_state)


# The integer arguments of Client.open and the range of their wire types (min_workers: the
# dispatcher's, which counts workers in an int).
_INTEGER_RANGES = {
    "epochs": (0, 2**64 - 1), "seed": (0, 2**64 - 1), "consumer_index": (0, 2**32 - 1),
    "num_consumers": (0, 2**32 - 1), "split_size": (0, 2**64 - 1),
    "priority": (-2**31, 2**31 - 1), "min_workers": (0, 2**31 - 1),
}


def _check_integers(options: Dict[str, Any]) -> None:
    """Raises InvalidArgument naming an integer argument that is not one (a bool, a float,
    None) or is out of its range; numpy integers become ints."""
    for name, (low, high) in _INTEGER_RANGES.items():
        value = options[name]
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
                or not low <= value <= high:
            raise errors.InvalidArgument(
                "%s must be an integer in [%d, %d], got %r" % (name, low, high, value))
        options[name] = int(value)


class BatchIterator:
    """One consumer's share of a job: iterate to get batches, in order, until all epochs end.

    Each batch is a dict: a numpy array per numeric column (over the received buffer, not a
    copy: writable, alive as long as any array over it), ``bytes``/``str`` for opaque columns,
    and ``"index"``: the int64 global record index of each element. ``next()`` releases the GIL
    while it waits. Use from one thread at a time; ``close()`` (or ``with``) stops the streams.
    """

    def __init__(self, client: Client, options: Dict[str, Any],
                 restore_state: Optional[RestoreState]) -> None:
        self._client = client
        self._options = options
        self._it: Optional[Any] = None
        self._open(restore_state)

    def __iter__(self) -> "BatchIterator":
        return self

    def __next__(self) -> Batch:
        """The next batch. Raises StopIteration after the last epoch, sluice.Error on failure."""
        batch = self._live().next()
        if batch is None:
            raise StopIteration
        return batch

    @property
    def epoch(self) -> int:
        """The epoch of the last batch returned (the first epoch before that)."""
        return self._live().epoch

    @property
    def last_batch_info(self) -> Dict[str, int]:
        """Where the last batch came from: epoch, position, split_id, batch_index."""
        return self._live().last_batch_info()

    @property
    def wait_seconds(self) -> float:
        """Total time next() waited for a batch, in seconds."""
        return self._live().wait_seconds

    @property
    def buffered_batches(self) -> int:
        """Batches received and not yet returned."""
        return self._live().buffered_batches

    @property
    def job_id(self) -> int:
        return self._live().job_id

    def state_dict(self) -> Dict[str, Any]:
        """What was returned so far, to resume from in another process (picklable).

        Raises:
            sluice.Unimplemented: the C++ client of this build cannot save state.
        """
        return {"version": _STATE_VERSION, "job": self._options["job"],
                "consumer_index": self._options["consumer_index"],
                "num_consumers": self._options["num_consumers"],
                "iterator": self._live().save_state()}

    def load_state_dict(self, state: RestoreState) -> None:
        """Continues from `state` (a state_dict() of this job and consumer): reopens the job
        there, so the batches returned before the state was saved are not returned again.
        A state saved at an epoch boundary may be loaded by any consumer of any world size.
        A list of the state_dict()s of all old consumers, saved at the same step, resumes on
        any number of consumers mid-epoch: each reads its equal share of what they had not
        returned (every new consumer loads the same list).

        Raises:
            sluice.InvalidArgument: a state is of another version or job, of another consumer
                or world size mid-epoch (a single state), or the list is not one state per old
                consumer of one step.
            sluice.FailedPrecondition: another consumer of the job resumed from another list.
        """
        self.close()
        self._open(state)

    def close(self) -> None:
        """Stops the streams and joins the client's threads. Idempotent."""
        if self._it is not None:
            it, self._it = self._it, None
            it.close()

    def __enter__(self) -> "BatchIterator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _open(self, state: Optional[RestoreState]) -> None:
        if state is None or isinstance(state, Mapping):
            restore = None if state is None else _check_state(state, self._options)
            self._it = self._client._client.open(restore_state=restore, **self._options)
            return
        states = list(state)
        if not states:
            raise errors.InvalidArgument("restore_state: an empty list of states")
        restores = [_check_state(s, self._options) for s in states]
        self._it = self._client._client.open(restore_state=None, restore_states=restores,
                                             **self._options)

    def _live(self) -> Any:
        if self._it is None:
            raise errors.FailedPrecondition("the iterator is closed")
        return self._it


def _check_state(state: Mapping[str, Any], options: Mapping[str, Any]) -> bytes:
    if not isinstance(state, Mapping) or state.get("version") != _STATE_VERSION:
        raise errors.InvalidArgument(
            "restore_state: not a sluice iterator state of version %d (got %r)"
            % (_STATE_VERSION, state.get("version") if isinstance(state, Mapping) else state))
    # consumer_index and num_consumers may differ at an epoch boundary: the C++ client decides.
    if state.get("job") != options["job"]:
        raise errors.InvalidArgument(
            "restore_state: saved for job=%r, but this iterator has job=%r"
            % (state.get("job"), options["job"]))
    return bytes(state["iterator"])


def _spec_text(spec: Spec) -> Tuple[str, bool]:
    """(text, is_file) for the C++ parser."""
    if isinstance(spec, Pipeline):
        return spec.to_json(), False
    if isinstance(spec, Mapping):
        import json
        return json.dumps(spec), False
    if isinstance(spec, os.PathLike):
        return os.fspath(spec), True
    if isinstance(spec, str):
        one_line = "\n" not in spec
        if one_line and (os.path.exists(spec) or
                         spec.endswith((".yaml", ".yml", ".json"))):
            return spec, True
        return spec, False
    raise errors.InvalidArgument(
        "spec: expected a file path, YAML/JSON text, a dict or a sluice.Pipeline, got %s"
        % type(spec).__name__)


# The extension returns plain ndarrays; this keeps numpy imported for type checkers and makes
# `import sluice` fail early, clearly, when numpy is missing.
_ = np.ndarray
