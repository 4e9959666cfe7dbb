"""A CPython program with a known number of small objects alive and freed (issue 41): it makes tuples, floats,
short strings and small lists across size classes, frees two out of three of them in a scattered order (the
pools they leave are partly free, some arenas wholly), starts threads that allocate and exit, then prints
obmalloc's own statistics (sys._debugmallocstats, to stats.txt in the folder given as its one argument) and
stops itself (SIGSTOP) at once, so that a snapshot sees what was printed."""

import os
import random
import signal
import sys
import threading

out = sys.argv[1]
random.seed(41)
kept = []
for i in range(60000):
    kind = i % 4
    if kind == 0:
        kept.append((i, i + 1, str(i)))
    elif kind == 1:
        kept.append(float(i) + 0.5)
    elif kind == 2:
        kept.append("x" * (i % 300))
    else:
        kept.append([i] * (i % 40))
order = list(range(len(kept)))
random.shuffle(order)
for n, i in enumerate(order):
    if n % 3:
        kept[i] = None


def worker(n):
    local = [bytes(n % 500) for _ in range(2000)]
    del local[::2]


threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
del threads, order

fd = os.open(os.path.join(out, "stats.txt"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.dup2(fd, 2)
pid, stop, kill = os.getpid(), signal.SIGSTOP, os.kill
sys._debugmallocstats()
kill(pid, stop)
