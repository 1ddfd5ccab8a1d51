"""The control plane: connector store, membership, leader assignment, status and the REST API.
"""
