"""What each admission reads: the policy, the grant keys, the fleet and the cluster's DRA
pools, kept current; and, where the webhook talks to an API server, the templates it creates.

Policy and keys come from mounted files (a ConfigMap, a Secret) and are reloaded when those
change; the fleet and the pools come from watches (Nodes, ResourceSlices) or from files
(`--nodes`, `--slices`). `decide` reads whatever is current and calls the pure mutation, so
the server and `gpuwire mutate` answer alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from gpuwire import grant
from webhook import ephemeral, fleet, podupdate, policy, pools
from webhook.fleet import Fleet
from webhook.lease import Leader
from webhook.mutation import Outcome, mutate
from webhook.pools import NO_POOLS, Pools
from webhook.reload import Watched
from webhook.review import EPHEMERAL, Review
from webhook.templates import TemplateStore

T = TypeVar("T", covariant=True)
S = TypeVar("S")


class Source(Protocol[T]):
    """A snapshot kept current: a watch (`webhook.watch.ListWatch`) or a file."""

    @property
    def current(self) -> T: ...

    @property
    def synced(self) -> bool: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def refresh(self) -> object: ...


class FileSource(Watched[S]):
    """A static snapshot from a file, reloaded when the file changes (none: `empty`)."""

    def __init__(self, what: str, path: str | Path | None, load: Callable[[str], S], empty: S):
        paths = [Path(path)] if path else []
        super().__init__(f"{what} {path}", paths, lambda: load(str(path)) if path else empty)

    @property
    def current(self) -> S:
        return self.value

    @property
    def synced(self) -> bool:
        return True

    def start(self) -> None:
        """Nothing to start: the file was read when this was made."""

    def stop(self) -> None:
        """Nothing to stop."""


def fleet_file(path: str | Path | None) -> FileSource[Fleet]:
    """`--nodes FILE`: a static Node list."""
    return FileSource("nodes file", path, fleet.load, Fleet())


def slices_file(path: str | Path | None) -> FileSource[Pools]:
    """`--slices FILE`: a static ResourceSlice list."""
    return FileSource("slices file", path, pools.load, NO_POOLS)


@dataclass
class Sources:
    policy: Watched[policy.Policy]
    keys: Watched[grant.KeyRing]
    fleet: Source[Fleet]
    pools: Source[Pools]
    templates: TemplateStore | None = None  # None: no API server to create them in
    leader: Leader | None = None  # removes unused templates while this replica leads

    @classmethod
    def load(
        cls,
        policy_path: str | None,
        key_dir: str | None,
        nodes: Source[Fleet],
        slices: Source[Pools] | None = None,
    ) -> Sources:
        """Everything read once now (a bad file fails here, loudly) and watched after."""
        policies = Watched(
            f"policy {policy_path}",
            [Path(policy_path)] if policy_path else [],
            lambda: policy.load(policy_path),
        )
        keys = Watched(
            f"grant keys {key_dir}",
            [Path(key_dir)] if key_dir else [],
            lambda: grant.KeyRing.load(key_dir) if key_dir else grant.KeyRing({}),
        )
        return cls(policies, keys, nodes, slices or slices_file(None))

    @property
    def watches(self) -> list[Source[object]]:
        """What runs in the background while the server serves."""
        found: list[Source[object]] = [self.fleet, self.pools]
        if self.templates is not None:
            found.append(self.templates.known)
        return found

    def decide(self, review: Review) -> Outcome:
        if review.operation == "UPDATE":
            kept = podupdate.decide(review.old_pod, review.pod)
            if kept.denial is None and review.subresource == EPHEMERAL:
                return ephemeral.mutate(
                    review.pod, review.namespace, self.policy.value, review.old_pod
                )
            return kept
        return mutate(
            review.pod,
            review.namespace,
            self.policy.value,
            self.fleet.current,
            self.keys.value,
            self.pools.current,
            review.uid,
        )

    def refresh(self) -> None:
        self.policy.refresh()
        self.keys.refresh()
        for source in self.watches:
            source.refresh()
