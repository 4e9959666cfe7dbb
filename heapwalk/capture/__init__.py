"""Taking a core of a running process without harming it: stopping it (ptrace), the plan of which pages to
read and which are known without a read (coreplan, proc), the copy made while it runs (precopy), the notes a
core carries (corenotes), the writer that puts them together (corewriter) and the watcher that lets the
process go should `capture --live` die while its gdb attaches (guard).  Used by the command line's
`heapwalk capture`; depends only on `heapwalk.inferior`, `heapwalk.arch` and `heapwalk.common.errors`."""
