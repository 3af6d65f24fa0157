"""What each admission reads: the policy, the grant keys and the fleet, kept current.

Policy and keys come from mounted files (a ConfigMap, a Secret) and are reloaded when those
change; the fleet comes from a Node watch or a `--nodes` file. `decide` reads whatever is
current and calls the pure mutation, so the server and `gpuwire mutate` answer alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpuwire import grant
from webhook import fleet, policy
from webhook.fleet import Fleet
from webhook.mutation import Outcome, mutate
from webhook.reload import Watched
from webhook.review import Review


class FleetSource(Protocol):
    @property
    def current(self) -> Fleet: ...

    @property
    def synced(self) -> bool: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def refresh(self) -> None: ...


class FleetFile:
    """`--nodes FILE`: a static Node list, reloaded when the file changes."""

    def __init__(self, path: str | Path | None) -> None:
        paths = [Path(path)] if path else []
        self._file = Watched(
            f"nodes file {path}", paths, lambda: fleet.load(path) if path else Fleet()
        )

    @property
    def current(self) -> Fleet:
        return self._file.value

    @property
    def synced(self) -> bool:
        return True

    def start(self) -> None:
        """Nothing to start: the file was read when this was made."""

    def stop(self) -> None:
        """Nothing to stop."""

    def refresh(self) -> None:
        self._file.refresh()


@dataclass
class Sources:
    policy: Watched[policy.Policy]
    keys: Watched[grant.KeyRing]
    fleet: FleetSource

    @classmethod
    def load(cls, policy_path: str | None, key_dir: str | None, nodes: FleetSource) -> Sources:
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
        return cls(policies, keys, nodes)

    def decide(self, review: Review) -> Outcome:
        return mutate(
            review.pod,
            review.namespace,
            self.policy.value,
            self.fleet.current,
            self.keys.value,
        )

    def refresh(self) -> None:
        self.policy.refresh()
        self.keys.refresh()
        self.fleet.refresh()
