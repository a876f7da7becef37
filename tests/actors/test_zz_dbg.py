import threading, uuid
from runcontrol.bootstrap import build
from runcontrol.config import Settings
from runcontrol.domain import *
from runcontrol.grain import RunGrain, SubmitRequest
from runcontrol.store import uow as uowmod

def test_dbg(db, tenant, monkeypatch):
    orig = uowmod.UnitOfWork.save
    def save(self, agg):
        ch = agg._changes
        print(threading.current_thread().name, "save expected", ch.expected_version, "run.version", agg.run.version, "dirty", ch.run_dirty, "fseq", agg.run.fencing_seq, "leases", len(ch.leases), "new", agg._is_new)
        try:
            return orig(self, agg)
        except Exception as e:
            print(threading.current_thread().name, "save failed", type(e).__name__)
            raise
    monkeypatch.setattr(uowmod.UnitOfWork, "save", save)
    c = build(Settings(), db=db, migrate=False)
    env = c.env
    c.releases.publish(tenant, WorkflowDefinition("wf", (StepSpec(name="only", agent_id="a"),StepSpec(name="two", agent_id="b"))), "p", env.clock.now())
    for trial in range(10):
        g = RunGrain(env, tenant, uuid.uuid4())
        g.submit(Principal("alice", tenant, "proj-1", frozenset({Role.REQUESTER})),
                 SubmitRequest("proj-1", uuid.uuid4().hex, "wf", "m", {"n": 1}, release_alias="latest"))
        with db.tenant(tenant) as conn:
            (att,) = conn.exec_driver_sql("SELECT attempt_id FROM attempts WHERE run_id=%s", (g.run_id,)).scalars()
        a = g  # the submitting activation (cached)
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
