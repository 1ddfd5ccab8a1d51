"""Apache Iceberg sink: data files written at prepare, one fenced snapshot at commit.
"""

from eosink.connectors.iceberg.sink import IcebergSink

__all__ = ["IcebergSink"]
