"""PostgreSQL sink: COPY into a prepared transaction (PREPARE TRANSACTION), fenced per partition.
"""

from eosink.connectors.postgres.sink import PostgresSink

__all__ = ["PostgresSink"]
