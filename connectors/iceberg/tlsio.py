"""A pyiceberg FileIO whose S3 connections trust a private CA (``s3.ca-bundle``).

pyiceberg's :class:`PyArrowFileIO` builds pyarrow's ``S3FileSystem`` from its properties but has no
property for the CA file, and the AWS SDK under pyarrow trusts the system store only: an S3 server
signed by a private CA (the secure stack's MinIO, an on-premises store) fails every request with a
TLS error. pyarrow itself takes ``tls_ca_file_path``; this FileIO hands it over. The filesystem
pyiceberg built is rebuilt from its own constructor arguments (what ``S3FileSystem`` pickles as)
with the CA added, so every other property keeps meaning what pyiceberg makes it mean.

Named by the catalog property ``py-io-impl`` (so the catalog's table IO uses it too) and used by the
sink's marker storage directly.
"""

from __future__ import annotations

from typing import Any

from pyarrow.fs import FileSystem, S3FileSystem
from pyiceberg.io.pyarrow import PyArrowFileIO

#: The FileIO property: a PEM file of the CAs that sign the S3 endpoint's certificate.
S3_CA_BUNDLE = "s3.ca-bundle"
IMPL = f"{__name__}.CaBundleFileIO"


class CaBundleFileIO(PyArrowFileIO):
    """:class:`PyArrowFileIO` whose S3 filesystems verify the endpoint against ``s3.ca-bundle``."""

    def _initialize_s3_fs(self, netloc: str | None) -> FileSystem:
        fs = super()._initialize_s3_fs(netloc)
        ca = self.properties.get(S3_CA_BUNDLE)
        if not ca or not isinstance(fs, S3FileSystem):
            return fs
        rebuild, (kwargs,) = fs.__reduce__()
        arguments: dict[str, Any] = {**kwargs, "tls_ca_file_path": ca}
        return rebuild(arguments)


def untrusted_endpoint(endpoint: str, ca_file: str | None, timeout_s: float = 5.0) -> str | None:
    """Why an https ``endpoint``'s certificate fails verification against ``ca_file`` (None: the
    system store), or None when it passes or cannot be reached (a later request reports that).

    Checked once at open with Python's own TLS: pyarrow reports a refused certificate as a curl
    code inside a network error, which reads like an outage and is retried for ever.
    """
    import socket
    import ssl
    from urllib.parse import urlsplit

    parts = urlsplit(endpoint)
    if parts.scheme != "https" or not parts.hostname:
        return None
    ctx = ssl.create_default_context(cafile=ca_file) if ca_file else ssl.create_default_context()
    try:
        with socket.create_connection((parts.hostname, parts.port or 443), timeout=timeout_s) as sock:
            ctx.wrap_socket(sock, server_hostname=parts.hostname).close()
    except ssl.SSLCertVerificationError as exc:
        return str(exc.verify_message or exc.reason)
    except OSError:
        return None
    return None
