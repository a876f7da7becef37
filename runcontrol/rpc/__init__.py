"""The gRPC surface (``schemas/runcontrol.proto``, package ``runcontrol.v1``).

``codec``: domain dataclasses to and from messages, field by name, checked at import;
``table``: the codec of each message and ``RPCS``, the one table the servicer, the client and
the ingress methods are built from; ``status``: errors as gRPC statuses (the edges' table,
``runcontrol.edge.errors``) with the typed detail; ``service``: the RPCs over a
``RunControlClient`` (served by Ray Serve's gRPC ingress, ``actors/grpc_ingress.py``);
``exchange``: ``GrpcSessionTransport``, the worker session over ``Exchange`` that the SDK runs
on outside the cluster; ``client``: ``GrpcWorkerClient``, the unary RPCs one call each (no Ray
needed for either). Only ``service``
needs the server's packages (PyJWT, SQLAlchemy); the rest needs the ``grpc`` extra alone.
"""
