"""Where every byte is: the account per arena, what malloc_trim(0) would give back, what is resident, the allocator-neutral view, the leak scan's blocks, the heap strips and glibc's verdict."""
