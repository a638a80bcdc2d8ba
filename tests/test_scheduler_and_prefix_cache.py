"""common.systems.inference.scheduler (one continuous-batching step, a trace through it) and .prefix_cache (automatic
prefix caching, its hit rate on a multi-turn chat trace)."""
import pytest

from common.systems.inference import prefix_cache as pc
from common.systems.inference import scheduler as sc
from common.systems.inference.paged_kv import CacheFull


def _held(running, bs):
    return sum(sc.blocks_for(s.tokens, bs) for s in running)


def test_one_step_finish_grow_admit_advance():
    running = [sc.Seq(0, 6, 3, 3), sc.Seq(1, 5, 9, 2)]          # r0 is done; r1 needs no new block (7 -> 8 tokens)
    waiting = [sc.Seq(2, 9, 4), sc.Seq(3, 2, 4)]
    run, wait, fin, free = sc.schedule_step(running, waiting, 1, 4, 4)
    assert [s.rid for s in fin] == [0] and [(s.rid, s.generated) for s in run] == [(1, 3), (2, 1), (3, 1)]
    assert wait == [] and free == 1 + 3 - 3 - 1 and _held(run, 4) + free == 1 + 3 + 2   # the pool, whole


def test_preemption_takes_the_newest_and_requeues_it_first():
    running = [sc.Seq(0, 7, 9, 1), sc.Seq(1, 3, 9, 1), sc.Seq(2, 6, 9, 2), sc.Seq(3, 2, 9, 0)]
    pool = _held(running, 4)
    run, wait, fin, free = sc.schedule_step(running, [sc.Seq(4, 3, 2)], 0, 4, 4)
    assert [s.rid for s in run] == [0, 1] and [s.rid for s in wait] == [2, 3, 4]
    assert [s.generated for s in wait] == [2, 0, 0]                # kept: recomputed on re-admission
    assert _held(run, 4) + free == pool


def test_a_trace_runs_to_the_end_without_losing_a_block():
    trace = sc.random_trace(40, seed=1)
    r = sc.run_trace(sc.schedule_step, trace, 30, 4, 8)
    assert r.output_tokens == sum(s.max_new for _, s in trace) and r.preemptions > 0 and r.recomputed_tokens > 0
    assert r.history[-1][3] == 30 and r.history[-1][0] == () and 0 < r.mean_running <= 8
    roomy = sc.run_trace(sc.schedule_step, trace, 400, 4, 8)
    assert roomy.preemptions == 0 and roomy.steps <= r.steps
    with pytest.raises(ValueError, match=r"free_blocks=-1 must be an integer >= 0"):
        sc.schedule_step([], [], -1, 4, 4)


def test_prefix_cache_shares_full_blocks_only():
    st = pc.new_state(8, 4)
    st, a, hits_a = pc.allocate(st, list(range(11)))            # 2 full blocks + a partial one
    st, b, hits_b = pc.allocate(st, list(range(11)))            # the same prompt: the full blocks hit
    assert (hits_a, hits_b) == (0, 8) and a[:2] == b[:2] and a[2] != b[2]
    assert st.refs[a[0]] == 2 and st.refs[a[2]] == 1 and len(st.cached) == 2
    st, c, hits_c = pc.allocate(st, list(range(8)))             # all cached: the last block is computed anyway
    assert hits_c == 4 and c[0] == a[0] and c[1] not in a


def test_prefix_cache_keeps_released_blocks_until_evicted_least_recent_first():
    st = pc.new_state(6, 2)
    st, a, _ = pc.allocate(st, [1, 2, 3, 4, 5])                   # blocks 0, 1 named; 2 partial
    st = pc.release(st, a)
    assert st.free == [3, 4, 5, 2, 1, 0] and len(st.cached) == 2   # the tail goes back first; the names stay
    st, b, hits = pc.allocate(st, [1, 2, 3, 4, 9])
    assert hits == 4 and b[:2] == [0, 1] and st.free == [4, 5, 2]  # a hit leaves the free queue
    st, c, _ = pc.allocate(st, [7, 7, 7, 7, 7, 7])                # takes 4, 5, 2: no named block evicted
    assert c == [4, 5, 2] and len(st.cached) == 5
    with pytest.raises(CacheFull, match=r"no free block"):
        pc.allocate(st, [8] * 3)


def test_hit_rate_on_a_chat_trace_falls_with_the_pool():
    trace = pc.multi_turn_trace(conversations=6, turns=3, system_len=40, user_len=(5, 20), reply_len=(5, 30))
    assert len(trace) == 18 and sorted((t.conversation, t.turn) for t in trace) == [(c, k) for c in range(6)
                                                                                      for k in range(3)]
    later = next(t for t in trace if t.turn == 1)
    first = next(t for t in trace if t.conversation == later.conversation and t.turn == 0)
    assert later.prompt[:len(first.prompt) + len(first.reply)] == first.prompt + first.reply
    rates = [pc.simulate(trace, n, 4, concurrent=2).hit_rate for n in (2000, 120, 70)]
    assert rates[0] > 0.5 and rates[0] >= rates[1] >= rates[2]
    assert pc.simulate(trace, 2000, 4, concurrent=2).prompt_tokens == sum(len(t.prompt) for t in trace)
