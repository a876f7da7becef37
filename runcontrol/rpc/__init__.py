"""The gRPC surface (``schemas/runcontrol.proto``, package ``runcontrol.v1``).

``status``: the one table from error codes to gRPC status codes, with the typed detail;
``convert``: domain objects to and from the wire messages; ``service``: the RPCs over a
``RunControlClient`` (served by Ray Serve's gRPC ingress, ``grpc_ingress.py``);
``client``: ``GrpcWorkerClient``, what a worker outside the cluster uses (no Ray needed).
Only ``service`` needs the server's packages (PyJWT, FastAPI's auth); the rest needs the
``grpc`` extra alone.
"""
