"""The MPS control daemon stand-in speaks the commands gpuwire uses, as the real program takes
them: a daemon per pipe directory, a client that sends stdin's lines, every command logged."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from testbed import mps_control
from testbed.waiting import until


def control(
    program: Path, dirs: dict[str, str], commands: str = "", *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(program), *args],
        input=commands,
        env={"PATH": os.defpath, **dirs},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_a_daemon_answers_its_pipe_directory_and_records_every_command(socket_dir: Path) -> None:
    tmp_path = socket_dir  # the socket's path must stay under 108 bytes
    program = mps_control.install(tmp_path / "node")
    dirs = {
        "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "log"),
    }
    assert control(program, dirs, "", "-d").returncode == 0
    pid = int((tmp_path / "pipe/nvidia-cuda-mps-control.pid").read_text())
    again = control(program, dirs, "", "-d")
    assert again.returncode == 1
    assert again.stderr == "An instance of this daemon is already running\n"
    answered = control(
        program,
        dirs,
        "set_default_active_thread_percentage 25\nset_default_device_pinned_mem_limit 0 20480M\n"
        "get_default_active_thread_percentage\nget_default_device_pinned_mem_limit 0\nbogus\n",
    )
    assert answered.stdout == "25.0\n25.0\n20480M\nUnrecognized command: bogus\n"
    assert control(program, dirs, "quit\n").returncode == 0
    until(lambda: not (tmp_path / "pipe/control").exists())  # the daemon quit
    log = (tmp_path / "log/control.log").read_text().splitlines()
    assert [line.partition("] ")[2] for line in log] == [
        f"Starting control daemon using socket {tmp_path}/pipe/control",
        "CMD: set_default_active_thread_percentage 25",
        "CMD: set_default_device_pinned_mem_limit 0 20480M",
        "CMD: get_default_active_thread_percentage",
        "CMD: get_default_device_pinned_mem_limit 0",
        "CMD: bogus",
        "CMD: quit",
        "Control daemon exited",
    ]
    assert all(f"Control {pid}]" in line for line in log)
    gone = control(program, dirs, "get_server_list\n")
    assert (gone.returncode, gone.stderr) == (1, "Cannot find MPS control daemon process\n")
