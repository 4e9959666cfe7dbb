"""The target: a core file or a live process as memory (bulk reads, block cache), ELF images, threads and
registers, core notes, and the adapter that gets them from gdb (the only module here that imports gdb)."""
