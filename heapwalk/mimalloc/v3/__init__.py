"""mimalloc 3: no segments; pages cut from arenas' slices (or taken from the system), found through the arenas'
bitmaps and the page map."""
