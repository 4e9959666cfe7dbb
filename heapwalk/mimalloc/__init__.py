"""Microsoft's mimalloc, decoded without symbols (docs/mimalloc.md)."""
