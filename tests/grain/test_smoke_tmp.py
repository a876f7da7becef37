from grain_harness import Harness

def test_a(h: Harness):
    grain, grant = h.start_run()
    print(grant)
    h.succeed(grain, grant)
    agg = h.load(grain.run_id)
    print(agg.run.state, h.event_types(grain.run_id), [ (j.entity, j.from_state, j.to_state) for j in h.journal(grain.run_id)])

def test_b(h: Harness):
    grain, grant = h.start_run()
