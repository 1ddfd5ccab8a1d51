"""One bucket through boto3, with every failure turned into an outcome class that names it.

The protocol (:mod:`.protocol`) branches on outcome classes only: RetryableError for what a
later attempt may fix (throttling, 5xx, an endpoint that does not answer), FatalError for what
it will not (a missing bucket, refused credentials). Each message names the operation, the
``s3://bucket/key`` it touched and the endpoint, so whoever reads a failed task's status knows
which of the three to check. A few answers are expected, not failures - "not there" (404) and
"precondition failed" (412) - and come back as None where the caller asks for that.

**Refusals name what to fix.** Credentials the server does not accept name the two key settings;
a request the bucket policy does not allow names the IAM action the call needs (:data:`ACTIONS`)
and the object - so a policy missing ``s3:AbortMultipartUpload`` says exactly that; a certificate
the client does not trust names ``aws.ca.bundle``. None is retried: no attempt fixes them.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError, IncompleteReadError, NoCredentialsError, SSLError
from botocore.exceptions import ConnectionError as BotoConnectionError

from eosink.connectors.api.errors import EosinkError, FatalError, RetryableError

COMPONENT = "s3"
_RETRYABLE_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "RequestLimitExceeded",
                              "InternalError", "ServiceUnavailable", "OperationAborted", "TooManyRequests",
                              "XMinioServerNotInitialized"})
_DENIED_CODES = frozenset({"AccessDenied", "403", "AllAccessDisabled"})
_CREDENTIAL_CODES = frozenset({"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken"})
#: The IAM action each boto3 call of the sink needs (what a bucket policy must allow).
ACTIONS: dict[str, str] = {
    "head_bucket": "s3:ListBucket", "list_objects_v2": "s3:ListBucket", "create_bucket": "s3:CreateBucket",
    "list_multipart_uploads": "s3:ListBucketMultipartUploads", "list_parts": "s3:ListMultipartUploadParts",
    "put_object": "s3:PutObject", "create_multipart_upload": "s3:PutObject", "upload_part": "s3:PutObject",
    "complete_multipart_upload": "s3:PutObject", "get_object": "s3:GetObject", "head_object": "s3:GetObject",
    "delete_objects": "s3:DeleteObject", "delete_object": "s3:DeleteObject", "abort_multipart_upload": "s3:AbortMultipartUpload",
}
#: "Not there" answers (HEAD has no body, so its code is the bare status; NoSuchBucket is not one).
MISSING = frozenset({"NoSuchKey", "NoSuchUpload", "404"})
#: A complete refused for its parts: MinIO answers so for a complete retried after a restart mid-complete,
#: and transiently for parts it stored (the caller checks the object and the upload before believing it).
STALE_PARTS = frozenset({"InvalidPart"})
#: A conditional write lost: the object exists (IfNoneMatch) or changed (IfMatch).
CONFLICT = frozenset({"PreconditionFailed", "412", "ConditionalRequestConflict", "409"})


def make_client(*, endpoint_url: str | None, region: str, access_key: str | None, secret_key: str | None,
                session_token: str | None, max_attempts: int, connections: int, path_style: bool,
                ca_bundle: str | None = None) -> Any:
    """A boto3 S3 client; ``ca_bundle``: PEM file of the CAs to trust (None: ``AWS_CA_BUNDLE``, else the system's).

    Every body stays verified by the server, once: over ``https`` botocore sends it unsigned with a
    CRC32 the server checks (its default); over plain ``http`` it always signs the body's SHA-256
    (``X-Amz-Content-SHA256``), which the server recomputes and refuses on a mismatch, so the
    CRC32 it would add on top (a second pass over every part, client and server) is left out there.
    """
    plain_http = bool(endpoint_url) and str(endpoint_url).lower().startswith("http://")
    checksums = {"request_checksum_calculation": "when_required"} if plain_http else {}
    config = Config(
        retries={"max_attempts": max_attempts, "mode": "standard"},
        connect_timeout=10, read_timeout=60, max_pool_connections=max(10, connections),
        s3={"addressing_style": "path" if path_style else "auto"},
        **checksums,
    )
    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint_url or None, region_name=region, aws_access_key_id=access_key or None,
        aws_secret_access_key=secret_key or None, aws_session_token=session_token or None, config=config,
        verify=ca_bundle or None,
    )


class Bucket:
    """``client.<op>(Bucket=name, ...)`` calls on one bucket, failures translated (see module doc)."""

    def __init__(self, client: Any, name: str, endpoint: str | None) -> None:
        self.client = client
        self.name = name
        self.endpoint = endpoint or "AWS S3"

    def call(self, op: str, key: str | None, *, none_on: frozenset[str] = frozenset(), **kwargs: Any) -> Any:
        """``client.<op>(Bucket=..., **kwargs)``; a ClientError whose code is in ``none_on`` returns
        None. ``key`` only names the object in error messages."""
        try:
            return getattr(self.client, op)(Bucket=self.name, **kwargs)
        except ClientError as exc:
            if code_of(exc) in none_on:
                return None
            raise self.error(exc, op, key) from exc
        except BotoCoreError as exc:
            raise self.error(exc, op, key) from exc

    def get(self, key: str) -> tuple[bytes, dict[str, Any]] | None:
        """The object's bytes and response, or None when it does not exist."""
        resp = self.call("get_object", key, Key=key, none_on=MISSING)
        if resp is None:
            return None
        try:
            return resp["Body"].read(), resp
        except BotoCoreError as exc:  # the connection broke while streaming the body
            raise self.error(exc, "get_object", key) from exc

    def pages(self, op: str, prefix: str, **kwargs: Any) -> Iterable[dict[str, Any]]:
        """Every page of a listing (``list_objects_v2`` or ``list_multipart_uploads``)."""
        try:
            yield from self.client.get_paginator(op).paginate(Bucket=self.name, Prefix=prefix, **kwargs)
        except (ClientError, BotoCoreError) as exc:
            raise self.error(exc, op, prefix) from exc

    def objects(self, prefix: str) -> Iterable[dict[str, Any]]:
        for page in self.pages("list_objects_v2", prefix):
            yield from page.get("Contents", [])

    def uploads(self, prefix: str) -> Iterable[dict[str, Any]]:
        """Unfinished multipart uploads whose key starts with ``prefix``.

        MinIO answers a prefix only when it is a whole key (a "directory" prefix lists nothing),
        and every upload of the bucket for an empty one: when the prefixed listing is empty, the
        bucket-wide one is filtered here, so the answer is the same on AWS and on MinIO.
        """
        found = False
        for page in self.pages("list_multipart_uploads", prefix):
            for u in page.get("Uploads", []):
                found = True
                yield u
        if not found and prefix:
            for page in self.pages("list_multipart_uploads", ""):
                yield from (u for u in page.get("Uploads", []) if u["Key"].startswith(prefix))

    def delete(self, keys: list[str]) -> None:
        for i in range(0, len(keys), 1000):  # DeleteObjects takes at most 1000 keys
            chunk = keys[i:i + 1000]
            resp = self.call("delete_objects", chunk[0], Delete={"Objects": [{"Key": k} for k in chunk], "Quiet": True})
            if resp.get("Errors"):
                e = resp["Errors"][0]
                if e.get("Code") in _DENIED_CODES:
                    raise FatalError(f"delete_objects s3://{self.name}/{e.get('Key')} at {self.endpoint}: access denied ({e.get('Code')}): "
                                     f"s3:DeleteObject on s3://{self.name}/{e.get('Key')} is not allowed (grant s3:DeleteObject "
                                     f"on bucket {self.name} to the user of aws.access.key.id, or in the policy of bucket "
                                     f"{self.name})", component=COMPONENT)
                raise RetryableError(f"delete s3://{self.name}/{e.get('Key')} failed: {e.get('Code')} {e.get('Message')}",
                                     component=COMPONENT)

    def error(self, exc: Exception, op: str, key: str | None) -> EosinkError:
        where = f"s3://{self.name}/{key}" if key else f"s3://{self.name}"
        at = f"{op} {where} at {self.endpoint}"
        if isinstance(exc, ClientError):
            code, status = code_of(exc), status_of(exc)
            msg = exc.response.get("Error", {}).get("Message", "")
            if status >= 500 or code in _RETRYABLE_CODES:
                return RetryableError(f"{at}: {code} (HTTP {status}) {msg}", component=COMPONENT)
            if code == "400" and self.endpoint.startswith("http://"):
                # No S3 error code: the answer was not S3's. A TLS-only server (MinIO with certificates)
                # answers a plain-HTTP request so.
                return FatalError(f"{at}: the endpoint answered HTTP 400 without an S3 error: if it serves TLS only, "
                                  "use an https:// s3.endpoint.url (and aws.ca.bundle for a private CA)", component=COMPONENT)
            if code in _CREDENTIAL_CODES:
                return FatalError(f"{at}: access denied ({code}): credentials refused: check aws.access.key.id / aws.secret.access.key",
                                  component=COMPONENT)
            if code in _DENIED_CODES:
                action = ACTIONS.get(op, op)
                return FatalError(f"{at}: access denied ({code}): {action} on {where} is not allowed (grant {action} on bucket "
                                  f"{self.name} to the user of aws.access.key.id, or in the policy of bucket {self.name})",
                                  component=COMPONENT)
            if code == "NoSuchBucket":
                return FatalError(f"{at}: bucket {self.name} does not exist (s3.bucket.name)", component=COMPONENT)
            return FatalError(f"{at}: {code} (HTTP {status}) {msg}", component=COMPONENT)
        cert = _cert_verification(exc) if isinstance(exc, SSLError) else None
        if cert is not None:
            why = cert.verify_message or cert.reason
            return FatalError(f"{op} {where}: TLS: the certificate of {self.endpoint} is not trusted ({why}): set aws.ca.bundle "
                              "to the CA file that signed it", component=COMPONENT)
        if isinstance(exc, (BotoConnectionError, HTTPClientError, IncompleteReadError)):
            return RetryableError(f"{op} {where}: cannot reach {self.endpoint} (s3.endpoint.url): {exc}", component=COMPONENT)
        if isinstance(exc, NoCredentialsError):
            return FatalError(f"{at}: no AWS credentials: set aws.access.key.id and aws.secret.access.key",
                              component=COMPONENT)
        return FatalError(f"{at}: {type(exc).__name__}: {exc}", component=COMPONENT)

    def close(self) -> None:
        self.client.close()


def _cert_verification(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate verification failure inside botocore's SSLError (wrapped by urllib3), if it is one."""
    seen: set[int] = set()
    todo: list[Any] = [exc]
    while todo:
        e = todo.pop()
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, ssl.SSLCertVerificationError):
            return e
        todo += [e.__cause__, e.__context__, *e.args, *getattr(e, "kwargs", {}).values()]
    return None


def code_of(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def status_of(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
