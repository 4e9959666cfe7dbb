"""musl's malloc (mallocng, musl 1.2.1 and later): its context, meta areas, groups and slots."""
