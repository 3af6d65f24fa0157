"""gpu-check's MPS check reads the replicas' server back as the node agent reads it every
pass, here from the stand-in daemon (testbed/mps_control.py): what it says on a real GPU,
where the answers are the driver's."""

from __future__ import annotations

import threading
from pathlib import Path
from types import ModuleType

from deviceplugin.agent import mps as daemons
from gpuwire import mps, sim
from testbed import mps_control


def test_the_mps_check_reads_the_server_as_the_agent_does(
    gpu_check: ModuleType, socket_dir: Path
) -> None:
    node = socket_dir / "node"
    sim.write_node(node, sim.make_machine(gpus=1))
    control = str(mps_control.install(node))
    share = mps.Defaults(25, 20480)
    supervisor = daemons.Supervisor(str(socket_dir / "mps"), control, lambda gpu: share)
    uuid = sim.load_machine(node).devices[0].uuid
    supervisor.step(sim.load_machine(node).devices, frozenset())
    running = threading.Event()
    worker = threading.Thread(target=running.wait, args=(60,))  # a replica that runs on
    worker.start()
    try:
        server = mps_control.cuda_init(mps.pipe_dir(supervisor.root, uuid))
        read = f"server {server}: {share} (the daemon's defaults: {share})"
        assert gpu_check.read_servers(control, supervisor.root, uuid, [worker]) == (True, read)
        daemons.send(control, supervisor.root, uuid, [f"set_active_thread_percentage {server} 50"])
        held, read = gpu_check.read_servers(control, supervisor.root, uuid, [worker])
        assert (held, read.startswith(f"server {server}: Defaults(threads=50,")) == (False, True)
    finally:
        running.set()
        worker.join()
        supervisor.close()
    assert gpu_check.read_servers(control, supervisor.root, uuid, [worker]) == (
        False,
        "no MPS server seen while the replicas ran",
    )
