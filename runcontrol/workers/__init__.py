"""The worker path, the server's side (DESIGN 10, docs/sessions.md): how dispatched attempts
reach workers.

- ``protocol``: the session messages between a worker process and a run host (``Credit``,
  ``Grant``, ``Answer``, ``SessionUp``, ``SessionDown``, ``SessionTransport``), the contract
  with the worker SDK (``runcontrol.sdk``) and with the gRPC ``Exchange``
  (``runcontrol.rpc.exchange``);
- ``book``: a run host's book of the credits offered to it and the attempts (offers) waiting
  for one, matched in memory (``CreditBook``, pure);
- ``fair_shares``: weighted fair queuing across tenants for a credit that serves every tenant
  (``FairShare``, pure);
- ``grants``: what a grant carries, computed once, and the grain's fused grant (``fuse``);
- ``sessions``: a run host's side of the exchanges (``HostSessions``: sequence numbers,
  superseded exchanges, waits, leases being made, the sweep) and the grains' ``Credits`` port
  (``FusedGrants``);
- ``claims``: the unary claim path (``Claims``), while it lives.

No module here imports Ray: ``actors.run_host.RunHost`` is the Ray shell that hands them its
mailboxes, router and database.
"""
