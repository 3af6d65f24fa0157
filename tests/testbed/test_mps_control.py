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


def test_a_cuda_client_is_given_its_users_server_with_the_defaults_of_then(
    socket_dir: Path,
) -> None:
    """As the man page has it: a client gets the server of its user, started with the
    defaults of that moment and keeping them (a later default is the next server's), each
    server's own limits read and set by pid; a client of another user gets a server of its
    own; `quit` ends the servers with the daemon."""
    program = mps_control.install(socket_dir / "node")
    pipe = socket_dir / "pipe"
    dirs = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(socket_dir / "log")}
    assert control(program, dirs, "", "-d").returncode == 0
    daemon = int((pipe / "nvidia-cuda-mps-control.pid").read_text())
    control(program, dirs, "set_default_active_thread_percentage 25\n")
    first = mps_control.cuda_init(pipe)
    assert mps_control.cuda_init(pipe) == first  # its user's, running
    assert status(first)["PPid"] == [str(daemon)]
    control(program, dirs, "set_default_device_pinned_mem_limit 0 80G\n")
    asked = f"get_server_list\nget_active_thread_percentage {first}\n"
    asked += f"get_device_pinned_mem_limit {first} 0\n"
    assert control(program, dirs, asked).stdout == f"{first}\n25.0\n0\n"
    control(program, dirs, f"set_active_thread_percentage {first} 10\n")
    assert control(program, dirs, asked).stdout == f"{first}\n10.0\n0\n"
    other = mps_control.cuda_init(pipe, uid=1000)
    assert status(other)["Uid"][0] == "1000"
    assert not Path(f"/proc/{first}").exists()  # one server at a time
    asked = f"get_server_list\nget_active_thread_percentage {other}\n"
    asked += f"get_device_pinned_mem_limit {other} 0\nget_active_thread_percentage {first}\n"
    answered = control(program, dirs, asked).stdout
    assert answered == f"{other}\n25.0\n80G\nNo server with pid {first}\n"
    assert control(program, dirs, "quit\n").returncode == 0
    until(lambda: not (pipe / "control").exists())  # the daemon quit, its servers ended first
    assert not Path(f"/proc/{other}").exists()


def status(pid: int) -> dict[str, list[str]]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {key: value.split() for key, _, value in (line.partition(":") for line in lines)}
