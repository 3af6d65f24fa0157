"""What tests, benchmarks, `make demo` and `scripts/gpu-check` run the product against: the
simulated node's real tools (runc, containerd, podman, busybox) and the stand-ins for what
cannot run here (kube-apiserver, the kubelet's device manager, DRA manager, runtime manager
and pod-resources API, the kube-scheduler's DRA allocation and the resourceclaim controller,
NVML, `nvidia-cuda-mps-control`), each at its wire protocol.

The stand-ins are built on the product's own packages and dependencies (grpc and protobuf
for the kubelet's APIs and CRI, `kubernetes`, `orjson` and `jsonpatch` for the API server,
`pyyaml` for manifests, `pynvml`'s interface for NVML) and on the test tools
`kubernetes-validate` and `cel-python` (DRA's CEL selectors); nothing here is on a
production path, and no product package imports it (docs/architecture.md, "Layers").
"""
