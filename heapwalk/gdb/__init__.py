"""The gdb front end: the `heapwalk` command family, parsing arguments, calling the parts and printing."""
