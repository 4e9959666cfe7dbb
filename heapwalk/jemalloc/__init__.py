"""jemalloc's allocator state, decoded from memory without debug symbols (Debian's libjemalloc2 5.2.1, 5.3.0)."""
