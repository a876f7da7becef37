import threading, uuid, time
from runcontrol.bootstrap import build
from runcontrol.config import Settings
from runcontrol.domain import *
from runcontrol.grain import RunGrain, SubmitRequest
from sqlalchemy.engine import Connection

def test_dbg(db, tenant, monkeypatch):
    orig = Connection._execute_context
    def execute(self, dialect, constructor, statement, parameters, execution_options, *args, **kw):
        name = threading.current_thread().name
        s = str(statement)[:50].replace("\n"," ")
        t0 = time.monotonic()
        try:
            r = orig(self, dialect, constructor, statement, parameters, execution_options, *args, **kw)
        except Exception as e:
            if name in "AB": print(name, "EXC", s, type(e).__name__)
            raise
        if name in "AB":
            print(name, s, "rowcount", r.rowcount, "took", round(time.monotonic()-t0, 3))
        return r
    monkeypatch.setattr(Connection, "_execute_context", execute)
    c = build(Settings(), db=db, migrate=False)
    env = c.env
    c.releases.publish(tenant, WorkflowDefinition("wf", (StepSpec(name="only", agent_id="a"),StepSpec(name="two", agent_id="b"))), "p", env.clock.now())
    for trial in range(10):
        g = RunGrain(env, tenant, uuid.uuid4())
        g.submit(Principal("alice", tenant, "proj-1", frozenset({Role.REQUESTER})),
                 SubmitRequest("proj-1", uuid.uuid4().hex, "wf", "m", {"n": 1}, release_alias="latest"))
        with db.tenant(tenant) as conn:
            (att,) = conn.exec_driver_sql("SELECT attempt_id FROM attempts WHERE run_id=%s", (g.run_id,)).scalars()
        a = g
        b = RunGrain(env, tenant, g.run_id)
        a.wake(); b.wake()
        print("---- race", trial)
        barrier = threading.Barrier(2)
        out = {}
        def body(grain, names):
            barrier.wait()
            for n in names:
                try:
                    out[n] = grain.acquire_lease(att, n)
                except Exception as e:
                    out[n] = e
        ts = [threading.Thread(target=body, args=(a, ["w-a", "w-c"]), name="A"), threading.Thread(target=body, args=(b, ["w-b", "w-d"]), name="B")]
        [t.start() for t in ts]; [t.join() for t in ts]
        bad = {k: v for k, v in out.items() if isinstance(v, Exception) and not isinstance(v, errors.RunControlError)}
        print(trial, {k: type(v).__name__ for k, v in out.items()})
        assert not bad, bad
