"""Google's tcmalloc (github.com/google/tcmalloc): per-CPU caches, transfer caches, a huge-page-aware page allocator."""
