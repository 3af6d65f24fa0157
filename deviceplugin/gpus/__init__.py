"""The node's GPUs as every role sees them: discovery (NVML or the simulated node, behind one
interface), following MIG changes, and health (XID events, recovery) with its shared state."""
