"""Huge-page backed host buffers of the quantized tables (moved to ``lightrec._host_memory``, which the
trained tables of the torch kernel share; this name stays for existing imports)."""

from lightrec._host_memory import HUGE_PAGE_BYTES, allocate_host_buffer

__all__ = ["HUGE_PAGE_BYTES", "allocate_host_buffer"]
