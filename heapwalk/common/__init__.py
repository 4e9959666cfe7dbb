"""The small models every part shares: `errors` (the bases of every error heapwalk raises), `findings` (what
any part can say), `view` (what any allocator's decoder gives the analysis) and `mapkinds` (what holds a byte of
a heap map)."""
