"""Tiered tables: every row in host memory or on SSD, a cache of hot rows where the lookups run.

One kernel (``"tiered"``, :class:`~lightrec.kernels.tiered.backend.TieredBatchedLookup`) and fbgemm's
own HBM cache where its CUDA build is installed (``"fbgemm_managed_caching"``); docs/tiered-tables.md::

    config.py          TieringConfig: the backing tier, the cache's size and eviction rule
    backend.py         TieredBatchedLookup: the kernel -- lookups, prefetch, flush, checkpoint rows
    cache.py           CacheIndex: which row sits in which slot, which slot to give up next
    inflight.py        BatchesInFlight: the batches whose slots must stay put until their backward
    transfer.py        TransferQueue: rows moved between cache and store, off the training thread
    store.py           HostMemoryStore / SsdRowStore: every row and its optimizer state
    fbgemm_caching.py  FbgemmManagedCachingLookup: fbgemm's MANAGED_CACHING TBE (CUDA only)

The public names are exported by :mod:`lightrec.kernels` (``TieringConfig``, ``TieredBatchedLookup``,
``TieredCacheStats``, ``CacheFullError``, ``TieredStorageError``). This file imports nothing: the
kernel interface (``kernel_interface.py``) imports ``config.py``, and ``backend.py`` imports the kernel
interface, so a package that imported its modules here would make that a circle.
"""
