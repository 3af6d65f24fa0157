"""Service account tokens as kube-apiserver issues and checks them: bound tokens
(TokenRequest, "Managing Service Accounts", kubernetes.io/docs/reference/access-authn-authz/
service-accounts-admin/, "Bound service account tokens"), JWTs whose claims name the
service account, the pod they are bound to and its node, valid while those objects exist
with the UIDs they had.

The claims are the apiserver's (`pkg/serviceaccount/claims.go`: `iss`, `sub`
`system:serviceaccount:<ns>:<name>`, `aud`, `exp`, `iat`, `nbf`, `jti`, and `kubernetes.io`
with `namespace`, `serviceaccount`, `pod`, `node`), and so is the user a token authenticates
as (`pkg/serviceaccount/util.go`: the groups `system:serviceaccounts` and
`system:serviceaccounts:<ns>`, and the extra keys `authentication.kubernetes.io/pod-name`,
`pod-uid`, `node-name`, `node-uid`, `credential-id`). Signed with HS256 under a key of this
server, where the real one signs with an RSA or EC key: a client treats the token as opaque,
so nothing a pod does sees the difference. Left out: legacy Secret-based tokens and the
expiry warnings of extended tokens.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from testbed.rbac import AUTHENTICATED, User

ISSUER = "https://kubernetes.default.svc.cluster.local"
AUDIENCE = ISSUER  # the API server's own audience: a token asked for without audiences
EXTRA = "authentication.kubernetes.io/"


class TokenError(ValueError):
    """A token this server does not accept (the API server answers 401)."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class Bound:
    """An object a token is bound to: its name and UID."""

    name: str
    uid: str


class Issuer:
    def __init__(self, key: bytes | None = None) -> None:
        self.key = key or secrets.token_bytes(32)

    def issue(
        self,
        namespace: str,
        account: Bound,
        *,
        pod: Bound | None = None,
        node: Bound | None = None,
        audiences: tuple[str, ...] = (AUDIENCE,),
        seconds: int = 3607,
    ) -> tuple[str, int]:
        """A token for `account` in `namespace`, and when it expires (Unix seconds)."""
        now = int(time.time())
        private: dict[str, Any] = {
            "namespace": namespace,
            "serviceaccount": {"name": account.name, "uid": account.uid},
        }
        for key, bound in (("pod", pod), ("node", node)):
            if bound is not None:
                private[key] = {"name": bound.name, "uid": bound.uid}
        claims = {
            "iss": ISSUER,
            "sub": f"system:serviceaccount:{namespace}:{account.name}",
            "aud": list(audiences),
            "exp": now + seconds,
            "iat": now,
            "nbf": now,
            "jti": str(uuid.uuid4()),
            "kubernetes.io": private,
        }
        head = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
        body = _b64(json.dumps(claims, separators=(",", ":")).encode())
        signature = hmac.new(self.key, f"{head}.{body}".encode(), hashlib.sha256).digest()
        return f"{head}.{body}.{_b64(signature)}", now + seconds

    def claims(self, token: str) -> dict[str, Any]:
        """The claims of a token this issuer signed, not expired, for the API server."""
        try:
            head, body, signature = token.split(".")
            want = hmac.new(self.key, f"{head}.{body}".encode(), hashlib.sha256).digest()
            if not hmac.compare_digest(want, _unb64(signature)):
                raise TokenError("invalid bearer token: signature does not verify")
            claims: dict[str, Any] = json.loads(_unb64(body))
        except (ValueError, TypeError) as exc:
            raise TokenError(f"invalid bearer token: {exc}") from None
        if claims.get("exp", 0) < time.time():
            raise TokenError("invalid bearer token: token has expired")
        if AUDIENCE not in claims.get("aud", []):
            raise TokenError("invalid bearer token: token audiences is invalid")
        return claims


def user_of(claims: Mapping[str, Any], exists: Mapping[str, str | None]) -> User:
    """The user a token's claims authenticate as. `exists`: the current UID of each object
    the token names ("serviceaccount", "pod", "node"; None: gone), which must match."""
    private = claims["kubernetes.io"]
    for key in ("serviceaccount", "pod", "node"):
        bound = private.get(key)
        if bound is not None and exists.get(key) != bound["uid"]:
            raise TokenError(
                f"invalid bearer token: the {key} {bound['name']!r} it is bound to no longer exists"
            )
    namespace, account = private["namespace"], private["serviceaccount"]
    extra: dict[str, tuple[str, ...]] = {f"{EXTRA}credential-id": (f"JTI={claims['jti']}",)}
    for key in ("pod", "node"):
        if key in private:
            extra[f"{EXTRA}{key}-name"] = (private[key]["name"],)
            extra[f"{EXTRA}{key}-uid"] = (private[key]["uid"],)
    groups = ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", AUTHENTICATED)
    return User(claims["sub"], account["uid"], groups, extra)
