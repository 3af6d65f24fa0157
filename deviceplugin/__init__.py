"""The node side that talks to the kubelet and the API server: what a GPU node runs beside its
runtime, in rooms by role.

- `gpus/`: the node's GPUs as every role sees them: discovered (NVML or the simulated node),
  followed as MIG devices come and go, and their health.
- `plugin/`: the kubelet device plugin (v1beta1): resources, Allocate and the preferred
  allocation, the endpoints and their registration, the token sweep.
- `dra/`: the DRA plugin (`gpuwire dra serve`): ResourceSlices, claims prepared as CDI specs,
  health as device taints.
- `agent/`: the node agent's jobs: labels and the `gpuwire.io/gpus` annotation, who holds
  which GPU (records, pod-resources) and its metrics, the MPS control daemons, the MIG map.
- `config.py` (the plugin config every role reads), `cli.py` (the commands), `sockets.py` and
  `inotify.py` (what both plugins need of the kubelet's directories), `api/` (the stubs).
"""
