"""Real KFD topology captures, for replaying AMD discovery against what real GPUs reported.

The files are those ROCm checks into its profiler's tests as captures of real machines
(ROCm/rocm-systems, `projects/rocprofiler-sdk/source/lib/rocprofiler-sdk/tests/data/topology/
nodes/*`; ROCm/rocm-systems pull request 10274 calls them "the checked-in MI350X KFD
captures"), byte for byte, grouped by the machine each came from (their own `node_from` and
bus numbers say which): a workstation with a CPU and three Radeons that reach each other only
through it, one MI300X of an eight-GPU XGMI hive (its seven hive peers were not captured), an
MI350X and a Radeon RX 9070. The capture zeroed `drm_render_minor` and left out `gpu_id`
files and DRM. `IDS` are libdrm's `data/amdgpu.ids` lines for these device ids
(gitlab.freedesktop.org/mesa/drm), the table a node would name them with.
"""

from __future__ import annotations

TOPOLOGY = "sys/class/kfd/kfd/topology/nodes"


def _link(
    kind: int, node_from: int, node_to: int, weight: int, band: str, mask: int, flags: int
) -> str:
    low, high = band.split("/")
    return (
        f"type {kind}\nversion_major 0\nversion_minor 0\nnode_from {node_from}\nnode_to {node_to}\n"
        f"weight {weight}\nmin_latency 0\nmax_latency 0\nmin_bandwidth {low}\n"
        f"max_bandwidth {high}\nrecommended_transfer_size 0\n"
        f"recommended_sdma_engine_id_mask {mask}\nflags {flags}\n"
    )


def _bank(size: int, width: int, clock: int) -> str:
    return f"heap_type 1\nsize_in_bytes {size}\nflags 0\nwidth {width}\nmem_clk_max {clock}\n"


WORKSTATION = {
    "0/properties": """cpu_cores_count 24
simd_count 0
mem_banks_count 1
caches_count 0
io_links_count 3
p2p_links_count 0
cpu_core_id_base 0
simd_id_base 0
max_waves_per_simd 0
lds_size_in_kb 0
gds_size_in_kb 0
num_gws 0
wave_front_size 0
array_count 0
simd_arrays_per_engine 0
cu_per_simd_array 0
simd_per_cu 0
max_slots_scratch_cu 0
gfx_target_version 0
vendor_id 0
device_id 0
location_id 0
domain 0
drm_render_minor 0
hive_id 0
num_sdma_engines 0
num_sdma_xgmi_engines 0
num_sdma_queues_per_engine 0
num_cp_queues 0
max_engine_clk_ccompute 4000
""",
    "0/io_links/0/properties": _link(2, 0, 1, 20, "0/32000", 3, 3),
    "0/io_links/1/properties": _link(2, 0, 2, 20, "0/32000", 3, 3),
    "0/io_links/2/properties": _link(2, 0, 3, 20, "0/32000", 3, 3),
    "1/name": "vega20\n",
    "1/properties": """cpu_cores_count 0
simd_count 240
mem_banks_count 1
caches_count 0
io_links_count 1
p2p_links_count 2
cpu_core_id_base 0
simd_id_base 2147487744
max_waves_per_simd 10
lds_size_in_kb 64
gds_size_in_kb 0
num_gws 64
wave_front_size 64
array_count 4
simd_arrays_per_engine 1
cu_per_simd_array 16
simd_per_cu 4
max_slots_scratch_cu 32
gfx_target_version 90006
vendor_id 4098
device_id 26287
location_id 25344
domain 0
drm_render_minor 0
hive_id 0
num_sdma_engines 2
num_sdma_xgmi_engines 0
num_sdma_queues_per_engine 8
num_cp_queues 24
max_engine_clk_fcompute 1801
local_mem_size 0
fw_version 472
capability 2892210816
capability2 0
debug_prop 1494
sdma_fw_version 145
unique_id 985321441578344217
num_xcc 1
max_engine_clk_ccompute 4000
""",
    "1/mem_banks/0/properties": _bank(17163091968, 4096, 1000),
    "1/io_links/0/properties": _link(2, 1, 0, 20, "0/32000", 3, 1),
    "1/p2p_links/0/properties": _link(2, 1, 2, 40, "0/32000", 0, 3),
    "1/p2p_links/1/properties": _link(2, 1, 3, 40, "0/32000", 0, 3),
    "2/properties": """cpu_cores_count 0
simd_count 56
mem_banks_count 1
caches_count 0
io_links_count 1
p2p_links_count 2
cpu_core_id_base 0
simd_id_base 2147487808
max_waves_per_simd 16
lds_size_in_kb 64
gds_size_in_kb 0
num_gws 64
wave_front_size 32
array_count 4
simd_arrays_per_engine 2
cu_per_simd_array 8
simd_per_cu 2
max_slots_scratch_cu 32
gfx_target_version 110002
vendor_id 4098
device_id 29833
location_id 26112
domain 0
drm_render_minor 0
hive_id 0
num_sdma_engines 2
num_sdma_xgmi_engines 0
num_sdma_queues_per_engine 6
num_cp_queues 8
max_engine_clk_fcompute 810
local_mem_size 0
fw_version 2590
capability 671326848
capability2 0
debug_prop 1495
sdma_fw_version 21
unique_id 0
num_xcc 1
max_engine_clk_ccompute 4000
""",
    "2/mem_banks/0/properties": _bank(8573157376, 128, 674),
    "2/io_links/0/properties": _link(2, 2, 0, 20, "0/32000", 3, 1),
    "2/p2p_links/0/properties": _link(2, 2, 1, 40, "0/32000", 3, 3),
    "2/p2p_links/1/properties": _link(2, 2, 3, 40, "0/32000", 0, 3),
    "3/name": "dimgrey_cavefish\n",
    "3/properties": """cpu_cores_count 0
simd_count 64
mem_banks_count 1
caches_count 0
io_links_count 1
p2p_links_count 2
cpu_core_id_base 0
simd_id_base 2147487840
max_waves_per_simd 16
lds_size_in_kb 64
gds_size_in_kb 0
num_gws 64
wave_front_size 32
array_count 4
simd_arrays_per_engine 2
cu_per_simd_array 8
simd_per_cu 2
max_slots_scratch_cu 32
gfx_target_version 100302
vendor_id 4098
device_id 29679
location_id 17152
domain 0
drm_render_minor 0
hive_id 0
num_sdma_engines 2
num_sdma_xgmi_engines 0
num_sdma_queues_per_engine 8
num_cp_queues 8
max_engine_clk_fcompute 2765
local_mem_size 0
fw_version 122
capability 671326848
capability2 0
debug_prop 1495
sdma_fw_version 76
unique_id 0
num_xcc 1
max_engine_clk_ccompute 4000
""",
    "3/mem_banks/0/properties": _bank(8573157376, 128, 1094),
    "3/io_links/0/properties": _link(2, 3, 0, 20, "0/32000", 3, 1),
    "3/p2p_links/0/properties": _link(2, 3, 1, 40, "0/32000", 3, 3),
    "3/p2p_links/1/properties": _link(2, 3, 2, 40, "0/32000", 3, 3),
}

MI300X = {
    "4/properties": """cpu_cores_count 0
simd_count 1216
mem_banks_count 1
caches_count 0
io_links_count 8
p2p_links_count 1
cpu_core_id_base 0
simd_id_base 2147487784
max_waves_per_simd 8
lds_size_in_kb 64
gds_size_in_kb 0
num_gws 64
wave_front_size 64
array_count 32
simd_arrays_per_engine 1
cu_per_simd_array 10
simd_per_cu 4
max_slots_scratch_cu 32
gfx_target_version 90402
vendor_id 4098
device_id 29857
location_id 9728
domain 0
drm_render_minor 0
hive_id 7773567030725891371
num_sdma_engines 2
num_sdma_xgmi_engines 14
num_sdma_queues_per_engine 8
num_cp_queues 24
cwsr_size 23203840
ctl_stack_size 12288
max_engine_clk_fcompute 2100
local_mem_size 0
fw_version 192
capability 2893521536
capability2 1
debug_prop 1511
sdma_fw_version 25
unique_id 5593906200782126851
num_xcc 8
max_engine_clk_ccompute 2400
""",
    "4/mem_banks/0/properties": _bank(206141652992, 8192, 1300),
    **{
        f"4/io_links/{i}/properties": _link(11, 3, peer, 15, "64000/64000", mask, 1)
        for i, peer, mask in (
            (1, 2, 16384),
            (2, 4, 4096),
            (3, 5, 4),
            (4, 6, 256),
            (5, 7, 16),
            (6, 8, 1024),
            (7, 9, 64),
        )
    },
}

MI350X = {
    "5/properties": """cpu_cores_count 0
simd_count 1024
mem_banks_count 1
caches_count 0
io_links_count 1
p2p_links_count 0
cpu_core_id_base 0
simd_id_base 2147487744
max_waves_per_simd 8
lds_size_in_kb 160
gds_size_in_kb 0
num_gws 64
wave_front_size 64
array_count 32
simd_arrays_per_engine 1
cu_per_simd_array 9
simd_per_cu 4
max_slots_scratch_cu 32
gfx_target_version 90500
vendor_id 4098
device_id 30112
location_id 33536
domain 0
drm_render_minor 0
hive_id 0
num_sdma_engines 2
num_sdma_xgmi_engines 14
num_sdma_queues_per_engine 8
num_cp_queues 24
cwsr_size 22687744
ctl_stack_size 12288
max_engine_clk_fcompute 2200
local_mem_size 0
fw_version 36
capability 2889327232
capability2 1
debug_prop 1494
sdma_fw_version 12
unique_id 5176797314141101417
num_xcc 8
max_engine_clk_ccompute 2450
""",
    "5/mem_banks/0/properties": _bank(309220868096, 8192, 1900),
}

RX9070 = {
    "6/properties": """cpu_cores_count 0
simd_count 128
mem_banks_count 1
caches_count 0
io_links_count 1
p2p_links_count 0
cpu_core_id_base 0
simd_id_base 2147487744
max_waves_per_simd 16
lds_size_in_kb 64
gds_size_in_kb 0
num_gws 64
wave_front_size 32
array_count 8
simd_arrays_per_engine 2
cu_per_simd_array 8
simd_per_cu 2
max_slots_scratch_cu 32
gfx_target_version 120001
vendor_id 4098
device_id 30032
location_id 33536
domain 0
drm_render_minor 0
hive_id 0
num_sdma_engines 2
num_sdma_xgmi_engines 0
num_sdma_queues_per_engine 6
num_cp_queues 4
cwsr_size 30699520
ctl_stack_size 28672
max_engine_clk_fcompute 2400
local_mem_size 0
fw_version 3250
capability 1745068672
capability2 0
debug_prop 1495
sdma_fw_version 36502
unique_id 2903314361593472692
num_xcc 1
max_engine_clk_ccompute 4500
""",
    "6/mem_banks/0/properties": _bank(17095983104, 256, 1258),
}

CAPTURES = {"workstation": WORKSTATION, "mi300x": MI300X, "mi350x": MI350X, "rx9070": RX9070}

IDS = """1.0.0
66AF,\tC1,\tAMD Radeon VII
73EF,\tC0,\tAMD Radeon RX 6800S
73EF,\tC1,\tAMD Radeon RX 6650 XT
73EF,\tC2,\tAMD Radeon RX 6700S
73EF,\tC3,\tAMD Radeon RX 6650M
73EF,\tC4,\tAMD Radeon RX 6650M XT
7489,\t00,\tAMD Radeon Pro W7500
74A1,\t00,\tAMD Instinct MI300X
7550,\tC0,\tAMD Radeon RX 9070 XT
7550,\tC2,\tAMD Radeon RX 9070 GRE
7550,\tC3,\tAMD Radeon RX 9070
75A0,\t00,\tAMD Instinct MI350X
"""
