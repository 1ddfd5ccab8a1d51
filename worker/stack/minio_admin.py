"""MinIO's admin API, the three calls the secure stack needs: a policy, a user, the policy on the user.

Why in Python rather than a Go program built against ``madmin-go``: of the three calls only
``add-user`` has an encrypted body, and its format is small and fixed (madmin's ``EncryptData``,
``DecryptData`` on the server): ``salt(32) | algorithm id(1) | nonce(8) | sio stream``, the key
PBKDF2-SHA256(secret key of the caller, salt, 8192 rounds) for algorithm ``0x02`` (AES-256-GCM),
and the stream secure-io/sio-go's: 16 KiB fragments, each sealed with the nonce followed by a
little-endian fragment counter, the associated data ``0x00`` (``0x80`` on the last fragment)
followed by the tag of an empty message sealed under counter 0. About fifty lines against a Go
toolchain run, a module download and a cached binary per version; requests are signed with
botocore's SigV4 like any S3 call. The server accepts algorithm ``0x02`` whatever its own FIPS
mode (``madmin.DecryptData`` switches on the id byte).
"""

from __future__ import annotations

import hashlib
import json
import os
import ssl
import struct
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

ADMIN_PREFIX = "/minio/admin/v3"
_PBKDF2_AES_GCM = 0x02
_PBKDF2_ROUNDS = 8192
_FRAGMENT = 1 << 14  # sio.BufSize


class MinioAdminError(Exception):
    """The admin API refused a call; the message names the call and MinIO's answer (never a secret)."""


def encrypt(password: str, data: bytes) -> bytes:
    """``madmin.EncryptData`` with PBKDF2 + AES-256-GCM (see the module doc for the format)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    salt, nonce = os.urandom(32), os.urandom(8)
    aead = AESGCM(hashlib.pbkdf2_hmac("sha256", password.encode(), salt, _PBKDF2_ROUNDS, 32))

    def seal(seq: int, plain: bytes, ad: bytes) -> bytes:
        return aead.encrypt(nonce + struct.pack("<I", seq), plain, ad)

    if len(data) > _FRAGMENT:
        # The admin bodies sent here are a few hundred bytes: one fragment, the only shape exercised
        # against the server. Several would be sealed with counters 1..n, 0x00 but on the last.
        raise ValueError(f"an encrypted admin body is limited to {_FRAGMENT} bytes here, got {len(data)}")
    tag0 = seal(0, b"", b"")  # binds every fragment to this stream (sio's associated data)
    return b"".join([salt, bytes([_PBKDF2_AES_GCM]), nonce, seal(1, data, b"\x80" + tag0)])


@dataclass(frozen=True)
class MinioAdmin:
    """Signed calls to one MinIO server's admin API as its root user."""

    endpoint: str  # https://127.0.0.1:port
    access_key: str
    secret_key: str
    ca_file: str | None = None
    region: str = "us-east-1"
    timeout_s: float = 10.0

    def add_policy(self, name: str, document: dict[str, Any]) -> None:
        """Create or replace the canned policy ``name`` (plain JSON body)."""
        self._call("PUT", "add-canned-policy", {"name": name}, json.dumps(document).encode())

    def add_user(self, access_key: str, secret_key: str) -> None:
        """Create the user, or reset its secret key (the body is encrypted with the caller's secret)."""
        body = json.dumps({"secretKey": secret_key, "status": "enabled"}).encode()
        self._call("PUT", "add-user", {"accessKey": access_key}, encrypt(self.secret_key, body))

    def set_user_policy(self, user: str, policy: str) -> None:
        """Make ``policy`` the user's only policy (replaces whatever was attached)."""
        self._call("PUT", "set-user-or-group-policy", {"policyName": policy, "userOrGroup": user, "isGroup": "false"}, b"")

    def _call(self, method: str, api: str, query: dict[str, str], body: bytes) -> bytes:
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        url = f"{self.endpoint.rstrip('/')}{ADMIN_PREFIX}/{api}?{urlencode(query)}"
        request = AWSRequest(method=method, url=url, data=body,
                             headers={"X-Amz-Content-Sha256": hashlib.sha256(body).hexdigest()})
        SigV4Auth(Credentials(self.access_key, self.secret_key), "s3", self.region).add_auth(request)
        prepared = urllib.request.Request(url, data=body, method=method, headers=dict(request.headers.items()))
        context = ssl.create_default_context(cafile=self.ca_file) if url.startswith("https") else None
        try:
            with urllib.request.urlopen(prepared, timeout=self.timeout_s, context=context) as resp:  # noqa: S310 - our own server
                return bytes(resp.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            try:
                detail = json.loads(detail).get("Message", detail)
            except (ValueError, AttributeError):
                pass
            raise MinioAdminError(f"MinIO admin {api} answered HTTP {exc.code}: {detail}".strip()) from None
        except (urllib.error.URLError, OSError) as exc:
            raise MinioAdminError(f"MinIO admin {api} at {self.endpoint}: {exc}") from None
