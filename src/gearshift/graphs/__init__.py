"""Graphs, with torch: graph backends, the graph resource pool, transform/recover, runners.

The controller, the core and the shared-memory layer never import these modules.
"""
