"""Exercise 14.6 (one step of a continuous-batching scheduler): fixed states that set each wrong policy apart, random
states, a trace, and the named wrong policies as subclasses of `scheduler.Scheduler` that change one part of the step.
"""
from __future__ import annotations

import copy

from common.core.checks import fail
from common.systems.inference import scheduler
from common.systems.inference.scheduler import Scheduler, Seq, blocks_for

class _AdmitPastBudget(Scheduler):
    def admit(self, running, waiting, free, bs, max_batch):
        while waiting and len(running) < max_batch:
            s = waiting.pop(0)
            free -= self.admit_need(s, bs)
            running.append(s)
        return free


class _LeakOnFinish(Scheduler):
    def finish(self, running, free, bs):
        kept, done, _ = super().finish(running, free, bs)
        return kept, done, free


class _SkipHead(Scheduler):
    def admit(self, running, waiting, free, bs, max_batch):
        for s in list(waiting):
            if len(running) < max_batch and self.admit_need(s, bs) <= free:
                waiting.remove(s)
                free -= self.admit_need(s, bs)
                running.append(s)
        return free


class _PreemptOldest(Scheduler):
    def victim(self, running):
        return 0


class _RequeueBack(Scheduler):
    def preempt(self, running, waiting, i, free, bs):
        v = running.pop(i)
        waiting.append(v)
        return free + blocks_for(v.tokens, bs)


class _LeakOnPreempt(Scheduler):
    def preempt(self, running, waiting, i, free, bs):
        super().preempt(running, waiting, i, free, bs)
        return free


class _RestartPreempted(Scheduler):
    def preempt(self, running, waiting, i, free, bs):
        free = super().preempt(running, waiting, i, free, bs)
        waiting[0].generated = 0
        return free


class _NoPreempt(Scheduler):
    def grow(self, running, waiting, free, bs):
        return free - sum(self.grow_need(s, bs) for s in running)


class _NoFirstTokenSlot(Scheduler):
    def admit_need(self, s, bs):
        return blocks_for(s.tokens, bs)


class _IgnoreMaxBatch(Scheduler):
    def admit(self, running, waiting, free, bs, max_batch):
        return super().admit(running, waiting, free, bs, 10 ** 9)


class _NoAdvance(Scheduler):
    def advance(self, running, admitted):
        pass


class _AdmittedDoNotAdvance(Scheduler):
    def advance(self, running, admitted):
        new = {id(s) for s in admitted}
        for s in running:
            s.generated += id(s) not in new


class _FinishEarly(Scheduler):
    def finish(self, running, free, bs):
        done = [s for s in running if s.generated >= s.max_new - 1]
        free += sum(blocks_for(s.tokens, bs) for s in done)
        return [s for s in running if s.generated < s.max_new - 1], done, free


class _BlockEveryStep(Scheduler):
    def grow_need(self, s, bs):
        return 1


class _AdmitFirst(Scheduler):
    """Admits before the running requests grow (the new ones hold their slot), and, unless finish_first, before the
    finished ones leave. Admitting before growing alone changes nothing a step returns (preempting the newest undoes
    the admissions in reverse): only the wasted prefills show it, so it is not a named mistake."""
    finish_first = True

    def step(self, running, waiting, free_blocks, block_size, max_batch):
        running, waiting, finished, free, bs = list(running), list(waiting), [], free_blocks, block_size
        if self.finish_first:
            running, finished, free = self.finish(running, free, bs)
        before = {id(s) for s in running}
        free = self.admit(running, waiting, free, bs, max_batch)
        new = {id(s) for s in running} - before
        if not self.finish_first:
            kept, finished, free = self.finish([s for s in running if id(s) in before], free, bs)
            running = kept + [s for s in running if id(s) in new]
        i = 0
        while i < len(running):
            need = 0 if id(running[i]) in new else self.grow_need(running[i], bs)
            if need <= free:
                free -= need
                i += 1
                continue
            v = running.pop()
            waiting.insert(0, v)
            free += self.admit_need(v, bs) if id(v) in new else blocks_for(v.tokens, bs)
        self.advance(running, [s for s in running if id(s) in new])
        return running, waiting, finished, free


class _AdmitBeforeFinish(_AdmitFirst):
    finish_first = False


SCHEDULER_MISTAKES = [
    (_NoPreempt, "over-commits the pool when it runs dry: a running request got a block that was not free (preempt "
                 "the most recently admitted request instead)"),
    (_AdmitPastBudget, "admits past the KV budget: it admitted a request whose blocks were not free, over-committing "
                       "the pool (admit only while the front request's tokens + 1 fit in the free blocks)"),
    (_LeakOnFinish, "leaks the blocks of finished requests: they never go back to the pool, so the cache shrinks each "
                    "time a request ends"),
    (_LeakOnPreempt, "keeps the blocks of a preempted request out of the pool: preemption must free them"),
    (_SkipHead, "lets a later, smaller request jump the queue when the front one does not fit: under load a long "
                "request would wait forever (starvation); admit first come first served and stop at the first that "
                "does not fit"),
    (_PreemptOldest, "preempts the oldest running request -- the one with the most tokens to recompute; preempt the "
                     "most recently admitted"),
    (_RequeueBack, "sends a preempted request to the back of the queue; it goes to the front, to run again first"),
    (_RestartPreempted, "throws away a preempted request's generated tokens: it keeps them and recomputes them with "
                        "its prompt when admitted again"),
    (_NoFirstTokenSlot, "admits a request with room for its tokens only: the token this step computes needs a slot "
                        "too (blocks for tokens + 1)"),
    (_IgnoreMaxBatch, "admits more requests than max_batch"),
    (_NoAdvance, "does not advance the running requests: each computes one token this step (generated + 1)"),
    (_AdmittedDoNotAdvance, "does not advance the requests admitted this step: their prefill computes their first "
                            "token"),
    (_FinishEarly, "finishes a request one token early: it leaves once it has generated all max_new tokens"),
    (_BlockEveryStep, "takes a new block for every token; a request needs one only when its tokens cross a block "
                      "boundary"),
    (_AdmitBeforeFinish, "admits before the finished requests leave: their blocks sit idle for a step (free them "
                         "first)"),
]


def seqs(*specs) -> list:
    """[Seq(rid, prompt, max_new, generated)] from (rid, prompt, max_new, generated) tuples."""
    return [Seq(*s) for s in specs]


def scheduler_scenarios() -> list:
    """Fixed states (running, waiting, free_blocks, block_size, max_batch), each setting some wrong policies apart."""
    return [
        # a request finishes; the front of the queue fits only with its blocks back; the next one fits anyway
        (seqs((0, 6, 3, 3), (1, 5, 9, 2)), seqs((2, 9, 4, 0), (3, 2, 4, 0)), 1, 4, 4),
        # the front of the queue is too long for the pool; a shorter one behind it would fit
        (seqs((0, 3, 9, 4)), seqs((1, 14, 3, 0), (2, 2, 3, 0), (3, 1, 3, 0)), 3, 4, 4),
        # the pool is dry: the oldest needs a block, so the newest is preempted (and the second newest too)
        (seqs((0, 7, 9, 1), (1, 3, 9, 1), (2, 6, 9, 2), (3, 2, 9, 0)), seqs((4, 3, 2, 0)), 0, 4, 4),
        # the batch is full: blocks are free but nobody may be admitted
        (seqs((0, 2, 9, 1), (1, 2, 9, 1)), seqs((2, 2, 3, 0)), 6, 4, 2),
        # the front's prompt fills whole blocks: room for its first token needs one more
        (seqs((0, 4, 9, 2)), seqs((1, 8, 3, 0), (2, 4, 3, 0)), 3, 4, 4),
        # one token before the end, and mid-block growth: nothing new is needed
        (seqs((0, 5, 4, 3), (1, 5, 6, 1)), [], 0, 4, 3),
        # two preemptions in one step, then the queue's front is one of them
        (seqs((0, 8, 9, 0), (1, 4, 9, 3), (2, 4, 9, 3)), seqs((3, 2, 2, 0)), 0, 4, 4),
    ]


def random_scheduler_state(rng) -> tuple:
    """A consistent random state: running sequences hold their blocks, the rest of the pool is free."""
    bs = rng.choice([2, 3, 4, 8])
    rid = iter(range(100))

    def one(running):
        max_new = rng.randint(1, 12)
        return Seq(next(rid), rng.randint(1, 20), max_new, rng.randint(1 if running else 0, max_new)
                   if running else rng.choice([0, 0, rng.randint(0, max_new - 1)]))
    running = [one(True) for _ in range(rng.randint(0, 6))]
    waiting = [one(False) for _ in range(rng.randint(0, 5))]
    free = rng.choice([0, 0, 1, 2, rng.randint(0, 12)])
    return running, waiting, free, bs, rng.randint(max(1, len(running)), 8)


def describe_state(running, waiting, free, bs, max_batch) -> str:
    def one(s):
        return f"r{s.rid}({s.prompt}+{s.generated}/{s.max_new})"
    return (f"schedule_step(running=[{', '.join(map(one, running))}], waiting=[{', '.join(map(one, waiting))}], "
            f"free_blocks={free}, block_size={bs}, max_batch={max_batch}) [r<id>(prompt+generated/max_new)]")


def step_result(got, where: str) -> tuple:
    """The learner's (running, waiting, finished, free_blocks) as `scheduler.canonical` data, or a verdict."""
    if not isinstance(got, (tuple, list)) or len(got) != 4:
        fail(f"{where} returned {type(got).__name__}; expected a tuple (running, waiting, finished, free_blocks)")
    for name, part in zip(("running", "waiting", "finished"), got[:3]):
        if not isinstance(part, (list, tuple)) or not all(isinstance(s, Seq) for s in part):
            fail(f"{where}: {name} must be a list of the Seq objects (got {type(part).__name__})")
    if isinstance(got[3], bool) or not isinstance(got[3], int):
        fail(f"{where}: free_blocks must be an int, got {type(got[3]).__name__} {got[3]!r}")
    return scheduler.canonical(got)


def scheduler_invariants(state, got, where: str) -> None:
    """Verdicts a wrong result earns whatever policy produced it: lost or doubled requests, blocks over-committed,
    leaked or counted twice, a batch over max_batch."""
    running, waiting, free, bs, max_batch = state
    run, wait, fin, got_free = got
    before = sorted(s.rid for s in running + waiting)
    after = sorted([r for r, _ in run] + [r for r, _ in wait] + list(fin))
    if before != after:
        lost = sorted(set(before) - set(after))
        fail(f"{where}: the requests changed -- {'lost ' + str(lost) if lost else 'some appear twice: ' + str(after)}"
             f"; every request is running, waiting or finished")
    if got_free < 0:
        fail(f"{where}: free_blocks = {got_free} is negative: the pool is over-committed")
    if len(run) > max_batch:
        fail(f"{where}: {len(run)} requests running with max_batch={max_batch}")
    held = sum(blocks_for(s.tokens, bs) for s in running) + free
    prompts = {s.rid: s.prompt for s in running + waiting}
    now = sum(blocks_for(prompts[r] + g, bs) for r, g in run) + got_free
    if now != held:
        odd = f"leaked: {held - now}" if now < held else f"counted twice: {now - held}"
        fail(f"{where}: the pool holds {held} blocks; after the step {now - got_free} are held by running requests "
             f"and {got_free} are free ({odd} blocks)")


def name_scheduler_mistake(state, got, where: str) -> None:
    """Fail naming the first wrong policy that gives exactly the learner's result on this state, or an invariant."""
    for cls, why in SCHEDULER_MISTAKES:
        if scheduler.canonical(cls().step(*copy.deepcopy(state))) == got:
            fail(f"{where}: the result {why}")
    scheduler_invariants(state, got, where)


def describe_result(c) -> str:
    run, wait, fin, free = c

    def listed(part):
        return ", ".join(f"r{r} gen {g}" for r, g in part)
    return f"running [{listed(run)}], waiting [{listed(wait)}], finished {list(fin)}, free_blocks {free}"


def scheduler_states(rng) -> list:
    """(state, is_random, label): the fixed states, random ones, then every step of a random trace through a small
    pool (the reference's result carried from step to step, so one mistake is judged on the state it meets)."""
    out = [(st, False, "") for st in scheduler_scenarios()]
    out += [(random_scheduler_state(rng), True, "") for _ in range(30)]
    trace = scheduler.random_trace(30, seed=rng.randrange(10 ** 6), prompt=(1, 30), max_new=(1, 16))
    pending, running, waiting, free, step = sorted(trace, key=lambda a: a[0]), [], [], 24, 0
    while pending or running or waiting:
        while pending and pending[0][0] <= step:
            waiting.append(pending.pop(0)[1])
        state = (running, waiting, free, 4, 6)
        out.append((copy.deepcopy(state), True, f"step {step} of a 30-request trace: "))
        running, waiting, _, free = Scheduler().step(*copy.deepcopy(state))
        step += 1
    return out


