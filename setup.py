"""Builds heapwalk's small C libraries, loaded with ctypes: heapwalk/glibc/bulk/_native.c (glibc's one pass),
heapwalk/jemalloc/_native.c (jemalloc's slabs), heapwalk/inferior/_slots.c (free lists through a page's slots:
tcmalloc's spans, mimalloc's pages) and heapwalk/analysis/_reach.c (the leak scan's search).  All are
optional: when no C compiler is at hand the install goes on, and heapwalk runs the same loops in Python."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("heapwalk.glibc.bulk._native", ["heapwalk/glibc/bulk/_native.c"], optional=True,
                             extra_compile_args=["-O2"]),
                   Extension("heapwalk.jemalloc._native", ["heapwalk/jemalloc/_native.c"], optional=True,
                             extra_compile_args=["-O2"]),
                   Extension("heapwalk.inferior._slots", ["heapwalk/inferior/_slots.c"], optional=True,
                             extra_compile_args=["-O2"]),
                   Extension("heapwalk.analysis._reach", ["heapwalk/analysis/_reach.c"], optional=True,
                             extra_compile_args=["-O2", "-pthread"], extra_link_args=["-pthread"])])
