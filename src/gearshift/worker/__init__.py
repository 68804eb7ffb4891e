"""The worker side, torch-free: a session with the node's controller and its profiles.

Graph runners (`gearshift.graphs`, torch) are imported only when a profile builds one.
"""
