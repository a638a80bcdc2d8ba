"""Checkers for lab 07 (collectives): all-reduce cost formulas, nccl-tests bus factors, a ring all-reduce built from
point-to-point messages (run on threads under NCCL's rules, then on real ranks), the alpha/beta fit, the node-aware
expert-parallel send counts."""
from __future__ import annotations

import inspect
import math
import random

from common.core.checks import CheckFailed, checker, expect, expect_close, fail
from common.exercises import cost_mistakes as CM
from common.exercises import ring_messages as RM
from common.exercises.cases import as_number, learner_call, replayable
from common.parallel import collectives as C


# the checker's own look-alikes, which give the right answer too (allreduce_seconds, fit): watched like the references
_OWN = tuple(f for f in vars(CM).values() if inspect.isfunction(f) and f.__module__ == CM.__name__)


def _close(a, b, rtol=1e-6) -> bool:
    try:
        return math.isclose(float(a), float(b), rel_tol=rtol, abs_tol=1e-15)
    except (TypeError, ValueError):
        return False


_RD_NAME = "recursive_doubling"


@checker("7.1", "all-reduce cost formulas: ring, tree, recursive doubling")
@replayable
def check_allreduce_time(allreduce_time, cases):
    """allreduce_time(algorithm, n_bytes, p, alpha, bandwidth) -> seconds, for "ring", "tree", "recursive_doubling".
    A wrong formula is named when one look-alike (one phase, the whole buffer, log2 rounded down, the units...) gives
    every time the learner's gives for that algorithm."""
    rng = cases.rng
    # fixed cases first: p = 8 (no factor equals 1), p = 6 (not a power of two: ceil, floor and log2 differ), p = 2,
    # p = 1; then random ones
    cases_ = [(2**20, 8, 5e-6, 100e9), (2**30, 6, 3e-6, 450e9), (1000, 2, 1e-6, 1e9), (64, 1, 5e-6, 1e9)]
    cases_ += [(rng.randint(1, 2**31), rng.randint(2, 64), rng.uniform(1e-7, 2e-5), rng.uniform(1e9, 9e11))
              for _ in range(6)]

    def call(algorithm, n, p, alpha, bw, where):
        return as_number(learner_call(allreduce_time, (algorithm, n, p, alpha, bw), where,
                                      (C.allreduce_time, *C.ALLREDUCE_TIMES.values(), C.collective_time, *_OWN),
                                      library=True), where, "a number of seconds")
    for algorithm in ("ring", "tree", _RD_NAME):
        got = []
        for i, (n, p, alpha, bw) in enumerate(cases_):
            where = (f"allreduce_time({algorithm!r}, n_bytes={n}, p={p}, alpha={alpha:.3g}, bandwidth={bw:.3g})"
                     + cases.tag(i >= 4))
            got.append((where, call(algorithm, n, p, alpha, bw, where)))
        many = [i for i, c in enumerate(cases_) if c[1] > 1]
        wrong = [i for i in many if not _close(got[i][1], CM.allreduce_seconds(algorithm, *cases_[i]))]
        if wrong:
            where, value = got[wrong[0]]
            right = CM.allreduce_seconds(algorithm, *cases_[wrong[0]])
            looks = [CM.time_mistakes(algorithm, *cases_[i]) for i in many]
            for key in looks[0]:
                if all(_close(got[i][1], look[key][1]) for i, look in zip(many, looks)):
                    fail(f"{where} = {value:.6g} s, expected {right:.6g} s: "
                         f"{CM.time_mistakes(algorithm, *cases_[wrong[0]])[key][0]}")
            expect_close(value, right, where, rtol=1e-6)
        for (where, value), c in zip(got, cases_):
            expect(c[1] > 1 or abs(value) < 1e-15,
                   f"{where} = {value:.3g}: with one rank there is nothing to exchange, the time is 0")
    # the trade-off the formulas must show
    ring_s, rd_s, ring_b, rd_b = (call(a, n, 64, 5e-6, 100e9, f"allreduce_time({a!r}, n_bytes={n}, p=64, ...)")
                                  for a, n in (("ring", 1024), (_RD_NAME, 1024), ("ring", 2**30), (_RD_NAME, 2**30)))
    expect(rd_s < ring_s and ring_b < rd_b, "over 64 ranks recursive doubling should win for 1 KiB (fewer steps) and "
                                            "the ring for 1 GiB (fewer bytes per rank)")
    return (f"ring, tree and recursive doubling right for {len(cases_)} cases each; latency-optimal wins small "
            f"messages, the ring wins large ones")


_FACTOR_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


@checker("7.2", "nccl-tests bus factors")
@replayable
def check_bus_factor(bus_factor, cases):
    """bus_factor(collective, p) -> busbw / algbw as nccl-tests define it. A wrong factor is named when one
    look-alike (upside down, (p-1)/p for the all-reduce, 2 for the others, integer division...) gives every factor the
    learner's gives for that collective."""
    rng = cases.rng
    # p = 8 first: at p = 2 the all-reduce factor is 1 (= broadcast's, = 1/itself) and hides several mistakes
    ps = [8, 3, 2] + [rng.randint(2, 1024) for _ in range(4)]
    for coll in _FACTOR_COLLECTIVES:
        raw, got = [], []
        for i, p in enumerate(ps):
            where = f"bus_factor({coll!r}, p={p})" + cases.tag(i >= 3)
            value = learner_call(bus_factor, (coll, p), where, (C.bus_factor, *_OWN), library=True)
            raw.append(value)
            got.append((where, as_number(value, where, "a number (the factor)")))
        wrong = [i for i, p in enumerate(ps) if not _close(got[i][1], C.bus_factor(coll, p), 1e-9)]
        if not wrong:
            continue
        where, value = got[wrong[0]]
        expected = C.bus_factor(coll, ps[wrong[0]])
        said = f"{where} = {value:.6g}, expected {expected:.6g}"
        if all(isinstance(v, int) and v == math.floor(C.bus_factor(coll, p)) for v, p in zip(raw, ps)):
            fail(f"{said}: the factor came back as the whole number {value:g}, the fraction rounded down -- integer "
                 f"division (//) truncates; divide with /")
        if coll == "broadcast":
            fail(f"{said}: a (pipelined) broadcast sends every byte over each link once; its bus factor is 1")
        looks = [CM.factor_mistakes(coll, p) for p in ps]
        for key in looks[0]:
            if all(_close(got[i][1], look[key][1], 1e-9) for i, look in enumerate(looks)):
                fail(f"{said}: {looks[wrong[0]][key][0]}")
        expect_close(value, expected, where, rtol=1e-9)
    big = learner_call(bus_factor, ("all_reduce", 10**6), "bus_factor('all_reduce', p=10**6)", (C.bus_factor, *_OWN),
                       library=True)
    expect(abs(big - 2) < 1e-5, f"bus_factor('all_reduce', 10**6) = {big}: it should approach 2 for many ranks")
    return "all-reduce 2(p-1)/p; all-gather, reduce-scatter, all-to-all (p-1)/p; broadcast 1"


# --------------------------------------------------------------------------------------------------------------
# 7.3 ring all-reduce from isend/irecv


_DIST = ("common.parallel.rendezvous.ThreadDist", "common.parallel.rendezvous.P2POp",
         "common.parallel.rendezvous._Batch")  # the `dist` a thread-rank is handed: its calls, ops and works


def _ring_on_threads(ring_all_reduce, shape, p: int, timeout: float = 3.0):
    """The learner's ring on p thread-ranks under NCCL's rules, on coded inputs: (outputs, returned, inputs, log)."""
    import torch

    from common.parallel.rendezvous import Hang, NotPointToPoint, Rendezvous, run_threads
    xs = RM.encoded(shape, p)
    mine = [x.clone() for x in xs]
    where = f"ring_all_reduce(x [{tuple(shape)} float32], rank, world_size={p}, dist)"
    wire = Rendezvous(p, timeout)

    def rank(r, dist):
        return learner_call(ring_all_reduce, (mine[r], r, p, dist), where.replace("rank,", f"rank={r},"),
                            (C.ring_all_reduce,), library=True, allowed=_DIST)
    try:
        returned, _ = run_threads(rank, p, timeout, wire)
    except Hang:
        fail(f"{where}: {_hang(wire, p, xs[0].numel())}")
    except CheckFailed as exc:
        cause = exc.__cause__
        if isinstance(cause, Hang):
            fail(f"{where}: {_hang(wire, p, xs[0].numel())}")
        if isinstance(cause, NotPointToPoint):
            fail(f"{where}: you called {str(cause).split(':')[0]}: this exercise builds the all-reduce itself, from "
                 f"point-to-point messages (dist.isend / dist.irecv)")
        if isinstance(cause, IndexError) and len(torch.chunk(torch.zeros(xs[0].numel()), p)) < p:
            fail(f"{where}: your code raised IndexError: torch.chunk(x, {p}) gives only "
                 f"{len(torch.chunk(torch.zeros(xs[0].numel()), p))} chunks of {xs[0].numel()} elements; "
                 f"torch.tensor_split(x.view(-1), p) always gives p")
        if cause is not None and "process group" in str(cause):
            fail(f"{where}: {cause} -- use the `dist` your function is given (the checker's ranks are threads), "
                 f"not torch.distributed imported in the notebook")
        raise
    return mine, returned, xs, wire.log


def _hang(wire, p: int, n: int) -> str:
    """Why the ranks wait on each other: a message matched with a receive of another size (a wrong chunk, read as
    the messages are), or what each one's running batch still waits for."""
    if wire.mismatch:
        s, rv = wire.mismatch
        problem = RM.read_messages(wire.log + [(s.rank, rv.rank, s.tensor.detach().clone(), None)], p, n,
                                   complete=False)
        return problem or (f"rank {s.rank} sent {s.tensor.numel()} elements where rank {rv.rank} posted a receive "
                           f"of {rv.tensor.numel()}: the two ranks disagree on which chunk this step moves")
    heads = {r: [op for b in stream if not b.done for op in b.ops if not op.done][:4]
             for r, stream in wire.streams.items()}
    pending = [op for ops in heads.values() for op in ops]
    if pending and all(op.kind == "send" for op in pending):
        return ("every rank is waiting to send and none has posted its receive: under NCCL a send completes only "
                "once the receiver has posted the matching receive. Post each step's send and receive together, "
                "dist.batch_isend_irecv([dist.P2POp(dist.isend, ...), dist.P2POp(dist.irecv, ...)]), and wait then")
    for op in pending:
        right, left = (op.rank + 1) % p, (op.rank - 1) % p
        if p > 2 and ((op.kind == "recv" and op.peer == right) or (op.kind == "send" and op.peer == left)):
            other = "receives from" if op.kind == "recv" else "sends to"
            return (f"rank {op.rank} {other} rank {op.peer}, which does the same the other way: in a ring every "
                    f"rank sends to rank + 1 and receives from rank - 1 (or all the other way round)")
    return "the ranks wait on each other forever under NCCL's rules:\n" + wire.describe(0)


def _ring_cases(rng):
    # fixed: p = 4 and 10 elements (uneven chunks), 3 ranks, 5 elements over 4 ranks (torch.chunk gives 3 chunks), 2
    # ranks and 1 element (an empty chunk), 5 ranks, a 2-D tensor, fewer elements than ranks, one rank; then random
    cases = [(4, (10,)), (3, (7,)), (4, (5,)), (2, (1,)), (5, (23,)), (3, (4, 5)), (4, (3,)), (1, (6,))]
    cases += [(rng.randint(2, 5), (rng.randint(1, 3000),)) for _ in range(3)]
    return cases


@checker("7.3", "ring all-reduce from isend/irecv", in_kernel="it runs the learner's function on ranks of its own: "
                                                              "threads, then processes")
@replayable
def check_ring_all_reduce(ring_all_reduce, cases):
    """ring_all_reduce(x, rank, world_size, dist) -> x summed over the ranks, in place, built from dist.isend /
    dist.irecv / dist.batch_isend_irecv; run on threads with NCCL's rules, then on 3 real gloo ranks against
    dist.all_reduce on random tensors of awkward sizes."""
    import torch
    for i, (p, shape) in enumerate(_ring_cases(cases.rng)):
        what = f"ring_all_reduce on {p} ranks, x of shape {shape}" + cases.tag(i >= 8)
        mine, returned, xs, log = _ring_on_threads(ring_all_reduce, shape, p)
        right = RM.expected(shape, p)
        for r in range(p):
            if returned[r] is None:
                fail(f"{what}: rank {r} returned None; return x (summed in place, as dist.all_reduce leaves it)")
            if not torch.is_tensor(returned[r]) or tuple(returned[r].shape) != tuple(shape):
                fail(f"{what}: rank {r} returned {type(returned[r]).__name__} "
                     f"{tuple(getattr(returned[r], 'shape', ()))}; return x, the tensor you were given, summed")
        if all(torch.equal(o, right) for o in mine):
            problem = RM.read_messages(log, p, right.numel()) if p > 1 else None
            if problem:
                fail(f"{what}: the sums are right, but {problem}")
            if any(not torch.equal(ret, right) for ret in returned):
                fail(f"{what}: x holds the sum but what you returned does not: return x itself")
            continue
        if all(torch.equal(ret, right) for ret in returned):
            fail(f"{what}: you returned the sum but left x as it was: reduce x in place (as dist.all_reduce does: "
                 f"callers keep using x), e.g. work on views of x.view(-1), and return x")
        if all(torch.allclose(o, right / p) for o in mine):
            fail(f"{what}: every rank holds the sum divided by world_size = {p}: an all-reduce sums (averaging is "
                 f"the caller's choice, as DDP divides by the world size itself)")
        if all(torch.equal(o, x) for o, x in zip(mine, xs)) and p > 1:
            fail(f"{what}: x is unchanged on every rank: write the received chunks into x (or add them to it)")
        if p > 1:
            problem = RM.read_messages(log, p, right.numel())
            if problem:
                fail(f"{what}: {problem}")
            done = [RM.read_result(mine[r], right, p, r) for r in range(p)]
            if all(d and "only" in d for d in done):
                fail(f"{what}: {done[0]}: after the reduce-scatter each rank holds ONE complete chunk; the all-gather "
                     f"phase (p-1 more steps, passing complete chunks on) is missing")
            bad = next((d for d in done if d), None)
            if bad:
                fail(f"{what}: {bad}")
        r = next(r for r in range(p) if not torch.equal(mine[r], right))
        idx = int((mine[r] != right).reshape(-1).nonzero()[0])
        fail(f"{what}: rank {r}'s x differs from the sum at element {idx}: {float(mine[r].reshape(-1)[idx])} "
             f"instead of {float(right.reshape(-1)[idx])}")
    err = _ring_on_ranks(ring_all_reduce)
    expect(err <= 1e-5, f"on 3 gloo ranks your ring differs from dist.all_reduce by {err:.3g} (allowed 1e-5)")
    return (f"right on {len(_ring_cases(cases.rng))} cases of 1-5 thread-ranks under NCCL's rules, every message the "
            f"ring's; on 3 gloo processes within {err:.1e} of dist.all_reduce")


def _ring_on_ranks(ring_all_reduce, world_size: int = 3) -> float:
    """The learner's ring on real gloo ranks against dist.all_reduce: the worst absolute difference."""
    from common.parallel.distributed import WorkerError, run_workers
    try:
        worker, args = C.ring_task(ring_all_reduce, (1, 2, 7, 1000, 4099), world_size, repeats=1)
    except ValueError as exc:
        fail(f"ring_all_reduce cannot be sent to the ranks: {exc}")
    try:
        return C.summarize_ring(run_workers(worker, world_size, args=args, backend="gloo", timeout=120),
                                args[2])["max_abs_err"]
    except WorkerError as exc:
        fail(f"on real ranks your function raised {exc.exc_type or 'an error'}: {str(exc).splitlines()[0]}. The "
             f"ranks run your function's own source, with torch and math: define what it uses inside it")


def _synthetic(rng: random.Random, noise: float):
    p = rng.randint(2, 16)
    alpha = rng.uniform(1e-6, 50e-6)
    bw = rng.uniform(0.5e9, 500e9)
    k = rng.randint(8, 14)
    lo, hi = rng.uniform(6, 10), 31  # up to 2 GiB: the bandwidth term dominates the largest message
    sizes = [int(2 ** (lo + (hi - lo) * i / (k - 1))) for i in range(k)]
    times = [C.ring_allreduce_time(n, p, alpha, bw) * math.exp(rng.gauss(0, noise)) for n in sizes]
    return p, alpha, bw, sizes, times


@checker("7.4", "fit alpha and bandwidth by least squares")
@replayable
def check_fit_alpha_beta(fit_alpha_beta, cases):
    """fit_alpha_beta(sizes_bytes, seconds, p) -> (alpha_s, bandwidth_Bps) of a ring all-reduce, relative least
    squares. A wrong fit is named when one look-alike (absolute error, the intercept not divided, the algorithm
    bandwidth, units...) gives every (alpha, bandwidth) the learner's gives."""
    rng = cases.rng
    # exact data first: any correct fit recovers the parameters; a fixed case (p = 6: 2(p-1) = 10 steps, bus factor
    # 5/3, neither 1 nor 2), then random ones; then noisy data, where the relative least-squares solution is unique
    # and separates it from absolute error, two sizes only, or weights 1/t^2
    p, alpha, bw, sizes = 6, 20e-6, 10e9, [2**k for k in range(8, 31, 2)]
    data = [(p, alpha, bw, sizes, [C.ring_allreduce_time(n, p, alpha, bw) for n in sizes])]
    data += [_synthetic(rng, 0.0) for _ in range(2)] + [_synthetic(rng, 0.05) for _ in range(3)]
    got = []
    for j, (p, alpha, bw, sizes, times) in enumerate(data):
        value = learner_call(fit_alpha_beta, (sizes, times, p), f"fit_alpha_beta(sizes, times, p={p})",
                             (C.fit_alpha_beta, *_OWN), library=True)
        expect(isinstance(value, (tuple, list)) and len(value) == 2,
               f"fit_alpha_beta must return (alpha_seconds, bandwidth_bytes_per_s), got {value!r:.200}")
        a, b = (as_number(v, f"fit_alpha_beta(sizes, times, p={p})", "two numbers") for v in value)
        noise = "noise-free times" if j < 3 else "times with 5% noise"
        where = f"{noise} of a ring all-reduce over p={p} (alpha={alpha:.3g} s, bandwidth={bw:.3g} B/s)"
        got.append((where + cases.tag(j > 0), (a, b)))
    right = [CM.fit(d[3], d[4], d[0]) for d in data]
    wrong = [j for j, (_, ab) in enumerate(got) if not (_close(ab[0], right[j][0], 1e-4)
                                                      and _close(ab[1], right[j][1], 1e-4))]
    if not wrong:
        return "recovers alpha and the link bandwidth, fitting relative error"
    where, (a, b) = got[wrong[0]]
    looks = [CM.fit_mistakes(d[3], d[4], d[0]) for d in data]
    for key in looks[0]:
        if all(_close(ab[0], look[key][1][0], 1e-4) and _close(ab[1], look[key][1][1], 1e-4)
               for (_, ab), look in zip(got, looks)):
            fail(f"{where}: you returned alpha {a:.4g} s, bandwidth {b:.4g} B/s, the fit gives "
                 f"{right[wrong[0]][0]:.4g} s, {right[wrong[0]][1]:.4g} B/s: {looks[wrong[0]][key][0]}")
    expect_close(a, right[wrong[0]][0], f"alpha from {where}", rtol=1e-4)
    expect_close(b, right[wrong[0]][1], f"bandwidth from {where}", rtol=1e-4)
    fail(f"{where}: alpha {a:.6g} s, bandwidth {b:.6g} B/s; the fit gives {right[wrong[0]][0]:.6g} s, "
         f"{right[wrong[0]][1]:.6g} B/s")


# --------------------------------------------------------------------------------------------------------------
# 7.5 expert-parallel send counts (node-aware dispatch)


def _routing(seed: int, tokens: int, num_experts: int, k: int):
    """Random routing: each token picks k distinct experts (seeded)."""
    import torch
    g = torch.Generator().manual_seed(seed)
    return torch.rand(tokens, num_experts, generator=g).topk(k, dim=-1).indices


@checker("7.5", "send counts of the node-aware expert-parallel dispatch")
@replayable
def check_send_counts(send_counts, cases):
    """send_counts(indices, num_experts, world_size, ranks_per_node, rank) -> list of world_size ints: the rows this
    rank sends to each rank in the node-aware dispatch's first hop."""
    import torch

    from common.parallel import expert_parallel as EP
    rng = cases.rng
    # fixed, asymmetric cases first (several ranks per node, a rank that is not local 0, unequal node loads), then
    # random ones with a fresh seed (printed in a failure)
    cases_ = [(8, 4, 5, 32, 4, 12, 11), (6, 2, 3, 24, 3, 10, 12), (12, 3, 8, 36, 5, 9, 13), (4, 1, 2, 16, 4, 7, 14)]
    for _ in range(3):
        g = rng.choice([1, 2, 4])
        world = g * rng.randint(2, 4)
        epr = rng.randint(1, 4)
        e = world * epr
        cases_.append((world, g, rng.randrange(world), e, rng.randint(1, min(8, e)), rng.randint(1, 40),
                      rng.randrange(2**31)))
    runs = []  # (where, indices, case, the learner's counts, the right counts)
    for i, (world, g, rank, e, k, tokens, s) in enumerate(cases_):
        indices = _routing(s, tokens, e, k)
        before = indices.clone()
        where = (f"send_counts(indices [{tokens} tokens x top-{k}], num_experts={e}, world_size={world}, "
                 f"ranks_per_node={g}, rank={rank})" + cases.tag(i >= 4))
        try:
            got = learner_call(send_counts, (indices, e, world, g, rank), where, (EP.node_send_counts, *_OWN),
                               library=True)
        except CheckFailed as exc:
            if isinstance(exc.__cause__, IndexError) and rank >= g:
                fail(f"{exc}. Is a destination past the last rank? The copy for node m goes to rank m * "
                     f"ranks_per_node + rank % ranks_per_node (your index within your node, here {rank % g}), not "
                     f"m * ranks_per_node + rank")
            raise
        expect(torch.equal(indices, before), f"{where} modified `indices`; read it, do not change it")
        try:
            got_list = [int(v) for v in (got.tolist() if hasattr(got, "tolist") else got)]
        except (TypeError, ValueError):
            fail(f"{where} returned {type(got).__name__} {got!r}; expected a list of {world} ints (rows per rank)")
        expect(len(got_list) == world, f"{where} returned {len(got_list)} counts {got_list}; expected one per rank: "
                                       f"{world}")
        runs.append((where, indices, cases_[i], got_list, EP.node_send_counts(indices, e, world, g, rank)))
    wrong = [run for run in runs if run[3] != run[4]]
    if not wrong:
        return (f"node-aware send counts right on {len(cases_)} cases (1-4 ranks per node): one copy per (token, "
                f"node), to the rank with your local index there")
    where, indices, (world, g, rank, e, k, tokens, s), got_list, right = wrong[0]
    # a mistake is named when its formula gives the learner's counts on every case (one case alone can fit two)
    looks = [CM.count_mistakes(run[1], run[2][3], run[2][0], run[2][1], run[2][2]) for run in runs]
    named = [name for name in looks[0] if all(look[name] == run[3] for look, run in zip(looks, runs))]
    if named:
        fail(f"{where} = {got_list}, expected {right}: {' and '.join(named)}")
    nodes = indices // (e // world * g)
    copies = int(torch.zeros(tokens, world // g, dtype=torch.bool).scatter_(1, nodes, True).sum())
    if sum(got_list) != copies:
        fail(f"{where} = {got_list}, expected {right}: the counts sum to {sum(got_list)}, but the tokens have "
             f"{copies} (token, destination node) pairs, one copy each")
    bad = next(d for d in range(world) if got_list[d] != right[d])
    fail(f"{where} = {got_list}, expected {right}: first wrong destination rank {bad} (got {got_list[bad]}, "
         f"expected {right[bad]}); copies go to rank node * ranks_per_node + (rank % ranks_per_node)")

