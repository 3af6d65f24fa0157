"""The kubelet device plugin (v1beta1, `gpuwire device-plugin serve`): what a node advertises,
the Allocate answer and the preferred allocation, one endpoint per resource registered with
the kubelet and kept so across its restarts, and the sweep of unused allocation tokens."""
