"""Kubelet device plugin (v1beta1): capacity, health, allocation, topology, node labels."""
