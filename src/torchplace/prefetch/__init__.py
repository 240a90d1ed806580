"""Feed the device: :class:`DevicePrefetcher` and its pool of pinned staging buffers.

While the device computes on batch *n*, the prefetcher has already queued the copies of batches
*n+1 ... n+depth* on a side stream, from pinned host memory, so the transfer hides behind the
compute (the article's figure 2). How it stays correct:

- the consumer's stream waits on an event recorded after each batch's copies (a device-side
  wait, no host sync), so no kernel reads a batch before it has arrived;
- every tensor handed to the consumer is ``record_stream``-ed on the consumer's stream, so the
  caching allocator does not reuse its memory for the next copy while the consumer's kernels
  still read it, whether the consumer frees the batch at once or keeps references;
- host batches are staged through a bounded :class:`PinnedPool` of reusable pinned buffers; a
  buffer is handed out again only once the event of the copy out of it has completed. Over the
  cap the prefetcher degrades to a plain (blocking) copy instead of pinning more host memory;
- tensors that arrive already pinned (``DataLoader(pin_memory=True)``) are copied directly, not
  pinned twice.

On the CPU, or on a device without streams, the prefetcher is a plain pass-through with the same
API: each batch goes through the same move rules as :func:`torchplace.move`, and a batch that
is already in place is yielded as it is.

:meth:`DevicePrefetcher.stats` says where the time went: waiting for the source (CPU-bound),
for the copy (transfer-bound), or in the consumer (compute-bound).

Modules:

* ``prefetcher``: :class:`DevicePrefetcher`, the passes with and without streams;
* ``copies``: one batch's route per tensor, staging and copies on the side stream;
* ``staging``: :class:`PinnedPool`, the bounded pool of pinned buffers, and the layout of a
  batch inside one;
* ``stats``: :class:`PrefetchStats` and the bottleneck verdict;
* ``streams``: the stream and event operations used, behind one interface tests can fake.
"""

from __future__ import annotations

from torchplace.prefetch.prefetcher import DevicePrefetcher
from torchplace.prefetch.staging import DEFAULT_PIN_POOL_BYTES, PinnedPool
from torchplace.prefetch.stats import PrefetchStats

__all__ = ["DEFAULT_PIN_POOL_BYTES", "DevicePrefetcher", "PinnedPool", "PrefetchStats"]
