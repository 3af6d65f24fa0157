"""Mutating admission webhook: pod annotations → env, grant, affinity, runtime class."""
