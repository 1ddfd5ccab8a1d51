"""The engine: the commit cycle (task, with its types), the source, the decision log, recovery,
tolerance of bad records, and dead letters.

It depends on the sink contract (``eosink.connectors.api``) and nothing of the control plane.
"""
