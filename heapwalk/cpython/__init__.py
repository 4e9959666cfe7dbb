"""CPython's small-object allocator (obmalloc, "pymalloc"): the arenas a Python interpreter maps for itself,
outside malloc, found from their pool headers without symbols; their pools and blocks by size class, as
``sys._debugmallocstats()`` counts them; and the memory they hold that Python has freed."""
