"""The native edge of ``corral serve``: the ``corral_edge`` extension wired to the data plane.

``corral_edge`` (``edge/`` in the repository, an optional package built by maturin) owns the
listening sockets, parses HTTP/1.1 and gRPC, holds every connection to the Python edge's
limits, and hands the plain inference requests over in groups; everything else it forwards
to the Python edge, which listens on private Unix sockets in the same process. This folder
starts it (:mod:`~corral.server.native.edge`) and answers its groups
(:mod:`~corral.server.native.dispatch`); without the extension, ``corral serve`` runs the
Python edge alone, unchanged.
"""
