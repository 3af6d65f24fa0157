"""`NVIDIA_REQUIRE_*` checked as libnvidia-container checks them (src/cli/dsl.c, configure.c),
the variables read as NVIDIA's toolkit reads them (internal/config/image/cuda_image.go)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwire import requirements, sim
from gpuwire.requirements import Facts, RequirementError, check, compare_versions

MACHINE = sim.make_machine(gpus=2, products=("NVIDIA A100-SXM4-80GB", "Tesla T4"))
A100, T4 = MACHINE.devices
FACTS = Facts("550.54.15", "12.4", ((A100.uuid, "8.0", "Nvidia"), (T4.uuid, "7.5", "Tesla")))


def fails(env: dict[str, str], devices: tuple[object, ...] = (A100,)) -> str:
    with pytest.raises(RequirementError) as caught:
        check(env, "550.54.15", FACTS, devices)  # type: ignore[arg-type]
    return str(caught.value)


@pytest.mark.parametrize(
    ("have", "op", "want", "holds"),
    [
        ("12.4", ">=", "12.4", True),
        ("12.4", ">=", "12.4.0", True),  # trailing zeros do not count
        ("12.4", "<", "12.4.1", True),
        ("12.10", ">", "12.9", True),  # numbers, not text
        ("550.54.15", "=", "550.54.15", True),
        ("550.54.15", "!=", "550.54", True),
        ("12.4", "<=", "12.3", False),
    ],
)
def test_versions_compare_number_by_number(have: str, op: str, want: str, holds: bool) -> None:
    assert compare_versions(have, op, want) is holds


def test_space_separated_alternatives_and_comma_separated_terms() -> None:
    # as a CUDA 12.4 image carries it: the new driver, or an old one with compatibility
    image = "cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=nvidia,driver>=535,driver<536"
    assert check({"NVIDIA_REQUIRE_CUDA": image}, "550.54.15", FACTS, (A100,)) == []
    old = Facts("470.1", "11.4", FACTS.gpus)
    assert check({"NVIDIA_REQUIRE_CUDA": image}, "470.1", old, (T4,)) == []  # a Tesla on 470
    with pytest.raises(RequirementError) as caught:
        check({"NVIDIA_REQUIRE_CUDA": image}, "470.1", old, (A100,))  # not a Tesla
    assert str(caught.value) == (
        "NVIDIA_REQUIRE_CUDA: unsatisfied condition: cuda>=12.4, please update your driver to "
        "a newer version, or use an earlier cuda container (this node: driver 470.1, CUDA 11.4)"
    )


def test_arch_and_brand_are_checked_for_every_gpu_the_container_gets() -> None:
    env = {"NVIDIA_REQUIRE_ARCH": "arch>=8.0", "NVIDIA_REQUIRE_BRAND": "brand!=GEFORCE"}
    assert check(env, "550.54.15", FACTS, (A100,)) == []
    message = fails(env, (A100, T4))
    assert message == (
        "NVIDIA_REQUIRE_ARCH: unsatisfied condition: arch>=8.0 (this node: driver 550.54.15, "
        "CUDA 12.4)"
    )
    assert (
        check({"NVIDIA_REQUIRE_X": "arch>=9.0,brand=tesla"}, "550.54.15", FACTS, ()) == []
    )  # no GPU


def test_several_variables_must_all_hold_and_jetpack_is_not_one() -> None:
    env = {"NVIDIA_REQUIRE_CUDA": "cuda>=12.0", "NVIDIA_REQUIRE_DRIVER": "driver>=560"}
    assert fails(env).startswith("NVIDIA_REQUIRE_DRIVER: unsatisfied condition: driver>=560 (")
    assert check({"NVIDIA_REQUIRE_JETPACK": "csv-mounts=all"}, "550.54.15", FACTS, (A100,)) == []


@pytest.mark.parametrize(
    ("value", "off"), [("1", True), ("true", True), ("T", True), ("yes", False), ("0", False)]
)
def test_disable_require_is_read_as_go_reads_a_bool(value: str, off: bool) -> None:
    env = {"NVIDIA_REQUIRE_CUDA": "cuda>=13.0", "NVIDIA_DISABLE_REQUIRE": value}
    if off:
        assert check(env, "550.54.15", FACTS, (A100,)) == []
    else:
        assert "cuda>=13.0" in fails(env)


def test_a_legacy_image_requires_its_cuda_version() -> None:
    legacy = {"CUDA_VERSION": "12.6.1"}
    assert requirements.requirements(legacy) == [("CUDA_VERSION", "cuda>=12.6")]
    assert fails(legacy).startswith(
        "CUDA_VERSION: unsatisfied condition: cuda>=12.6, please update"
    )
    assert requirements.requirements(
        {"CUDA_VERSION": "12.6", "NVIDIA_REQUIRE_CUDA": "cuda>=12.0"}
    ) == [("NVIDIA_REQUIRE_CUDA", "cuda>=12.0")]
    assert requirements.is_legacy(legacy)
    assert not requirements.is_legacy({"CUDA_VERSION": ""})


def test_what_this_node_does_not_know_is_not_checked_and_said() -> None:
    env = {"NVIDIA_REQUIRE_CUDA": "cuda>=99.0", "NVIDIA_REQUIRE_ARCH": "arch>=8.0"}
    assert check(env, "550.54.15", None, (A100,)) == [
        "NVIDIA_REQUIRE_ARCH (arch unknown here)",
        "NVIDIA_REQUIRE_CUDA (cuda unknown here)",
    ]
    with pytest.raises(RequirementError, match="driver>=600"):  # procfs says the driver
        check({"NVIDIA_REQUIRE_DRIVER": "driver>=600"}, "550.54.15", None, (A100,))


@pytest.mark.parametrize("requirement", ["cuda>>12", "gpu>=1", "brand>tesla", "cuda>=12.x", "cuda"])
def test_an_invalid_requirement_fails_naming_it_and_what_is_accepted(requirement: str) -> None:
    message = fails({"NVIDIA_REQUIRE_CUDA": requirement})
    assert message.startswith(f"NVIDIA_REQUIRE_CUDA={requirement!r}: invalid expression: ")
    assert "accepted: terms <key><operator><value> with keys cuda, driver, arch, brand" in message


def test_facts_are_read_only_for_the_driver_they_are_of(tmp_path: Path) -> None:
    path = str(tmp_path / "facts/driver.json")
    requirements.write_facts(path, FACTS)
    assert requirements.read_facts(path, "550.54.15") == FACTS
    assert requirements.read_facts(path, "560.28.03") is None  # upgraded since: stale
    assert requirements.read_facts(str(tmp_path / "none.json"), "550.54.15") is None
