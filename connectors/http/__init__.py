"""HTTP sink: batches POSTed with an idempotency key, two phases over the endpoint's own protocol.
"""

from eosink.connectors.http.sink import HttpSink

__all__ = ["HttpSink"]
