"""Builds heapwalk's two small C libraries (heapwalk/glibc/bulk/_native.c, the one pass's loops, and
heapwalk/analysis/_reach.c, the leak scan's search), loaded with ctypes.  Both are optional: when no C compiler
is at hand the install goes on, and heapwalk runs the same loops in Python."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("heapwalk.glibc.bulk._native", ["heapwalk/glibc/bulk/_native.c"], optional=True,
                             extra_compile_args=["-O2"]),
                   Extension("heapwalk.analysis._reach", ["heapwalk/analysis/_reach.c"], optional=True,
                             extra_compile_args=["-O2"])])
