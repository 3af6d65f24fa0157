"""gpuwire: GPUs for Kubernetes pods by annotation. This package is the shared contract."""
