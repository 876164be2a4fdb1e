"""The worker's data feed: its Ray Data shard ``train`` in batches, read ahead on a thread."""

from __future__ import annotations

import queue
import threading

_END = object()


class Ingest:
    """This worker's Ray Data shard ``train`` in batches, read ahead on a thread.

    Ray Data starts its executor (the split coordinator, the read tasks) when the first batch is
    asked for: seconds on a small machine, which a loop that asks only when it needs the batch spends
    waiting (``bench/results/train_throughput.md``). Made at the top of the train function, the
    reader starts while the model loads and then keeps ``depth`` batches ready while the loop
    computes; the next epoch starts reading as this one ends. ``depth=0``: read when asked.
    Iterating ``ingest(epoch)`` yields the same batches in the same order either way.
    """

    def __init__(self, batch_size: int, *, epochs: int, depth: int, shard=None):
        if shard is None:
            import ray.train  # lazy: the recipes import without Ray where none runs (bench/gpu.sh's image)

            shard = ray.train.get_dataset_shard("train")
        self.shard = shard
        self.batch_size, self.epochs, self.depth = batch_size, epochs, depth
        self.ahead = self._read_ahead(0) if depth > 0 else None

    def _batches(self):
        return self.shard.iter_batches(batch_size=self.batch_size, drop_last=True, batch_format="numpy")

    def _read_ahead(self, epoch: int) -> tuple[int, queue.Queue]:
        ready: queue.Queue = queue.Queue(maxsize=self.depth)

        def read() -> None:
            try:
                for batch in self._batches():
                    ready.put(batch)
                ready.put(_END)
            except BaseException as exc:  # noqa: BLE001 - raised again on the training thread
                ready.put(exc)

        threading.Thread(target=read, name=f"sieve-ingest-epoch-{epoch}", daemon=True).start()
        return epoch, ready

    def __call__(self, epoch: int):
        if self.depth == 0:
            yield from self._batches()
            return
        ahead, self.ahead = self.ahead, None
        _, ready = ahead if ahead is not None and ahead[0] == epoch else self._read_ahead(epoch)
        while (item := ready.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            yield item
        if epoch + 1 < self.epochs:
            self.ahead = self._read_ahead(epoch + 1)
