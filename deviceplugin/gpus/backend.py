"""Which NVIDIA discovery the plugin runs: the simulated node's, or the real GPUs' through NVML
(an AMD node's is `gpus.amd`'s; `deviceplugin.vendors` picks the vendor).

Apart from `deviceplugin.gpus.discovery` (the interface both backends implement), so that the
interface imports neither backend and neither backend imports back a module that imports it.
"""

from __future__ import annotations

from deviceplugin.gpus.discovery import Discovery


def open_discovery(sim_root: str | None) -> Discovery:
    """The simulated node under `sim_root`, else the real GPUs through NVML."""
    if sim_root is not None:
        from deviceplugin.gpus.simulated import SimDiscovery

        return SimDiscovery(sim_root)
    from deviceplugin.gpus.nvml import NvmlDiscovery

    return NvmlDiscovery()
