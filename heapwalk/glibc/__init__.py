"""glibc's malloc: discovery (symbols, else memory), layouts per version, list walkers, the one-pass chunk
walk, the tcache scan, the trim what-if, the integrity check and malloc_info's XML.  Imports the target's
memory and shared findings; never a front end, never gdb."""
