"""Which discovery the plugin runs: the simulated node's, or the real GPUs' through NVML.

Apart from `deviceplugin.gpus.discovery` (the interface both backends implement), so that the
interface imports neither backend and neither backend imports back a module that imports it.
"""

from __future__ import annotations

from deviceplugin.gpus.discovery import Discovery


def open_discovery(sim_root: str | None, vendor: str = "nvidia") -> Discovery:
    """The simulated node under `sim_root`, else the real GPUs through NVML; an AMD node's
    (`vendor` amd) from sysfs, the simulated one's or the host's."""
    if vendor == "amd":
        from deviceplugin.gpus.amd import AmdDiscovery

        return AmdDiscovery(sim_root or "/")
    if sim_root is not None:
        from deviceplugin.gpus.simulated import SimDiscovery

        return SimDiscovery(sim_root)
    from deviceplugin.gpus.nvml import NvmlDiscovery

    return NvmlDiscovery()
