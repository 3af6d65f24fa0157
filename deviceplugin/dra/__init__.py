"""The DRA plugin (`gpuwire dra serve`): the node's GPUs as Dynamic Resource Allocation devices.

It publishes every GPU in ResourceSlices (`resource.k8s.io/v1`) so the kube-scheduler sees
each one with its attributes, prepares the claims the scheduler allocated here (a CDI spec per
claim with gpuwire's container edits), and turns health into device taints. It shares
discovery and health with the device plugin; a node runs one or the other for its GPUs.
"""
