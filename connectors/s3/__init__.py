"""S3 sink: each object a multipart upload at prepare, completed (made visible whole) at commit."""

from eosink.connectors.s3.sink import S3Sink

__all__ = ["S3Sink"]
