"""The command-line front end: `heapwalk` outside gdb (it drives gdb through gdb/MI), capture and diff."""
