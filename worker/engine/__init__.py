"""The engine: the commit cycle (task), the source, the decision log, recovery and dead letters.

It depends on the sink contract (``eosink.connectors.api``) and nothing of the control plane.
"""
