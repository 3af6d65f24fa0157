"""Real containers on the simulated node, for tests, benchmarks and the demo.

Standard library and the real tools only (runc, containerd, podman); nothing here is on a
production path.
"""
