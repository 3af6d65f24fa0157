"""Limit profiles write each runtime's own syntax; memory sizes parse as Kubernetes writes them."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuwire import limits, quantity
from gpuwire.limits import LimitError, Limits, render


def test_hami_writes_mib_with_m_suffix_and_forces_the_core_limit() -> None:
    env = render("hami", Limits(memory_mib=20480, cores_percent=30), {})
    assert env == {
        "CUDA_DEVICE_MEMORY_LIMIT": "20480m",
        "CUDA_DEVICE_SM_LIMIT": "30",
        "GPU_CORE_UTILIZATION_POLICY": "force",
    }


def test_hami_escapes_are_the_variables_that_lift_its_limits() -> None:
    names = [
        "CUDA_DEVICE_MEMORY_LIMIT_0",
        "CUDA_DEVICE_MEMORY_LIMIT",
        "CUDA_DEVICE_SM_LIMIT_3",
        "CUDA_DEVICE_MEMORY_LIMIT_X",
        "CUDA_DISABLE_CONTROL",
        "XCUDA_DISABLE_CONTROL",
    ]
    assert limits.PROFILES["hami"].escaping(names) == [
        "CUDA_DEVICE_MEMORY_LIMIT_0",
        "CUDA_DEVICE_SM_LIMIT_3",
        "CUDA_DISABLE_CONTROL",
    ]
    assert limits.PROFILES["mps"].escaping(names) == []


def test_mps_limits_its_one_device() -> None:
    env = render("mps", Limits(memory_mib=10240, cores_percent=50, devices=1), {})
    assert env == {
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=10240M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
    }


@pytest.mark.parametrize(("devices", "seen"), [(2, "2"), (None, "an unknown number of")])
def test_mps_needs_exactly_one_gpu(devices: int | None, seen: str) -> None:
    with pytest.raises(LimitError, match=f"this container sees {seen} GPUs; give it one GPU"):
        render("mps", Limits(cores_percent=20, devices=devices), {})


def test_enforcing_profiles_need_mib_and_framework_ones_a_fraction() -> None:
    share_only = Limits(memory_fraction=0.25)
    size_only = Limits(memory_mib=20480)
    with pytest.raises(LimitError, match="needs the memory limit in MiB"):
        render("hami", share_only, {})
    with pytest.raises(LimitError, match="as a share of the GPU"):
        render("jax", size_only, {})


def test_jax_writes_both_spellings_of_the_fraction() -> None:
    env = render("jax", Limits(memory_fraction=0.2511), {})
    assert env == {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.251", "XLA_CLIENT_MEM_FRACTION": "0.251"}


def test_pytorch_merges_into_the_users_allocator_options() -> None:
    mine = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True, per_process_memory_fraction:0.9"}
    env = render("pytorch", Limits(memory_fraction=0.5), mine)
    assert env == {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,per_process_memory_fraction:0.5"
    }
    again = render("pytorch", Limits(memory_fraction=0.5), env)
    assert again == env


def test_tensorflow_only_stops_taking_the_whole_gpu() -> None:
    assert render("tensorflow", Limits(memory_mib=1), {}) == {"TF_FORCE_GPU_ALLOW_GROWTH": "true"}
    assert render("tensorflow", Limits(cores_percent=10), {}) == {}


def test_no_limits_no_env() -> None:
    for name in limits.PROFILES:
        assert render(name, Limits(), {}) == {}, name


def test_only_hami_and_mps_enforce() -> None:
    assert {n for n, p in limits.PROFILES.items() if p.enforced} == {"hami", "mps"}


@pytest.mark.parametrize(
    ("text", "at_least", "at_most"),
    [
        ("40Gi", 40960, 40960),
        ("80G", 76294, 76293),
        ("1.5Gi", 1536, 1536),
        ("512Mi", 512, 512),
        ("1Ti", 1 << 20, 1 << 20),
        ("1500k", 2, 1),
        ("0.5Mi", 1, 0),
        ("2.25Gi", 2304, 2304),
    ],
)
def test_sizes_round_towards_what_is_safe(text: str, at_least: int, at_most: int) -> None:
    assert quantity.mib_at_least(text) == at_least
    assert quantity.mib_at_most(text) == at_most


@pytest.mark.parametrize("text", ["40", "40GB", "Gi", "-1Gi", "1e3Mi", "40 Gi"])
def test_sizes_need_a_number_and_a_unit(text: str) -> None:
    with pytest.raises(quantity.QuantityError, match="accepted: a size with a unit"):
        quantity.mib_at_least(text)


@given(st.integers(min_value=0, max_value=10**9), st.sampled_from(sorted(quantity.UNITS)))
def test_rounding_brackets_the_exact_size(n: int, unit: str) -> None:
    exact = Fraction(n * quantity.UNITS[unit], quantity.MIB)
    low, high = quantity.mib_at_most(f"{n}{unit}"), quantity.mib_at_least(f"{n}{unit}")
    assert low <= exact <= high
    assert high - low <= 1
