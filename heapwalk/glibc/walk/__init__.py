"""The careful walk: arenas, their rings, lists and heaps, every chunk, mmapped chunks, threads and their tcaches, each damage named where it is."""
