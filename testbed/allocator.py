"""A stand-in for the kube-scheduler's structured allocator: for one node, the pod's claims
that are not allocated yet → a `status.allocation` for each, none ("no allocation on this
node"), or an AllocationError that aborts the pod's scheduling attempt.

Faithful, for the features gpuwire's claims use, to k8s.io/dynamic-resource-allocation
`structured/allocator.go` and its `internal/incubating` variant (the one 1.36's defaults run:
prioritized list, device taints and consumable capacity on). Each rule, and where it is:

1. Visible devices (`pools.go` GatherPools): slices with `nodeName` = the node, or
   `allNodes`; of each pool (driver, name) only the slices at its highest generation among
   them; a pool with fewer than `resourceSliceCount` of them is incomplete, one naming a
   device twice invalid. ExactCount takes devices from complete, valid pools only; All over
   an incomplete pool is an error; nothing found while a pool was invalid is an error.
   Order: pools by driver then name, slices by name, devices as listed (1.36+).
2. Candidates (`allocator_incubating.go` isSelectable): the class's selectors, then the
   request's (CEL, `testbed.dracel`); a CEL error aborts. With capacity requests every
   requested capacity must exist on the device; on a device that does not allow multiple
   allocations a request is a minimum size (`consumable_capacity.go`).
3. In use: a device allocated in the cluster or earlier in this pass is unavailable, except a
   device with `allowMultipleAllocations` while its capacity lasts; a multi-allocatable
   device allocated whole, or an ordinary one holding shares, is unavailable.
4. ExactCount picks `count` devices, trying combinations in list order; All takes every
   candidate (capacity-checked against the cluster, not this pass), at least one, and fails
   if one of them is in use or tainted (rule 8).
5. Constraints (`constraint.go`), checked as each device is added: `matchAttribute` — every
   device of the requests it names (none: all; `<req>` covers its subrequests) has the
   attribute, of equal type and value; `distinctAttribute` — all values differ. A missing
   attribute rejects the device; a violation in All mode is an error.
6. firstAvailable: subrequests in order, a later one only when no complete solution for the
   whole pod exists with an earlier one; the result names `<req>/<sub>`. A subrequest asking
   for more than a claim may hold is skipped; a request that does is an error.
7. Consumable capacity (`consumable_capacity.go`): per capacity of a shared device, the
   amount consumed is the request rounded by the policy (validRange: up to `min`, then to
   `min + n·step`, over `max` ineligible; validValues: the smallest value at least the
   request, over all ineligible; a request equal to `default` always valid), else the
   policy's `default`, else the whole value; what the cluster and this pass consumed plus
   it must fit every capacity. The result carries a fresh `shareID` and `consumedCapacity`.
8. Taints (`allocator_incubating.go` allocateDevice, `taintPreventsAllocation`): a NoSchedule
   or NoExecute taint must be tolerated (effect empty or equal, key empty or equal, Equal
   compares the value, Exists does not); None and unknown effects are ignored. It is checked
   as a device is allocated, after the selectors: ExactCount passes a tainted device over,
   while All has gathered its devices by the selectors alone (`validateDeviceRequest`), so
   one tainted device among them means no allocation on this node. A result carries the
   request's tolerations.
9. At most 32 results per claim (`AllocationResultsMaxSize`): before any device is tried,
   what a claim needs (its ExactCount counts, the devices All gathered on the node, a
   firstAvailable list's least) over 32 is an error ("exceeds the claim limit"), so All on
   a node with 33 matching devices fails the attempt rather than finding no allocation.
10. Result: `config` is each class's config (FromClass, for the requests using it) then the
    claim's configs whose `requests` name a chosen request (FromClaim); `nodeSelector`
    names the node when a device came from its own slice.
11. Depth-first over claims → requests → devices; the first full solution wins.

Left out: adminAccess, partitionable devices (counters), binding conditions, slices with a
`nodeSelector` or per-device node selection, list-typed attributes, DeviceTaintRules, the
per-node filter timeout, and scoring (the scheduler stand-in takes the first node).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from testbed import dracel
from testbed.dracel import CelError, Quantity

MAX_RESULTS = 32
NO_SCHEDULE = ("NoSchedule", "NoExecute")

Obj = dict[str, Any]
DeviceID = tuple[str, str, str]  # driver, pool, device


class AllocationError(Exception):
    """Why the pod's scheduling attempt stops (not a "no" for this node)."""


@dataclass(frozen=True)
class Features:
    """The DRA features the API server and scheduler have on (1.36's defaults)."""

    prioritized_list: bool = True  # DRAPrioritizedList, beta on from 1.34
    device_taints: bool = True  # DRADeviceTaints, beta on from 1.36
    consumable_capacity: bool = True  # DRAConsumableCapacity, beta on from 1.36


ALL_ON = Features()


@dataclass
class InUse:
    """What the cluster's allocated claims hold: devices whole, and shares of shared ones."""

    devices: set[DeviceID] = field(default_factory=set)
    consumed: dict[DeviceID, dict[str, Fraction]] = field(default_factory=dict)

    @classmethod
    def of(cls, claims: Iterable[Mapping[str, Any]]) -> InUse:
        found = cls()
        for claim in claims:
            allocation = (claim.get("status") or {}).get("allocation") or {}
            for r in (allocation.get("devices") or {}).get("results") or ():
                key = (r["driver"], r["pool"], r["device"])
                if r.get("shareID"):
                    held = found.consumed.setdefault(key, {})
                    for name, text in (r.get("consumedCapacity") or {}).items():
                        held[name] = held.get(name, Fraction(0)) + Quantity(str(text)).value
                else:
                    found.devices.add(key)
        return found


def format_quantity(value: Fraction) -> str:
    """A quantity as the API server writes one: binary suffixes where they fit."""
    if value.denominator != 1:
        return f"{value.numerator * 1000 // value.denominator}m"
    number = value.numerator
    for suffix, factor in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if number and number % factor == 0:
            return f"{number // factor}{suffix}"
    return str(number)


@dataclass
class _Device:
    id: DeviceID
    entry: Obj
    local: bool  # from a slice with this node's name (else allNodes)
    multi: bool  # allowMultipleAllocations, with consumable capacity on
    _variable: Any = None

    @property
    def name(self) -> str:
        return "/".join(self.id)

    @property
    def variable(self) -> Any:
        if self._variable is None:
            self._variable = dracel.device(self.entry, self.id[0])
        return self._variable

    def capacity(self) -> dict[str, tuple[Fraction, Obj | None]]:
        found = {}
        for name, cap in (self.entry.get("capacity") or {}).items():
            found[name] = (Quantity(str(cap["value"])).value, cap.get("requestPolicy"))
        return found

    def attribute(self, qualified: str) -> Any:
        attributes = self.entry.get("attributes") or {}
        if qualified in attributes:
            return attributes[qualified]
        domain, _, short = qualified.rpartition("/")
        return attributes.get(short) if domain == self.id[0] else None


@dataclass(frozen=True, eq=False)
class _Alternative:
    """A request, or one subrequest of a firstAvailable list."""

    name: str  # as results name it: `req` or `req/sub`
    base: str  # `req`
    class_name: str
    selectors: tuple[str, ...]
    mode: str
    count: int
    capacity: tuple[tuple[str, Fraction], ...]
    tolerations: tuple[Obj, ...]
    subrequest: bool


@dataclass
class _Claim:
    obj: Obj
    requests: list[list[_Alternative]]
    constraints: list[Obj]
    results: list[tuple[_Alternative, _Device, dict[str, Fraction] | None]] = field(
        default_factory=list
    )

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])


def _round(policy: Obj | None, asked: Fraction) -> Fraction | None:
    """`asked` as the request policy rounds it; None: no amount the policy accepts."""
    if policy is None:
        return asked
    if "default" in policy and Quantity(str(policy["default"])).value == asked:
        return asked
    if "validValues" in policy:
        fitting = [v for v in (Quantity(str(x)).value for x in policy["validValues"]) if v >= asked]
        return min(fitting) if fitting else None
    valid = policy.get("validRange")
    if valid is None:
        return asked
    low = Quantity(str(valid["min"])).value
    amount = max(asked, low)
    if valid.get("step") is not None:
        step = Quantity(str(valid["step"])).value
        amount = low + -(-(amount - low) // step) * step
    if valid.get("max") is not None and amount > Quantity(str(valid["max"])).value:
        return None
    return amount


def _tolerated(taint: Mapping[str, Any], tolerations: Sequence[Mapping[str, Any]]) -> bool:
    for t in tolerations:
        if t.get("effect") not in (None, "", taint.get("effect")):
            continue
        if t.get("key") not in (None, "", taint.get("key")):
            continue
        if t.get("operator", "Equal") == "Exists" or t.get("value", "") == taint.get("value", ""):
            return True
    return False


class _Allocator:
    def __init__(
        self,
        node: str,
        claims: Sequence[Obj],
        classes: Mapping[str, Obj],
        slices: Sequence[Obj],
        in_use: InUse,
        features: Features,
    ) -> None:
        self.node = node
        self.classes = classes
        self.in_use = in_use
        self.features = features
        self.devices, self.incomplete, self.invalid = self._pools(slices)
        self.used: set[DeviceID] = set()  # whole, in this pass
        self.consumed: dict[DeviceID, dict[str, Fraction]] = {}  # shares, in this pass
        self._selected: dict[tuple[int, DeviceID], bool] = {}  # by (id of the request, device)
        self.gathered: dict[int, list[_Device]] = {}  # All's devices, by id of the request
        self.claims = [self._claim(c) for c in claims]

    # --- what the node sees (rule 1)

    def _pools(self, slices: Sequence[Obj]) -> tuple[list[_Device], set[str], bool]:
        pools: dict[tuple[str, str], list[Obj]] = {}
        for s in slices:
            spec = s.get("spec") or {}
            if spec.get("nodeName") == self.node or spec.get("allNodes") is True:
                pools.setdefault((spec["driver"], spec["pool"]["name"]), []).append(s)
        devices: list[_Device] = []
        incomplete: set[str] = set()
        invalid = False
        for (driver, pool), found in sorted(pools.items()):
            top = max(int(s["spec"]["pool"].get("generation", 0)) for s in found)
            current = sorted(
                (s for s in found if int(s["spec"]["pool"].get("generation", 0)) == top),
                key=lambda s: str(s["metadata"]["name"]),
            )
            entries = [(s, e) for s in current for e in s["spec"].get("devices") or ()]
            names = [e["name"] for _, e in entries]
            if len(set(names)) != len(names):
                invalid = True
                continue
            if len(current) < int(current[0]["spec"]["pool"].get("resourceSliceCount", 1)):
                incomplete.add(f"{driver}/{pool}")
            for s, e in entries:
                if e.get("consumesCounters") or e.get("bindingConditions"):
                    continue  # partitionable devices, binding conditions: features left out
                multi = e.get("allowMultipleAllocations") is True
                devices.append(
                    _Device(
                        (driver, pool, e["name"]),
                        e,
                        s["spec"].get("nodeName") == self.node,
                        multi and self.features.consumable_capacity,
                    )
                )
        return devices, incomplete, invalid

    # --- the claims, checked before any device is tried

    def _claim(self, obj: Obj) -> _Claim:
        name = obj["metadata"]["name"]
        spec = (obj.get("spec") or {}).get("devices") or {}
        requests = []
        for r in spec.get("requests") or ():
            where = f"claim {name}, request {r['name']}"
            if r.get("firstAvailable"):
                if not self.features.prioritized_list:
                    raise AllocationError(
                        f"{where}: has subrequests, but the DRAPrioritizedList feature is disabled"
                    )
                subs = [
                    self._alternative(s, f"{r['name']}/{s['name']}", r["name"], True, name)
                    for s in r["firstAvailable"]
                ]
                requests.append(subs)
            else:
                exactly = r.get("exactly") or {}
                requests.append([self._alternative(exactly, r["name"], r["name"], False, name)])
        for c in spec.get("constraints") or ():
            if not c.get("matchAttribute") and not c.get("distinctAttribute"):
                raise AllocationError(
                    f"claim {name}: empty constraint (unsupported constraint type?)"
                )
        for alt in (a for alts in requests for a in alts if a.mode == "All"):
            self.gathered[id(alt)] = self.gather(alt, name)
        least = sum(
            min(a.count if a.mode == "ExactCount" else len(self.gathered[id(a)]) for a in alts)
            for alts in requests
        )
        if least > MAX_RESULTS:
            raise AllocationError(
                f"claim {name}: number of requested devices {least} exceeds the claim limit of "
                f"{MAX_RESULTS}"
            )
        return _Claim(obj, requests, list(spec.get("constraints") or ()))

    def _alternative(self, r: Obj, name: str, base: str, sub: bool, claim: str) -> _Alternative:
        where = f"claim {claim}, {'subrequest' if sub else 'request'} {name.rpartition('/')[2]}"
        class_name = r.get("deviceClassName") or ""
        if not class_name:
            raise AllocationError(f"{where}: missing device class name (unsupported request type?)")
        if class_name not in self.classes:
            raise AllocationError(f"{where}: could not retrieve device class {class_name}")
        mode = r.get("allocationMode") or "ExactCount"
        if mode not in ("ExactCount", "All"):
            raise AllocationError(f"{where}: unsupported count mode {mode}")
        count = int(r.get("count") or 1) if mode == "ExactCount" else 0
        if count > MAX_RESULTS and not sub:
            raise AllocationError(
                f"{where}: number of requested devices {count} exceeds the claim limit of "
                f"{MAX_RESULTS}"
            )
        capacity = ((r.get("capacity") or {}).get("requests")) or {}
        if capacity and not self.features.consumable_capacity:
            raise AllocationError(
                f"{where}: has capacity requests, but the DRAConsumableCapacity feature is disabled"
            )
        selectors = []
        for source in (
            (self.classes[class_name].get("spec") or {}).get("selectors") or (),
            r.get("selectors") or (),
        ):
            for s in source:
                expression = (s.get("cel") or {}).get("expression")
                if not expression:
                    raise AllocationError(
                        f"{where}: CEL expression empty (unsupported selector type?)"
                    )
                selectors.append(expression)
        return _Alternative(
            name,
            base,
            class_name,
            tuple(selectors),
            mode,
            count,
            tuple((k, Quantity(str(v)).value) for k, v in sorted(capacity.items())),
            tuple(r.get("tolerations") or ()),
            sub,
        )

    def gather(self, alt: _Alternative, claim: str) -> list[_Device]:
        """All's devices on the node: every candidate, its share checked against the cluster
        (not this pass), from a complete pool (`validateDeviceRequest`)."""
        wanted = [
            d
            for d in self.devices
            if self.selected(alt, d)
            and (not d.multi or self.fits(d, self.share(alt, d) or {}, False))
        ]
        for d in wanted:
            pool = "/".join(d.id[:2])
            if pool in self.incomplete:
                raise AllocationError(
                    f"claim {claim}, request {alt.name}: asks for all devices, but resource "
                    f"pool {pool} is currently being updated"
                )
        return wanted

    # --- one device for one request (rules 2, 3, 7, 8)

    def selected(self, alt: _Alternative, device: _Device) -> bool:
        key = (id(alt), device.id)
        found = self._selected.get(key)
        if found is None:
            try:
                found = all(dracel.matches(e, device.variable) for e in alt.selectors)
            except CelError as exc:
                raise AllocationError(f"request {alt.name}: {exc}") from None
            if found and alt.capacity:
                found = self.share(alt, device) is not None
            self._selected[key] = found
        return found

    def tolerates(self, alt: _Alternative, device: _Device) -> bool:
        """Whether no taint of the device keeps `alt` off it."""
        return not self.features.device_taints or all(
            _tolerated(t, alt.tolerations)
            for t in device.entry.get("taints") or ()
            if t.get("effect") in NO_SCHEDULE
        )

    def share(self, alt: _Alternative, device: _Device) -> dict[str, Fraction] | None:
        """What `alt` consumes of a shared device (every capacity of it), or for an ordinary
        device {} when it is large enough; None: it cannot serve the request."""
        capacity = device.capacity()
        asked = dict(alt.capacity)
        if any(name not in capacity for name in asked):
            return None
        if not device.multi:
            return {} if all(capacity[n][0] >= v for n, v in asked.items()) else None
        out = {}
        for name, (value, policy) in capacity.items():
            if name in asked:
                amount = _round(policy, asked[name])
            elif policy is not None and "default" in policy:
                amount = Quantity(str(policy["default"])).value
            else:
                amount = value
            if amount is None or amount > value:
                return None
            out[name] = amount
        return out

    def fits(self, device: _Device, share: Mapping[str, Fraction], in_pass: bool = True) -> bool:
        held = self.in_use.consumed.get(device.id, {})
        mine = self.consumed.get(device.id, {}) if in_pass else {}
        capacity = device.capacity()
        return all(
            held.get(n, 0) + mine.get(n, 0) + amount <= capacity[n][0]
            for n, amount in share.items()
        )

    def available(self, device: _Device, in_pass: bool = True) -> bool:
        if device.id in self.in_use.devices or (in_pass and device.id in self.used):
            return False
        return device.multi or device.id not in self.in_use.consumed

    # --- constraints (rule 5)

    def satisfies(self, claim: _Claim, alt: _Alternative, device: _Device) -> bool:
        for c in claim.constraints:
            named = c.get("requests") or ()
            if named and alt.base not in named and alt.name not in named:
                continue
            attribute = str(c.get("matchAttribute") or c.get("distinctAttribute"))
            value = device.attribute(attribute)
            if value is None:
                return False
            others = [
                d.attribute(attribute)
                for a, d, _ in claim.results
                if not named or a.base in named or a.name in named
            ]
            if c.get("matchAttribute") and others and others[0] != value:
                return False
            if c.get("distinctAttribute") and value in others:
                return False
        return True

    # --- the search (rules 4, 6, 9, 11)

    def usable(self, claim: _Claim, alt: _Alternative, device: _Device) -> bool:
        """What allocating a device checks before the constraints: room in the claim, not in
        use, its share fits, no taint against it (allocateDevice's order)."""
        if len(claim.results) >= MAX_RESULTS or not self.available(device):
            return False
        if device.multi:
            share = self.share(alt, device)
            if share is None or not self.fits(device, share):
                return False
        return self.tolerates(alt, device)

    def add(self, claim: _Claim, alt: _Alternative, device: _Device) -> bool:
        if not self.usable(claim, alt, device) or not self.satisfies(claim, alt, device):
            return False
        share = self.share(alt, device) if device.multi else None
        claim.results.append((alt, device, share))
        if share is None:
            self.used.add(device.id)
        else:
            mine = self.consumed.setdefault(device.id, {})
            for n, amount in share.items():
                mine[n] = mine.get(n, Fraction(0)) + amount
        return True

    def remove(self, claim: _Claim) -> None:
        _, device, share = claim.results.pop()
        if share is None:
            self.used.discard(device.id)
        else:
            for n, amount in share.items():
                self.consumed[device.id][n] -= amount

    def solve(self, i: int = 0, j: int = 0) -> bool:
        if i == len(self.claims):
            return True
        claim = self.claims[i]
        if j == len(claim.requests):
            return self.solve(i + 1, 0)
        for alt in claim.requests[j]:
            if alt.subrequest and alt.count > MAX_RESULTS:
                continue
            if alt.mode == "All":
                if self.all_of(claim, alt, self.gathered[id(alt)], i, j):
                    return True
                continue
            candidates = [d for d in self.devices if self.selected(alt, d)]
            if self.pick(claim, alt, candidates, alt.count, 0, i, j):
                return True
        return False

    def pick(
        self, claim: _Claim, alt: _Alternative, candidates: list[_Device], left: int, start: int,
        i: int, j: int,
    ) -> bool:  # fmt: skip
        if left == 0:
            return self.solve(i, j + 1)
        for k in range(start, len(candidates)):
            device = candidates[k]
            if "/".join(device.id[:2]) in self.incomplete:
                continue
            if self.add(claim, alt, device):
                if self.pick(claim, alt, candidates, left - 1, k + 1, i, j):
                    return True
                self.remove(claim)
        return False

    def all_of(
        self, claim: _Claim, alt: _Alternative, wanted: list[_Device], i: int, j: int
    ) -> bool:
        if not wanted:
            return False
        added = 0
        for d in wanted:
            if not self.usable(claim, alt, d):
                break
            if not self.satisfies(claim, alt, d):
                raise AllocationError(
                    f"claim {claim.name}, request {alt.name}: cannot add device {d.name} because "
                    "a claim constraint would not be satisfied"
                )
            if not self.add(claim, alt, d):
                break
            added += 1
        else:
            if self.solve(i, j + 1):
                return True
        for _ in range(added):
            self.remove(claim)
        return False

    # --- the result (rule 10)

    def allocation(self, claim: _Claim) -> Obj:
        results = []
        for alt, device, share in claim.results:
            r: Obj = {"request": alt.name, "driver": device.id[0], "pool": device.id[1],
                      "device": device.id[2]}  # fmt: skip
            if alt.tolerations:
                r["tolerations"] = [dict(t) for t in alt.tolerations]
            if share is not None:
                r["shareID"] = str(uuid.uuid4())
                if share:
                    r["consumedCapacity"] = {n: format_quantity(v) for n, v in share.items()}
            results.append(r)
        config = []
        chosen = [a for a, _, _ in claim.results]
        for class_name in dict.fromkeys(a.class_name for a in chosen):
            names = list(dict.fromkeys(a.name for a in chosen if a.class_name == class_name))
            for c in (self.classes[class_name].get("spec") or {}).get("config") or ():
                config.append({"source": "FromClass", "requests": names, **c})
        asked = {a.name for a in chosen} | {a.base for a in chosen}
        for c in ((claim.obj.get("spec") or {}).get("devices") or {}).get("config") or ():
            if not c.get("requests") or asked & set(c["requests"]):
                config.append({"source": "FromClaim", **c})
        devices: Obj = {"results": results}
        if config:
            devices["config"] = config
        out: Obj = {"devices": devices}
        if any(d.local for _, d, _ in claim.results):
            field_term = {"key": "metadata.name", "operator": "In", "values": [self.node]}
            out["nodeSelector"] = {"nodeSelectorTerms": [{"matchFields": [field_term]}]}
        return out


def allocate(
    node: str,
    claims: Sequence[Obj],
    classes: Mapping[str, Obj],
    slices: Sequence[Obj],
    in_use: InUse | None = None,
    features: Features = ALL_ON,
) -> list[Obj] | None:
    """Each claim's allocation on `node` (in claim order), or None where it cannot have them
    all; AllocationError stops the pod's scheduling attempt. `classes`: DeviceClasses by
    name; `in_use`: what the cluster's allocated claims hold."""
    allocator = _Allocator(node, claims, classes, slices, in_use or InUse(), features)
    if not allocator.claims:
        return []
    if allocator.solve():
        return [allocator.allocation(c) for c in allocator.claims]
    if allocator.invalid:
        raise AllocationError(
            f"node {node}: invalid resource pools were encountered, no allocation found"
        )
    return None
