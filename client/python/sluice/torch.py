"""sluice.torch: a torch IterableDataset over a sluice job.

    from torch.utils.data import DataLoader
    from sluice.torch import DataServiceDataset

    ds = DataServiceDataset("127.0.0.1:7000", "bench/pipelines/imagenet_train.yaml",
                            data="/data/imagenet-train-ur", job="resnet50-run3")
    loader = DataLoader(ds, batch_size=None, num_workers=2)
    for epoch in range(90):
        ds.set_epoch(epoch)                       # one pass = one epoch
        for batch in loader:
            loss = model(batch["image"]).loss(batch["label"])
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.distributed
import torch.utils.data

from sluice import errors
from sluice.client import TLS, BatchIterator, Client, Spec


class DataServiceDataset(torch.utils.data.IterableDataset):
    """Batches of a sluice job as dicts of tensors, for ``DataLoader(ds, batch_size=None)``.

    One pass over the dataset is one epoch, as with a DistributedSampler: ``for epoch in
    range(n): ds.set_epoch(epoch); for batch in loader: ...``. Each item is one batch already
    made by the service: ``{column: tensor, ..., "index": int64 tensor of global record indices,
    "epoch": int}``; tensors come from ``torch.from_numpy`` over the received buffers (no copy).
    Every record is delivered exactly once per epoch to the job's consumers, and every consumer
    gets the same number of batches (a few records read twice, unless ``drop_remainder``), so
    DDP ranks stay in step.

    Epochs: epoch e reads the service job ``"<job>/epoch-<e>"`` (one epoch, its seed mixed from
    ``seed`` and e, so each epoch has its own order and augmentation). Without ``set_epoch`` a
    process counts its own passes (``num_workers=0``, or ``persistent_workers=True``); with
    non-persistent DataLoader workers call ``set_epoch`` before each epoch, as for a
    DistributedSampler, since each epoch's workers are new copies of the dataset.

    Consumers: each process that iterates is one consumer of the epoch's job. With
    ``num_workers=k`` every DataLoader worker is its own consumer, and under
    ``torch.distributed`` (when initialised) every rank's workers are too: consumer index =
    rank * k + worker id, out of world_size * k. All of them must use the same ``job`` name,
    spec and num_workers.

    Fork safety: the gRPC client is created in ``__iter__``, inside the process that iterates,
    never in the constructor (gRPC does not survive ``fork``); the dataset pickles without it.

    Resumption: ``state_dict()`` in the training process (``{"job", "epoch"}``: the epoch the
    next pass reads) and ``load_state_dict(state)`` in the new one resume at an epoch boundary,
    with any number of ranks and workers. In the process that iterates (``num_workers=0``)
    ``state_dict()`` after an item was yielded also holds the iterator's position
    (``"iterator_state"``), and the next pass continues that epoch exactly where it stopped
    (torchdata's StatefulDataLoader convention). ``load_state_dict([state_0, ..., state_n-1])``
    with the states of all old ranks saved at the same step resumes mid-epoch on any number of
    ranks: each new rank reads its equal share (+-1 batch) of what the old ranks had not
    returned, in the epoch's order; every new rank loads the same list.

    Args:
        dispatcher: "host:port" of the sluice dispatcher.
        spec: the pipeline (file path, YAML/JSON text, dict or sluice.Pipeline).
        data: a Unirecord dataset folder replacing the spec's source.
        job: the training run's name, shared by every rank and worker of it.
        epochs: epochs the dataset allows (None or 0: no limit); a pass after them yields
            nothing.
        seed: the run's seed (order and augmentation).
        deterministic: batches in split order, the same for a seed whatever the worker count.
        drop_remainder: equal shares by dropping the epoch's tail instead of padding.
        split_size: records per split (0: the dispatcher's default).
        timeout: seconds to connect and per call to the dispatcher.
        tls: transport security (sluice.TLS, e.g. sluice.TLS.from_env()), None for plaintext.
        dispatcher_lost_timeout: seconds to keep reading and retrying an unreachable
            dispatcher before raising sluice.Unavailable.
        shared_memory_mb: the shared-memory ring each consumer offers each worker on its host
            (sluice.Client); 0: batches through loopback TCP only.
        sharing: "auto" to share production with other jobs of the same spec, data, seed and
            layout (docs/sharing.md); None or "off": not.

    Raises (while iterating): sluice.Error subclasses, as sluice.Client.open and its iterator.
    """

    def __init__(self, dispatcher: str, spec: Spec, *, data: Optional[str] = None, job: str,
                 epochs: Optional[int] = None, seed: int = 0, deterministic: bool = False,
                 drop_remainder: bool = False, split_size: int = 0, timeout: float = 10.0,
                 tls: Optional[TLS] = None, dispatcher_lost_timeout: float = 600.0,
                 sharing: Optional[str] = None, shared_memory_mb: int = 64) -> None:
        super().__init__()
        self.dispatcher = dispatcher
        self.spec = spec
        self.data = data
        self.job = job
        self.epochs = epochs
        self.seed = seed
        self.deterministic = deterministic
        self.drop_remainder = drop_remainder
        self.split_size = split_size
        self.timeout = timeout
        self.tls = tls
        self.dispatcher_lost_timeout = dispatcher_lost_timeout
        self.sharing = sharing
        self.shared_memory_mb = shared_memory_mb
        self._epoch = 0  # the epoch the next pass reads
        self._iterator: Optional[BatchIterator] = None
        self._iterator_epoch = 0
        # An iterator_state to continue, or those of all old ranks (a list).
        self._pending_state: Optional[Dict[str, Any]] = None
        # After a pass ended: its last state, or the error that prevented saving it.
        self._final_state: Optional[Any] = None

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next pass reads (as DistributedSampler.set_epoch)."""
        if epoch < 0:
            raise errors.InvalidArgument("set_epoch: epoch must be >= 0, got %d" % epoch)
        self._epoch = int(epoch)

    @property
    def epoch(self) -> int:
        """The epoch the next pass reads."""
        return self._epoch

    def job_name(self, epoch: int) -> str:
        """The service job that reads `epoch`: "<job>/epoch-<epoch>"."""
        return "%s/epoch-%d" % (self.job, epoch)

    def consumer(self) -> Tuple[int, int]:
        """(consumer_index, num_consumers) of the calling process (see the class comment)."""
        info = torch.utils.data.get_worker_info()
        worker_id, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        rank, world = 0, 1
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        return rank * num_workers + worker_id, world * num_workers

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        epoch = self._epoch
        self._close()
        self._final_state = None
        if self.epochs and epoch >= self.epochs:
            return iter(())
        consumer_index, num_consumers = self.consumer()
        state, self._pending_state = self._pending_state, None
        restore: Any = None
        if state is not None and state.get("iterator_state") and state.get("epoch", 0) == epoch:
            restore = state["iterator_state"]  # a dict, or a list of all old ranks' dicts
        client = Client(self.dispatcher, timeout=self.timeout, tls=self.tls,
                        dispatcher_lost_timeout=self.dispatcher_lost_timeout,
                        shared_memory_mb=self.shared_memory_mb)
        self._iterator = client.open(
            self.spec, data=self.data, job=self.job_name(epoch), epochs=1,
            seed=_epoch_seed(self.seed, epoch), consumer_index=consumer_index,
            num_consumers=num_consumers, deterministic=self.deterministic,
            drop_remainder=self.drop_remainder, split_size=self.split_size,
            restore_state=restore, sharing=self.sharing)
        self._iterator_epoch = epoch
        return self._generate(self._iterator, epoch)

    def _generate(self, it: BatchIterator, epoch: int) -> Iterator[Dict[str, Any]]:
        completed = False
        try:
            for batch in it:
                out = {k: torch.from_numpy(v) if hasattr(v, "__array_interface__") else v
                       for k, v in batch.items()}
                out["epoch"] = epoch
                yield out
            completed = True
            self._epoch = epoch + 1
        finally:
            if completed:
                self._final_state = {"job": self.job, "epoch": epoch + 1}
            else:
                try:  # where this epoch stopped, for a state_dict() after the pass ended
                    self._final_state = {"job": self.job, "epoch": epoch,
                                         "iterator_state": it.state_dict()}
                except errors.Error as e:
                    self._final_state = e
            it.close()
            if self._iterator is it:
                self._iterator = None

    def state_dict(self) -> Dict[str, Any]:
        """Where to resume (picklable): {"job", "epoch"} and, in the process that iterates,
        mid-epoch, "iterator_state".

        Raises:
            sluice.Unimplemented: the C++ client of this build cannot save state.
        """
        if self._iterator is not None:
            return {"job": self.job, "epoch": self._iterator_epoch,
                    "iterator_state": self._iterator.state_dict()}
        if isinstance(self._final_state, errors.Error):
            raise self._final_state
        if self._final_state is not None:
            return dict(self._final_state)
        if self._pending_state is not None:
            return dict(self._pending_state)
        return {"job": self.job, "epoch": self._epoch}

    def load_state_dict(self,
                        state: Union[Mapping[str, Any], Sequence[Mapping[str, Any]]]) -> None:
        """Makes the next pass continue from `state` ({}: from epoch 0): at its epoch, and,
        if it holds an iterator_state, where that epoch stopped. A list holds the state_dict()s
        of all old ranks, saved at the same step: the next pass reads this rank's equal share
        of what they had not returned (any number of ranks; every rank loads the same list).

        Raises:
            sluice.InvalidArgument: a state belongs to another job, or the list's states are
                of different epochs.
        """
        if not isinstance(state, Mapping):
            state = self._merge_rank_states(list(state))
        if state and state.get("job") != self.job:
            raise errors.InvalidArgument("load_state_dict: state of job %r, this dataset reads %r"
                                         % (state.get("job"), self.job))
        self._epoch = int(state.get("epoch", 0)) if state else 0
        self._pending_state = dict(state) if state and state.get("iterator_state") else None
        self._final_state = None

    def _merge_rank_states(self, states: List[Mapping[str, Any]]) -> Dict[str, Any]:
        """One state whose iterator_state is the list of all ranks' iterator states."""
        if not states:
            raise errors.InvalidArgument("load_state_dict: an empty list of rank states")
        for s in states:
            if not isinstance(s, Mapping) or s.get("job") != self.job:
                raise errors.InvalidArgument(
                    "load_state_dict: a rank state of job %r, this dataset reads %r"
                    % (s.get("job") if isinstance(s, Mapping) else s, self.job))
        epochs = sorted({int(s.get("epoch", 0)) for s in states})
        if len(epochs) != 1:
            raise errors.InvalidArgument(
                "load_state_dict: the rank states are of epochs %s; pass states saved at the "
                "same step" % epochs)
        iterators = [s["iterator_state"] for s in states if s.get("iterator_state")]
        if iterators and len(iterators) != len(states):
            raise errors.InvalidArgument(
                "load_state_dict: %d of the %d rank states hold no iterator_state; pass the "
                "states every rank saved mid-epoch at the same step"
                % (len(states) - len(iterators), len(states)))
        merged: Dict[str, Any] = {"job": self.job, "epoch": epochs[0]}
        if iterators:
            merged["iterator_state"] = iterators
        return merged

    def _close(self) -> None:
        if self._iterator is not None:
            self._iterator.close()
            self._iterator = None

    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        state["_iterator"] = None  # never carry a gRPC client into another process
        return state

    def __repr__(self) -> str:
        return "DataServiceDataset(dispatcher=%r, job=%r, epoch=%d)" % (
            self.dispatcher, self.job, self._epoch)


def _epoch_seed(seed: int, epoch: int) -> int:
    """The seed of the job that reads `epoch`: a different, fixed one per (seed, epoch)."""
    return (seed * 1_000_003 + epoch) % (1 << 64)


__all__ = ["DataServiceDataset"]
