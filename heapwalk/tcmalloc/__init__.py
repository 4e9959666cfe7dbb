"""gperftools' tcmalloc: its page heap, central free lists, transfer caches and thread caches, found in the
object that holds it without symbols, with the figures its MallocExtension statistics give."""
