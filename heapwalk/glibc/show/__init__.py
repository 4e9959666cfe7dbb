"""glibc's tables, JSON documents, page sections, malloc_info XML, report words and its own commands (bins, tcache, chunks, chunk)."""
