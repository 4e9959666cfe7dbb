"""Damage and crashes: the check of every invariant, which figures are partial, glibc's abort message, the crashing thread's pointers, one chunk explained."""
