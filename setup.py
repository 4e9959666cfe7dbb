"""Builds heapwalk's one small C library (heapwalk/glibc/_native.c, loaded with ctypes).  It is optional: when
no C compiler is at hand the install goes on, and heapwalk runs the same loops in Python."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("heapwalk.glibc._native", ["heapwalk/glibc/_native.c"], optional=True,
                             extra_compile_args=["-O2"])])
