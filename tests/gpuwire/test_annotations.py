"""The annotation grammar: the issue's examples as written, every error, and properties."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuwire import annotations as a
from gpuwire.annotations import AnnotationError, GpuRequest, MemoryLimit, parse

UUID_A = "GPU-8b9f1c2d-0a1b-4c3d-9e8f-0123456789ab"
UUID_B = "GPU-11111111-2222-3333-4444-555555555555"


def problems(annotations: dict[str, str]) -> str:
    with pytest.raises(AnnotationError) as caught:
        parse(annotations)
    return str(caught.value)


def test_the_issue_examples_parse_as_written() -> None:
    assert parse({a.MODEL: "A100,H100"}).models == ("a100", "h100")
    assert parse({a.MODEL: "!T4,!V100"}).excluded_models == ("t4", "v100")
    assert parse({a.MIN_MEMORY: "40Gi"}).min_memory_mib == 40 * 1024
    assert parse({a.COUNT: "all"}).count == "all"
    assert parse({a.COUNT: "2"}).count == 2
    assert parse({a.UUID: f"{UUID_A},{UUID_B}"}).uuids == (UUID_A, UUID_B)
    assert parse({a.CAPABILITIES: "compute,utility,video"}).capabilities == "compute,utility,video"
    assert parse({a.CAPABILITIES: "all"}).capabilities == "all"
    assert parse({a.MEMORY_LIMIT: "20Gi"}).memory_limit == MemoryLimit(mib=20480)
    assert parse({a.MEMORY_LIMIT: "25%"}).memory_limit == MemoryLimit(percent=25)
    assert parse({a.CORES_LIMIT: "30"}).cores_limit == 30
    assert parse({a.LIMIT_PROFILE: "mps"}).profiles == ("mps",)
    assert parse({a.CONTAINERS: "trainer"}).containers == ("trainer",)
    assert parse({a.HAMI_USE_TYPE: "A100"}).models == ("a100",)


def test_models_mix_includes_and_exclusions_case_insensitively() -> None:
    request = parse({a.MODEL: " a100 , !A100-40GB,, H100 SXM "})
    assert request.models == ("a100", "h100-sxm")
    assert request.excluded_models == ("a100-40gb",)


def test_hami_aliases_merge_with_gpuwire_annotations() -> None:
    request = parse(
        {
            a.MODEL: "H100",
            a.HAMI_USE_TYPE: "A100",
            a.HAMI_NOUSE_TYPE: "1080,2080",
            a.HAMI_USE_UUID: UUID_A,
            a.HAMI_NOUSE_UUID: UUID_B,
        }
    )
    assert request.models == ("h100", "a100")
    assert request.excluded_models == ("1080", "2080")
    assert request.uuids == (UUID_A,)
    assert request.excluded_uuids == (UUID_B,)


def test_empty_values_count_as_not_given() -> None:
    request = parse({a.MODEL: " ", a.COUNT: "", a.HAMI_USE_TYPE: ""})
    assert request == GpuRequest()
    assert not request.asks


def test_a_profile_alone_asks_for_no_gpu() -> None:
    assert not parse({a.LIMIT_PROFILE: "hami"}).asks
    assert parse({a.CONTAINERS: "trainer"}).asks
    assert parse({a.HAMI_NOUSE_TYPE: "T4"}).asks


def test_a_partition_profile_is_amds_name_in_any_case() -> None:
    assert parse({a.PARTITION_PROFILE: "CPX_NPS4"}).partition == "cpx_nps4"
    assert parse({a.PARTITION_PROFILE: " spx_nps1 "}).partition == "spx_nps1"


def test_count_none_and_case() -> None:
    assert parse({a.COUNT: "NONE"}).count == "none"
    assert parse({a.COUNT: "All"}).count == "all"


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({a.COUNT: "two"}, "gpuwire.io/gpu-count: 'two' is not a GPU count; accepted: all, none"),
        ({a.COUNT: "0"}, "gpuwire.io/gpu-count: '0' is not a GPU count"),
        ({a.COUNT: "-1"}, "gpuwire.io/gpu-count: '-1' is not a GPU count"),
        ({a.COUNT: "²"}, "gpuwire.io/gpu-count: '²' is not a GPU count"),
        ({a.MODEL: "A100,!"}, "gpuwire.io/gpu-model: 'A100,!' has '!', which is not a model name"),
        ({a.MODEL: "A100;H100"}, "has 'A100;H100', which is not a model name; accepted: comma"),
        ({a.MODEL: "A100,!A100"}, "gpuwire.io/gpu-model: 'A100,!A100' both asks for and excludes"),
        (
            {a.UUID: "GPU-1234"},
            "gpuwire.io/gpu-uuid: 'GPU-1234' has 'GPU-1234', which is not a GPU UUID",
        ),
        ({a.HAMI_USE_UUID: "0"}, "nvidia.com/use-gpuuuid: '0' has '0', which is not a GPU UUID"),
        ({a.UUID: f"{UUID_A},!{UUID_A}"}, "both asks for and excludes"),
        (
            {a.MIN_MEMORY: "40"},
            "gpuwire.io/gpu-min-memory: '40' is not a memory size; accepted: a size",
        ),
        ({a.MIN_MEMORY: "40GB"}, "'40GB' is not a memory size"),
        ({a.MIN_MEMORY: "0Gi"}, "'0Gi' is less than 1 MiB"),
        (
            {a.CAPABILITIES: "compute,cuda"},
            "'compute,cuda' has unknown capability cuda; accepted: all",
        ),
        ({a.MEMORY_LIMIT: "20"}, "'20' is neither a memory size nor a percentage; accepted:"),
        (
            {a.MEMORY_LIMIT: "0%"},
            "gpuwire.io/gpu-memory-limit: '0%' is not a percentage from 1 to 100",
        ),
        ({a.MEMORY_LIMIT: "101%"}, "'101%' is not a percentage from 1 to 100"),
        ({a.MEMORY_LIMIT: "512Ki"}, "'512Ki' is less than 1 MiB"),
        ({a.CORES_LIMIT: "0"}, "gpuwire.io/gpu-cores-limit: '0' is not a percentage from 1 to 100"),
        ({a.CORES_LIMIT: "150%"}, "'150%' is not a percentage"),
        ({a.CORES_LIMIT: "half"}, "'half' is not a percentage"),
        (
            {a.LIMIT_PROFILE: "hami,vcuda"},
            "'hami,vcuda' names unknown profile vcuda; accepted: comma",
        ),
        (
            {a.CONTAINERS: "Trainer"},
            "gpuwire.io/containers: 'Trainer' has Trainer, not a container name",
        ),
        (
            {a.UUID: f"{UUID_A},{UUID_B}", a.COUNT: "3"},
            "gpuwire.io/gpu-count: '3' disagrees with the 2 GPU(s) named by gpuwire.io/gpu-uuid",
        ),
        ({a.UUID: UUID_A, a.COUNT: "all"}, "gpuwire.io/gpu-count: 'all' disagrees with the 1 GPU"),
        (
            {a.PARTITION_PROFILE: "cpx"},
            "gpuwire.io/partition-profile: 'cpx' is not a partition profile; accepted: an AMD",
        ),
        ({a.PARTITION_PROFILE: "xpx_nps1"}, "'xpx_nps1' is not a partition profile"),
        (
            {a.PARTITION_PROFILE: "cpx_nps4", a.MIG_PROFILE: "1g.10gb"},
            "gpuwire.io/partition-profile: 'cpx_nps4' cannot go with gpuwire.io/mig-profile",
        ),
    ],
)
def test_every_error_names_the_annotation_the_value_and_what_is_accepted(
    annotations: dict[str, str], expected: str
) -> None:
    message = problems(annotations)
    assert expected in message
    assert "accepted:" in message


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(AnnotationError) as caught:
        parse({a.COUNT: "two", a.MEMORY_LIMIT: "20", a.MODEL: "A100"})
    assert [p.annotation for p in caught.value.problems] == [a.COUNT, a.MEMORY_LIMIT]


def test_the_grammar_is_standard_library_only() -> None:
    """It is contract: the node side may import it on the container-start path."""
    code = (
        "import sys, gpuwire.annotations, gpuwire.limits, gpuwire.quantity;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('webhook', 'yaml', 'starlette', 'kubernetes', 'jsonpatch', 'prometheus_client')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_unknown_gpuwire_annotations_are_reported_others_ignored() -> None:
    found = a.unknown({"gpuwire.io/gpu-modle": "A100", a.MODEL: "A100", "example.com/x": "1"})
    assert found == (a.Unknown("gpuwire.io/gpu-modle", a.MODEL),)


@pytest.mark.parametrize(
    ("key", "meant"),
    [
        ("gpuwire.io/GPU-Model", a.MODEL),  # a case variant
        ("GPUWIRE.IO/gpu-count", a.COUNT),
        ("gpuwire.io/gpu-modle", a.MODEL),  # a letter off
        ("gpuwire.io/memory-limit", a.MEMORY_LIMIT),
        ("gpuwire.com/gpu-count", a.COUNT),  # another prefix
        ("gpuwire/gpu-uuid", a.UUID),
        ("nvidia.com/use-gpu-type", a.HAMI_USE_TYPE),  # HAMi's, near
        ("nvidia.com/use-gpuuid", a.HAMI_USE_UUID),
        ("nvidia.com/nouse-gputypes", a.HAMI_NOUSE_TYPE),
        ("nvidia.com/gpumem", a.MEMORY_LIMIT),  # a resource, as an annotation
        ("gpuwire.io/frobnicate", None),  # gpuwire's, near nothing
    ],
)
def test_near_misses_say_what_was_meant(key: str, meant: str | None) -> None:
    (found,) = a.unknown({key: "x"})
    assert (found.key, found.suggestion, found.typo) == (key, meant, True)


def test_hami_keys_gpuwire_does_not_read_are_named_not_typos() -> None:
    (found,) = a.unknown({"nvidia.com/numa-bind": "true"})
    assert not found.typo
    assert str(found) == (
        "nvidia.com/numa-bind is HAMi's NUMA binding of a container's GPUs, which gpuwire "
        "does not read"
    )


def test_keys_of_others_are_left_alone() -> None:
    others = [
        "nvidia.com/gpu.product",
        "nvidia.com/mig.config",
        "prometheus.io/scrape",
        "kubectl.kubernetes.io/last-applied-configuration",
        "hami.io/vgpu-node",
        "app",
    ]
    assert a.unknown(dict.fromkeys(others, "x")) == ()


def test_memory_limit_resolves_against_the_gpu() -> None:
    assert MemoryLimit(percent=25).resolve(81920) == (20480, 0.25)
    assert MemoryLimit(percent=25).resolve(None) == (None, 0.25)
    assert MemoryLimit(mib=20480).resolve(40960) == (20480, 0.5)
    assert MemoryLimit(mib=20480).resolve(None) == (20480, None)
    assert MemoryLimit(mib=99999).resolve(40960) == (99999, 1.0)
    assert MemoryLimit().resolve(40960) == (None, None)


# --- properties

model_word = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,12}", fullmatch=True)


@given(
    st.lists(st.tuples(st.booleans(), model_word), min_size=1, max_size=6),
    st.sampled_from(["", " ", "  "]),
)
def test_model_lists_parse_to_their_normalised_words(
    items: list[tuple[bool, str]], pad: str
) -> None:
    included = {a.normalise_model(w) for neg, w in items if not neg}  # `_` as a space
    excluded = {a.normalise_model(w) for neg, w in items if neg}
    text = ",".join(f"{pad}{'!' if neg else ''}{w}{pad}" for neg, w in items)
    if included & excluded:
        assert "both asks for and excludes" in problems({a.MODEL: text})
        return
    request = parse({a.MODEL: text})
    assert set(request.models) == included
    assert set(request.excluded_models) == excluded


@given(st.integers(min_value=1, max_value=10**6))
def test_any_positive_count_parses(n: int) -> None:
    assert parse({a.COUNT: str(n)}).count == n


@given(st.dictionaries(st.sampled_from(a.KNOWN), st.text(max_size=40), max_size=6))
def test_any_values_either_parse_or_fail_with_every_bad_annotation_named(
    annotations: dict[str, str],
) -> None:
    valid = True
    try:
        request = parse(annotations)
    except AnnotationError as exc:
        valid, problems, message = False, exc.problems, str(exc)
    if valid:
        assert set(request.given) == {k for k, v in annotations.items() if v.strip()}
        return
    assert problems
    for problem in problems:
        assert problem.annotation in annotations
        assert repr(annotations[problem.annotation]) in message
