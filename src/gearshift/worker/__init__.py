"""The worker side, torch-free: a session with the node's controller and its profiles.

Modules, each importing only those before it: interfaces (`Host`, what a profile uses of its
client; `Runner`, what it drives), routing (the request path), profile (requests in flight,
adoption, warm-up, release), registration (the mailbox pump), standins (for the ring and the
snapshot region until they exist), session (`Client`), connecting (`connect`).
Graph runners (`gearshift.graphs`, torch) are imported only when a profile builds one.
"""
