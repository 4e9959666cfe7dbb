# heapwalk: load with `source /path/to/gdbinit` in gdb, or `gdb -x /path/to/gdbinit ...`.
# gdb embeds the system Python, not the project's virtualenv: this finds the
# project folder (the folder of this file) and the virtualenv's site-packages,
# puts both on gdb's sys.path, and says in one line what is missing if anything.
python
def _heapwalk_boot():
    import glob
    import os
    import sys

    def project_root():
        # gdb keeps the file it is sourcing open: find this gdbinit among our fds.
        found = None
        for fd in sorted(os.listdir("/proc/self/fd"), key=int):
            try:
                path = os.readlink("/proc/self/fd/" + fd)
            except OSError:
                continue
            if os.path.basename(path) == "gdbinit" and os.path.isfile(os.path.join(os.path.dirname(path), "heapwalk", "__init__.py")):
                found = os.path.dirname(path)
        return found or os.environ.get("HEAPWALK_HOME") or os.getcwd()

    root = project_root()
    if not os.path.isfile(os.path.join(root, "heapwalk", "__init__.py")):
        print("heapwalk: cannot find the heapwalk package next to gdbinit; set HEAPWALK_HOME to the project folder")
        return
    paths = [root]
    major, minor = sys.version_info[:2]
    venv = os.environ.get("HEAPWALK_VENV", os.path.join(root, ".venv"))
    paths += sorted(glob.glob(os.path.join(venv, "lib", "python%d.%d" % (major, minor), "site-packages")))
    paths += sorted(glob.glob(os.path.join(venv, "lib", "python3*", "site-packages")))
    for p in reversed(paths):
        if p not in sys.path:
            sys.path.insert(0, p)
    missing = []
    for module in ("rich", "numpy"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        print("heapwalk: gdb's Python %d.%d (%s) cannot import %s: run 'make venv' in %s, or install it for that interpreter"
              % (major, minor, sys.executable, ", ".join(missing), root))
        return
    import heapwalk
    heapwalk.load()

_heapwalk_boot()
del _heapwalk_boot
end
