"""The node agent's jobs, which run beside either plugin or alone (plugin-less): the node's
labels and `gpuwire.io/gpus` annotation, who holds which GPU (container records and the
kubelet's pod-resources) with its metrics, the MPS control daemons, and the MIG map."""
