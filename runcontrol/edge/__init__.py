"""What the HTTP edge (``runcontrol.api``) and the gRPC edge (``runcontrol.rpc``) share.

``auth``: verified bearer tokens (who the caller is); ``errors``: the edges' own errors and the
one table from error families to HTTP and gRPC statuses; ``reads``: the read model queried on a
thread, a lost database answered as ``Unavailable``. Neither edge imports the other.
"""
