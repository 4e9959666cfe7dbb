"""Finding glibc's malloc in a target: its version, layout, main_arena, mp_, the TLS offsets, from symbols, libc's image or memory alone."""
