"""Who holds which GPU, from the kubelet's device IDs and the runtime side's records, and the
conflicts that makes: pure functions, judged the same way on the node and in the CLI."""

from __future__ import annotations

import pytest

from gpuwire import holders, sim
from gpuwire.holders import (
    ALL_BESIDE_PLUGIN,
    GPU_AND_MIG,
    SHARED_GPU,
    Assignment,
    Holder,
    HoldersError,
    NodeHolders,
)
from gpuwire.records import DRA, PLUGIN, PLUGIN_LESS, ContainerRecord

GPUS = sim.make_machine(gpus=4).devices
U = [d.uuid for d in GPUS]
RESOURCE = "nvidia.com/gpu"


def rec(
    container: str,
    gpus: list[int],
    *,
    pod: str = "",
    namespace: str = "team-a",
    path: str = PLUGIN_LESS,
    whole_node: bool = False,
    capabilities: tuple[str, ...] = ("compute", "utility"),
    claims: tuple[str, ...] = (),
    shares: tuple[int, ...] = (),
) -> ContainerRecord:
    return ContainerRecord(
        f"id-{container}",
        namespace if pod else "",
        pod,
        "uid",
        container if pod else "",
        tuple(sorted(U[i] for i in gpus)),
        path,
        whole_node,
        capabilities,
        pid=1,
        start=1,
        claims=claims,
        shares=tuple(U[i] for i in shares),
    )


def assigned(pod: str, container: str, ids: list[str], resource: str = RESOURCE) -> Assignment:
    return Assignment("team-a", pod, container, resource, tuple(ids))


def names(node: NodeHolders) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(h.name, h.path, h.gpus) for h in node.holders]


def test_plugin_allocations_and_plugin_less_records_make_one_list() -> None:
    node = holders.node_holders(
        GPUS,
        [rec("agent", [2, 3], pod="daemon-x")],
        [assigned("trainer", "main", [U[0], U[1]]), assigned("idle", "sidecar", [])],
        [(RESOURCE, tuple(U))],
    )
    assert names(node) == [
        ("team-a/daemon-x", PLUGIN_LESS, (U[2], U[3])),
        ("team-a/trainer", PLUGIN, (U[0], U[1])),
    ]
    assert node.plugin is True
    assert node.shared == ()
    assert holders.conflicts(node) == []


def test_a_container_in_both_sources_is_one_holder() -> None:
    """A plugin pod is in pod-resources and, once the runtime side started it, in a record."""
    node = holders.node_holders(
        GPUS,
        [rec("main", [0], pod="trainer", path=PLUGIN)],
        [assigned("trainer", "main", [U[0]])],
        [],
    )
    assert names(node) == [("team-a/trainer", PLUGIN, (U[0],))]
    assert holders.conflicts(node) == []


def test_watch_only_containers_hold_nothing() -> None:
    """The device plugin and monitoring agents get `utility` on every GPU: not a holding."""
    node = holders.node_holders(
        GPUS, [rec("dp", [0, 1, 2, 3], pod="plugin", capabilities=("utility",))], [], []
    )
    assert node.holders == ()


def test_a_record_without_driver_capabilities_holds_its_gpus() -> None:
    """AMD's containers have no driver capabilities: a daemonset-style pod granted every GPU
    of an AMD node holds them all (it was published as holding nothing)."""
    record = rec("monitor", [0, 1, 2, 3], pod="rocm-monitor", whole_node=True, capabilities=())
    node = holders.node_holders(GPUS, [record], [], [])
    assert names(node) == [("team-a/rocm-monitor", PLUGIN_LESS, tuple(sorted(U)))]


def test_device_ids_map_to_gpus_by_uuid_replica_or_index() -> None:
    node = holders.node_holders(
        GPUS,
        [],
        [
            assigned("a", "c", [f"{U[0]}::3"]),  # time-slicing replica
            assigned("b", "c", ["2"]),  # NVIDIA's deviceIDStrategy=index
            assigned("c", "c", ["2"], resource="example.com/nic"),  # not a GPU resource
            assigned("d", "c", ["MIG-1234", "GPU-unknown"]),  # not a GPU of this node
        ],
        [],
    )
    assert names(node) == [("team-a/a", PLUGIN, (U[0],)), ("team-a/b", PLUGIN, (U[2],))]


def test_two_holders_of_an_unshared_gpu_conflict() -> None:
    node = holders.node_holders(
        GPUS,
        [rec("x", [1], pod="squatter")],
        [assigned("trainer", "main", [U[0], U[1]])],
        [(RESOURCE, tuple(U))],
    )
    [conflict] = holders.conflicts(node)
    assert conflict.kind == SHARED_GPU
    assert conflict.gpus == (U[1],)
    assert conflict.holders == ("team-a/squatter", "team-a/trainer")
    assert conflict.explain({U[1]: "GPU 1"}) == (
        "GPU 1 held by team-a/squatter and team-a/trainer, and not shared"
    )


def test_a_gpu_held_whole_beside_one_of_its_mig_devices_held_by_another_conflicts() -> None:
    """The whole GPU's holder reaches every MIG device's memory and SMs; a MIG device's
    holder beside it, or one claim holding both, is no conflict."""
    mig, sibling = "MIG-a", "MIG-b"
    node = NodeHolders(
        (
            Holder("team-a", "whole", "main", PLUGIN_LESS, (U[0],)),
            Holder("team-b", "slice", "main", PLUGIN, (mig,)),
            Holder("team-c", "other", "main", PLUGIN, (sibling,)),
            Holder("team-d", "claimed", "main", DRA, (U[1],), claims=("team-d/c",)),
            Holder("team-d", "claimed", "side", DRA, ("MIG-c",), claims=("team-d/c",)),
        ),
        (),
        True,
    )
    parents = {mig: U[0], sibling: U[0], "MIG-c": U[1]}
    assert holders.conflicts(node) == []  # without the parents, nothing to see
    found = holders.conflicts(node, parents)
    assert [(c.kind, c.gpus, c.holders) for c in found] == [
        (GPU_AND_MIG, (U[0], mig), ("team-a/whole", "team-b/slice")),
        (GPU_AND_MIG, (U[0], sibling), ("team-a/whole", "team-c/other")),
    ]
    assert found[0].explain({U[0]: "GPU 0", mig: "MIG 1g.10gb of GPU 0"}) == (
        "GPU 0 held whole by team-a/whole while MIG 1g.10gb of GPU 0 is held by team-b/slice"
    )


def test_time_sliced_gpus_may_have_several_holders() -> None:
    replicas = tuple(f"{u}::{n}" for u in U for n in range(4))
    node = holders.node_holders(
        GPUS,
        [],
        [assigned("a", "c", [f"{U[0]}::0"]), assigned("b", "c", [f"{U[0]}::1"])],
        [(RESOURCE, replicas)],
    )
    assert node.shared == tuple(sorted(U))
    assert holders.conflicts(node) == []


def test_two_plugin_less_pods_on_one_gpu_conflict_too() -> None:
    node = holders.node_holders(GPUS, [rec("a", [0], pod="one"), rec("b", [0], pod="two")], [], [])
    assert [c.kind for c in holders.conflicts(node)] == [SHARED_GPU]


def test_an_all_pod_beside_the_plugin_conflicts_even_before_they_overlap() -> None:
    every = [0, 1, 2, 3]
    all_pod = rec("agent", every, pod="daemon", whole_node=True)
    with_plugin = holders.node_holders(GPUS, [all_pod], [], [(RESOURCE, tuple(U))])
    [conflict] = holders.conflicts(with_plugin)
    assert (conflict.kind, conflict.holders, conflict.gpus) == (
        ALL_BESIDE_PLUGIN,
        ("team-a/daemon",),
        tuple(sorted(U)),
    )
    assert "took all GPUs" in conflict.explain()
    assert holders.conflicts(holders.node_holders(GPUS, [all_pod], [], [])) == []  # no plugin
    known = holders.node_holders(GPUS, [all_pod], [], [], plugin=True)  # the agent is the plugin
    assert [c.kind for c in holders.conflicts(known)] == [ALL_BESIDE_PLUGIN]
    listed = rec("agent", every, pod="daemon")  # the same GPUs, named one by one
    assert holders.conflicts(holders.node_holders(GPUS, [listed], [], [(RESOURCE, tuple(U))])) == []


def test_containers_of_one_dra_claim_share_its_gpus_without_conflict() -> None:
    """A claim serves every container that references it (a pod's containers; every pod of
    a shared claim): they hold its GPUs together. Another claim or a plugin-less container on
    the same GPU is a conflict."""
    claim = ("team-a/two-gpus",)
    node = holders.node_holders(
        GPUS,
        [
            rec("main", [0, 1], pod="trainer", path=DRA, claims=claim),
            rec("sidecar", [0], pod="trainer", path=DRA, claims=claim),
            rec("main", [1], pod="eval", path=DRA, claims=(*claim, "team-a/more")),
        ],
        [],
        [],
    )
    assert names(node) == [
        ("team-a/eval", DRA, (U[1],)),
        ("team-a/trainer", DRA, (U[0], U[1])),
        ("team-a/trainer", DRA, (U[0],)),
    ]
    assert holders.conflicts(node) == []
    assert holders.decode(holders.encode(node)) == node
    other = holders.node_holders(
        GPUS,
        [
            rec("main", [0], pod="a", path=DRA, claims=("team-a/one",)),
            rec("main", [0], pod="b", path=DRA, claims=("team-a/another",)),
            rec("x", [1], pod="squatter"),
            rec("main", [1], pod="c", path=DRA, claims=("team-a/third",)),
        ],
        [],
        [],
    )
    assert [(c.kind, c.holders) for c in holders.conflicts(other)] == [
        (SHARED_GPU, ("team-a/a", "team-a/b")),
        (SHARED_GPU, ("team-a/c", "team-a/squatter")),
    ]


def test_shares_of_a_shared_gpu_by_several_claims_are_no_conflict() -> None:
    """Claims of a shared GPU's consumable capacity: each holds a share, by design."""
    node = holders.node_holders(
        GPUS,
        [
            rec("main", [2], pod="a", path=DRA, claims=("team-a/x",), shares=(2,)),
            rec("main", [2], pod="b", path=DRA, claims=("team-a/y",), shares=(2,)),
        ],
        [],
        [],
    )
    assert node.shared == (U[2],)
    assert holders.conflicts(node) == []


def test_a_container_seen_as_dra_and_plugin_less_is_one_dra_holder() -> None:
    node = holders.node_holders(
        GPUS,
        [
            rec("main", [0], pod="p", path=DRA, claims=("team-a/c",)),
            rec("main", [1], pod="p"),
        ],
        [],
        [],
    )
    [holder] = node.holders
    assert (holder.path, holder.gpus, holder.claims) == (DRA, (U[0], U[1]), ("team-a/c",))


def test_pod_resources_and_a_record_of_one_claim_are_one_holder_of_it() -> None:
    """pod-resources names each DRA device's claim: a pod's two containers of one claim hold
    its GPU together; the record of one of them (gpuwire's runtime) is the same holder, and
    a container of another claim on that GPU is a conflict."""
    names_of = {"gpu-0": U[0]}
    claimed = [
        holders.Claimed("team-a", "p", c, "gpu.gpuwire.io", "node", "gpu-0", claim="team-a/x")
        for c in ("main", "sidecar")
    ]
    record = rec("main", [0], pod="p", path=DRA, claims=("team-a/x",))
    node = holders.node_holders(GPUS, [record], [], [], claimed=claimed, dra_names=names_of)
    assert [(h.container, h.path, h.gpus, h.claims) for h in node.holders] == [
        ("main", DRA, (U[0],), ("team-a/x",)),
        ("sidecar", DRA, (U[0],), ("team-a/x",)),
    ]
    assert holders.conflicts(node) == []
    assert holders.decode(holders.encode(node)) == node
    other = holders.Claimed(
        "team-a", "q", "main", "gpu.gpuwire.io", "node", "gpu-0", claim="team-a/y"
    )
    crowded = holders.node_holders(GPUS, [], [], [], claimed=[*claimed, other], dra_names=names_of)
    assert [c.holders for c in holders.conflicts(crowded)] == [("team-a/p", "team-a/p", "team-a/q")]


def test_a_plugin_only_seen_in_what_it_allocated_still_counts() -> None:
    """A kubelet without GetAllocatableResources: the plugin shows in its allocations."""
    node = holders.node_holders(
        GPUS,
        [rec("agent", [0, 1, 2, 3], pod="daemon", whole_node=True)],
        [assigned("trainer", "main", [U[3]])],
        [],
    )
    assert sorted(c.kind for c in holders.conflicts(node)) == [ALL_BESIDE_PLUGIN, SHARED_GPU]


def test_a_container_outside_kubernetes_is_named_by_its_id() -> None:
    node = holders.node_holders(GPUS, [rec("ctr", [0])], [], [])
    assert names(node) == [("container id-ctr", PLUGIN_LESS, (U[0],))]


def test_the_annotation_round_trips_and_is_stable() -> None:
    """The same holders, found in another order, give the same text: no needless PATCH."""
    found = [rec("agent", [0, 1, 2, 3], pod="daemon", whole_node=True), rec("b", [1], pod="b")]
    assignments = [assigned("trainer", "main", [f"{U[0]}::1"]), assigned("x", "y", [f"{U[2]}::0"])]
    allocatable = [(RESOURCE, (f"{U[0]}::0", f"{U[0]}::1", f"{U[2]}::0"))]
    node = holders.node_holders(GPUS, found, assignments, allocatable)
    text = holders.encode(node)
    assert holders.decode(text) == node
    assert " " not in text  # compact
    again = holders.node_holders(GPUS, found[::-1], assignments[::-1], allocatable)
    assert holders.encode(again) == text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[]", "not a JSON object"),
        ("{", "not a JSON object"),
        ('{"v":2,"plugin":false,"shared":[],"holders":[]}', "version 2 is not supported"),
        ('{"v":1,"plugin":false,"shared":[]}', "missing or wrong 'holders'"),
        (
            '{"v":1,"plugin":false,"shared":[],"holders":[{"namespace":"a","pod":"b",'
            '"container":"c","path":"magic","gpus":[]}]}',
            "path 'magic': expected one of plugin, dra, plugin-less",
        ),
    ],
)
def test_a_broken_annotation_says_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(HoldersError, match=message):
        holders.decode(text)


def test_holder_names() -> None:
    assert Holder("ns", "pod", "c", PLUGIN, ()).name == "ns/pod"
    assert Holder("", "", "0123456789abcdef", PLUGIN_LESS, ()).name == "container 0123456789ab"
