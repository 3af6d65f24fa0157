"""Node side on containerd: discovery, container edits, shim, prestart hook, CDI, config."""
