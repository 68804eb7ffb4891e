"""The worker side: graph backends, the graph resource pool, transform/recover and graph runners.

Modules here import torch; the controller and the shared-memory layer never import them.
"""
