"""MinIO locked down: TLS with the stack's certificate, and a sink user whose policy allows one bucket.

MinIO serves TLS when its ``--certs-dir`` holds ``public.crt`` and ``private.key``; ``CAs/`` holds
the certificates it trusts itself (the stack's CA). The root user (``s3.root``) is for the stack's
provisioning only. At every start the stack (re)asserts, through the admin API
(:mod:`eosink.worker.stack.minio_admin`): bucket :data:`~eosink.worker.stack.secure.SINK_BUCKET`,
policy :data:`SINK_POLICY` and user ``eosink-sink`` with that policy alone - so a policy narrowed
by hand (a test proving what the sink needs does that) is whole again after ``stack up``.

:data:`SINK_BUCKET_ACTIONS` / :data:`SINK_OBJECT_ACTIONS` are what the S3 sink calls, each one
measured by removing it (``tests/test_secure_sinks.py``):

================================  =========================================  ==================================
action                            S3 calls of the sink                       first refusal without it (measured)
================================  =========================================  ==================================
s3:ListBucket                     HeadBucket at open, ListObjectsV2          open (HeadBucket)
                                  (recover's ``__pending__/``, the fence)
s3:ListBucketMultipartUploads     ListMultipartUploads (recover)             recover
s3:PutObject                      PutObject (txn ``.json``, epochs),         prepare (CreateMultipartUpload)
                                  CreateMultipartUpload, UploadPart,
                                  CompleteMultipartUpload
s3:GetObject                      GetObject (txn ``.json``, epochs),         commit (reading the epoch object)
                                  HeadObject (idempotent commit)
s3:DeleteObject                   DeleteObjects (a txn's ``.json``)          abort; after a commit the tidy-up
                                                                             is only logged, recover retries it
s3:AbortMultipartUpload           AbortMultipartUpload (abort, fence)        abort
s3:ListMultipartUploadParts       ListParts (commit by another instance)     commit of a recovered txn
================================  =========================================  ==================================

Not granted: CreateBucket, DeleteBucket, bucket policy/ACL/lifecycle calls, and every other bucket.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from eosink.worker.stack.minio_admin import MinioAdmin
from eosink.worker.stack.secure import SINK_BUCKET, Material

ROOT_ROLE = "s3.root"
SINK_ROLE = "s3.sink"
SINK_POLICY = "eosink-sink-bucket"
SINK_BUCKET_ACTIONS: tuple[str, ...] = ("s3:ListBucket", "s3:ListBucketMultipartUploads")
SINK_OBJECT_ACTIONS: tuple[str, ...] = ("s3:PutObject", "s3:GetObject", "s3:DeleteObject", "s3:AbortMultipartUpload",
                                        "s3:ListMultipartUploadParts")


def policy_document(bucket: str = SINK_BUCKET, bucket_actions: tuple[str, ...] = SINK_BUCKET_ACTIONS,
                    object_actions: tuple[str, ...] = SINK_OBJECT_ACTIONS) -> dict[str, Any]:
    """An IAM policy allowing ``bucket_actions`` on the bucket and ``object_actions`` on its objects, nothing else."""
    statements = []
    if bucket_actions:
        statements.append({"Effect": "Allow", "Action": list(bucket_actions), "Resource": [f"arn:aws:s3:::{bucket}"]})
    if object_actions:
        statements.append({"Effect": "Allow", "Action": list(object_actions), "Resource": [f"arn:aws:s3:::{bucket}/*"]})
    return {"Version": "2012-10-17", "Statement": statements}


def certs_dir(m: Material) -> Path:
    return m.directory / "minio-certs"


def write_certs(m: Material) -> Path:
    """MinIO's ``--certs-dir`` from the stack's material, rewritten on every start (the cert may be new)."""
    d = certs_dir(m)
    (d / "CAs").mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    for src, dest in ((m.server_cert, d / "public.crt"), (m.server_key, d / "private.key"), (m.ca_cert, d / "CAs" / "ca.pem")):
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(src.read_bytes())
    return d


def admin(m: Material, endpoint_url: str, region: str) -> MinioAdmin:
    return MinioAdmin(endpoint_url, m.user(ROOT_ROLE), m.password(ROOT_ROLE), str(m.ca_cert), region)


def provision(m: Material, endpoint_url: str, region: str) -> None:
    """Bucket, policy, user, attachment: each call idempotent, so every start re-asserts them."""
    import boto3
    from botocore.exceptions import ClientError

    client = boto3.client("s3", endpoint_url=endpoint_url, region_name=region, verify=str(m.ca_cert),
                          aws_access_key_id=m.user(ROOT_ROLE), aws_secret_access_key=m.password(ROOT_ROLE))
    try:
        client.create_bucket(Bucket=SINK_BUCKET)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            raise
    api = admin(m, endpoint_url, region)
    api.add_policy(SINK_POLICY, policy_document())
    api.add_user(m.user(SINK_ROLE), m.password(SINK_ROLE))
    api.set_user_policy(m.user(SINK_ROLE), SINK_POLICY)
