"""Applying container edits (`gpuwire.edits`) to a container: the mechanics.

`inject` puts them into a created container (the prestart hook) or makes the links and the
ld cache before runc creates it (the shim); every path inside the root is resolved inside it
(`inroot`, on `gpuwire.resolve`), the ld cache is written there (`ldcache`), device access is
allowed in the cgroup (`cgroup`), and namespace work runs in a forked child (`child`) through
the system calls `os` lacks (`gpuwire.syscalls`). Only the start path calls this.
"""
