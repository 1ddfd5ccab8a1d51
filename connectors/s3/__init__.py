"""S3 sink: objects staged invisibly at prepare, made visible atomically at commit.
"""

from eosink.connectors.s3.sink import S3Sink

__all__ = ["S3Sink"]
