"""What the TLS Secret holds next: renewal, CA rollover without a failed request, repair."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from cryptography import x509

from certs import pki, rotation

T0 = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
HOSTS = tuple(pki.service_hosts("gpuwire-webhook", "gpuwire-system"))
SETTINGS = rotation.Settings(HOSTS)
DAY = dt.timedelta(days=1)


@dataclass
class World:
    """The Secret's data and the webhook configuration's caBundle, driven the way
    `reconcile` drives them: one write per step, the Secret first, then the caBundle."""

    data: dict[str, bytes] = field(default_factory=dict)
    published: list[x509.Certificate] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    # Every serving certificate the Secret has held: replicas that have not synced yet may
    # still serve any of them.
    served: list[x509.Certificate] = field(default_factory=list)

    def step(self, now: dt.datetime) -> bool:
        material = rotation.Material.parse(self.data)
        change = rotation.next_change(material, self.published, SETTINGS, now)
        if change is not None:
            self.data.update(change.updates)
            self.log.extend(change.reasons)
            if pki.CERT_FILE in change.updates:
                self.served.append(self.serving())
            return True
        if list(material.trust) != self.published:
            self.published = list(material.trust)
            self.log.append(f"publish {len(self.published)} CA(s)")
            return True
        return False

    def settle(self, now: dt.datetime) -> list[str]:
        """Step until nothing changes, checking after each step that requests still work."""
        start = len(self.log)
        for _ in range(10):
            if not self.step(now):
                return self.log[start:]
            if self.published:
                for cert in self.served:
                    alive = cert.not_valid_after_utc > now
                    assert not alive or self.trusts(cert), f"a request fails after: {self.log[-1]}"
        raise AssertionError(f"no fixed point: {self.log[start:]}")

    def serving(self) -> x509.Certificate:
        return pki.load_certs(self.data[pki.CERT_FILE], "tls.crt")[0]

    def trusts(self, cert: x509.Certificate) -> bool:
        return any(pki.issued_by(cert, ca) for ca in self.published)

    def trusted(self, now: dt.datetime) -> bool:
        """The Secret's serving certificate is valid now and chains to the caBundle."""
        cert = self.serving()
        alive = cert.not_valid_before_utc <= now < cert.not_valid_after_utc
        return alive and self.trusts(cert)


def installed() -> World:
    world = World()
    world.settle(T0)
    return world


def run(world: World, days: int, every: int = 10) -> list[str]:
    """What a long-running `ensure` checking every `every` days does from T0 to T0 + days."""
    log = []
    for day in range(every, days + 1, every):
        log += world.settle(T0 + day * DAY)
    return log


def test_first_run_makes_ca_and_serving_certificate_then_publishes() -> None:
    world = World()
    assert world.settle(T0) == [
        "new CA (none yet)",
        "new serving certificate (none yet)",
        "publish 1 CA(s)",
    ]
    assert set(world.data) == {"ca.crt", "ca.key", "tls.crt", "tls.key"}
    assert world.trusted(T0)
    assert pki.hosts_of(world.serving()) == set(HOSTS)


def test_settled_state_is_left_alone() -> None:
    world = installed()
    before = dict(world.data)
    assert world.settle(T0 + 30 * DAY) == []
    assert world.data == before


def test_serving_certificate_renews_at_two_thirds_under_the_same_ca() -> None:
    world = installed()
    old_serving, old_ca = world.serving(), world.data["ca.key"]
    assert world.settle(T0 + 59 * DAY) == []
    log = world.settle(T0 + 61 * DAY)
    assert len(log) == 1
    assert log[0].startswith("new serving certificate (renewal due since 2025-03-01")
    assert world.serving() != old_serving
    assert world.data["ca.key"] == old_ca
    assert world.serving().not_valid_after_utc == T0 + 151 * DAY


def test_three_and_a_half_years_of_renewals_and_one_ca_rollover_never_break_a_request() -> None:
    world = installed()
    old_ca = world.published[0]
    log = run(world, 1270)  # settle() checks after every step that requests still work
    steps = [line.split(" (")[0] for line in log]
    rollover = steps.index("new CA")
    assert steps[rollover : rollover + 3] == [
        "new CA",
        "publish 2 CA(s)",
        "new serving certificate",
    ]
    assert "renewal due since 2026-12-31" in log[rollover]
    assert steps.count("new CA") == 1
    # Never expired (one renewal per 90 days at least), never early (one per 60 at most,
    # plus the reissue under the new CA).
    assert 1270 // 90 <= steps.count("new serving certificate") <= 1270 // 60 + 1
    # The old CA stayed trusted until it expired, then left the bundle.
    dropped = steps.index("expired CA dropped from the trust bundle")
    assert steps[dropped + 1] == "publish 1 CA(s)"
    assert dropped > rollover
    assert old_ca not in world.published
    assert pki.issued_by(world.serving(), world.published[0])


def test_deleting_the_secret_rotates_everything_while_old_certificates_stay_trusted() -> None:
    world = installed()
    old_ca = world.published[0]
    world.data.clear()  # `kubectl delete secret` to force a new CA
    log = world.settle(T0 + DAY)  # settle() checks every certificate served so far
    assert [line.split(" (")[0] for line in log] == [
        "new CA",
        "CAs the caBundle trusts kept in the trust bundle",
        "publish 2 CA(s)",
        "new serving certificate",
    ]
    assert world.published[1:] == [old_ca]
    assert pki.issued_by(world.serving(), world.published[0])


def test_a_replica_still_serving_the_old_certificate_stays_trusted_during_rollover() -> None:
    world = installed()
    run(world, 720)
    old_serving = world.serving()
    assert len(world.published) == 1
    world.settle(T0 + 2 * 365 * DAY + 5 * DAY)
    assert world.serving() != old_serving
    assert len(world.published) == 2
    assert any(pki.issued_by(old_serving, ca) for ca in world.published)


def test_new_names_reissue_the_serving_certificate() -> None:
    world = installed()
    renamed = rotation.Settings(tuple(pki.service_hosts("gw", "gpuwire-system")))
    change = rotation.next_change(
        rotation.Material.parse(world.data), world.published, renamed, T0 + DAY
    )
    assert change is not None
    assert change.reasons == [
        "new serving certificate (names changed to gw, gw.gpuwire-system, "
        "gw.gpuwire-system.svc, gw.gpuwire-system.svc.cluster.local)"
    ]
    assert set(change.updates) == {"tls.crt", "tls.key"}


def test_corrupt_serving_key_is_replaced_and_the_reason_names_it() -> None:
    world = installed()
    world.data["tls.key"] = b"not a key"
    log = world.settle(T0 + DAY)
    assert len(log) == 1
    assert "tls.key: not an unencrypted PEM private key" in log[0]
    assert pki.key_matches(world.serving(), pki.load_key(world.data["tls.key"], "tls.key"))


def test_mismatched_ca_key_starts_a_rollover_without_breaking_requests() -> None:
    world = installed()
    world.data["ca.key"] = pki.new_ca(T0).key_pem()
    log = world.settle(T0 + DAY)
    assert log[0] == "new CA (ca.key does not match its certificate)"
    assert len(world.published) == 2


def test_emptied_ca_bundle_is_published_again_and_serving_is_kept() -> None:
    world = installed()
    serving = world.data["tls.crt"]
    world.published = []  # e.g. the configuration was re-created from the manifests
    assert world.settle(T0 + DAY) == ["publish 1 CA(s)"]
    assert world.data["tls.crt"] == serving


def test_expired_serving_certificate_is_replaced_even_before_publishing() -> None:
    world = installed()
    later = T0 + 100 * DAY  # serving expired at day 90: no request works, nothing to protect
    world.published = []
    assert world.step(later)
    assert world.log[-1] == "new serving certificate (expired at 2025-04-01 00:00Z)"
    assert world.settle(later) == ["publish 1 CA(s)"]
    assert world.trusted(later)
