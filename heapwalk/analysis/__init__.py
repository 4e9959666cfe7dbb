"""Analysis over a decoded heap: the report (where every byte is) and its verdict."""
