"""sluice.torch: a torch IterableDataset over a sluice job.

    from torch.utils.data import DataLoader
    from sluice.torch import DataServiceDataset

    ds = DataServiceDataset("127.0.0.1:7000", "bench/pipelines/imagenet_train.yaml",
                            data="/data/imagenet-train-ur", job="resnet50-run3", epochs=90)
    for batch in DataLoader(ds, batch_size=None, num_workers=2):
        loss = model(batch["image"]).loss(batch["label"])
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, Mapping, Optional, Tuple

import torch
import torch.distributed
import torch.utils.data

from sluice import errors
from sluice.client import TLS, BatchIterator, Client, Spec


class DataServiceDataset(torch.utils.data.IterableDataset):
    """Batches of a sluice job as dicts of tensors, for ``DataLoader(ds, batch_size=None)``.

    Each item is one batch already made by the service: ``{column: tensor, ..., "index": int64
    tensor of global record indices}``; tensors come from ``torch.from_numpy`` over the received
    buffers (no copy). Iterating once reads all ``epochs`` epochs; every record is delivered
    exactly once per epoch to the job's consumers.

    Consumers: each process that iterates is one consumer of the job. With ``num_workers=k``
    every DataLoader worker is its own consumer, and under ``torch.distributed`` every rank's
    workers are too: consumer index = rank * k + worker id, out of world_size * k. All of them
    must use the same ``job`` name, spec and num_workers.

    Fork safety: the gRPC client is created in ``__iter__``, inside the process that iterates,
    never in the constructor (gRPC does not survive ``fork``); the dataset pickles without it.

    Resumption follows torchdata's StatefulDataLoader convention: ``state_dict()`` (called in the
    process that iterates, after an item was yielded) returns what was yielded so far, and
    ``load_state_dict(state)`` (before iterating) makes the next ``__iter__`` continue from it.

    Args:
        dispatcher: "host:port" of the sluice dispatcher.
        spec: the pipeline (file path, YAML/JSON text, dict or sluice.Pipeline).
        data: a Unirecord dataset folder replacing the spec's source.
        job: the job's name, shared by every consumer of this training run.
        epochs: epochs per iteration of the dataset (0: until the iteration stops).
        seed: the job seed (order and augmentation).
        deterministic: batches in split order, the same for a seed whatever the worker count.
        drop_remainder: equal shares by dropping the epoch's tail instead of padding.
        split_size: records per split (0: the dispatcher's default).
        timeout: seconds to connect and per call to the dispatcher.
        tls: transport security (sluice.TLS), None for plaintext.
        dispatcher_lost_timeout: seconds to keep reading and retrying an unreachable
            dispatcher before raising sluice.Unavailable.

    Raises (while iterating): sluice.Error subclasses, as sluice.Client.open and its iterator.
    """

    def __init__(self, dispatcher: str, spec: Spec, *, data: Optional[str] = None, job: str,
                 epochs: int = 1, seed: int = 0, deterministic: bool = False,
                 drop_remainder: bool = False, split_size: int = 0, timeout: float = 10.0,
                 tls: Optional[TLS] = None, dispatcher_lost_timeout: float = 600.0) -> None:
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
        self._iterator: Optional[BatchIterator] = None
        self._pending_state: Optional[Dict[str, Any]] = None
        # After an iteration ended: its last state, or the error that prevented saving it.
        self._final_state: Optional[Any] = None

    def consumer(self) -> Tuple[int, int]:
        """(consumer_index, num_consumers) of the calling process (see the class comment)."""
        info = torch.utils.data.get_worker_info()
        worker_id, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        rank, world = 0, 1
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        return rank * num_workers + worker_id, world * num_workers

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        consumer_index, num_consumers = self.consumer()
        client = Client(self.dispatcher, timeout=self.timeout, tls=self.tls,
                        dispatcher_lost_timeout=self.dispatcher_lost_timeout)
        state, self._pending_state = self._pending_state, None
        if state is not None and not state.get("iterator_state"):
            state = None  # saved before anything was yielded: start fresh
        self._close()
        self._iterator = client.open(
            self.spec, data=self.data, job=self.job, epochs=self.epochs, seed=self.seed,
            consumer_index=consumer_index, num_consumers=num_consumers,
            deterministic=self.deterministic, drop_remainder=self.drop_remainder,
            split_size=self.split_size,
            restore_state=None if state is None else state["iterator_state"])
        self._final_state = None
        return self._generate(self._iterator)

    def _generate(self, it: BatchIterator) -> Iterator[Dict[str, Any]]:
        try:
            for batch in it:
                yield {k: torch.from_numpy(v) if hasattr(v, "__array_interface__") else v
                       for k, v in batch.items()}
        finally:
            try:  # what was yielded, for a state_dict() after the iteration ended
                self._final_state = {"job": self.job, "iterator_state": it.state_dict()}
            except errors.Error as e:
                self._final_state = e
            it.close()
            if self._iterator is it:
                self._iterator = None

    def state_dict(self) -> Dict[str, Any]:
        """What this process's iteration has yielded so far (picklable; {} before iterating).

        Raises:
            sluice.Unimplemented: the C++ client of this build cannot save state.
        """
        if self._iterator is None:
            if isinstance(self._final_state, errors.Error):
                raise self._final_state
            if self._final_state is not None:
                return dict(self._final_state)
            return dict(self._pending_state) if self._pending_state else {}
        return {"job": self.job, "iterator_state": self._iterator.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Makes the next __iter__ continue after what `state` had yielded ({}: from the start).

        Raises:
            sluice.InvalidArgument: the state belongs to another job.
        """
        if state and state.get("job") != self.job:
            raise errors.InvalidArgument("load_state_dict: state of job %r, this dataset reads %r"
                                         % (state.get("job"), self.job))
        self._pending_state = dict(state) if state else None
        self._final_state = None

    def _close(self) -> None:
        if self._iterator is not None:
            self._iterator.close()
            self._iterator = None

    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        state["_iterator"] = None  # never carry a gRPC client into another process
        return state

    def __repr__(self) -> str:
        return "DataServiceDataset(dispatcher=%r, job=%r, epochs=%d)" % (
            self.dispatcher, self.job, self.epochs)


__all__ = ["DataServiceDataset"]
