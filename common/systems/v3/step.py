"""DeepSeek-V3's DualPipe chunks composed from their kernels (common.systems.v3.kernels): the overlapped F&B pair as
DeepSeek's trace runs it, lone chunks, the layers of each pipeline stage, and durations for lab 08's simulator.

An F&B pair runs the forward chunk's blocks and the backward chunk's blocks interleaved, one of each at a time, on
two resources -- the compute stream and DeepEP's communication stream -- in the order of DeepSeek's trace:
compute attn(F), mlp(B), mlp(W), mlp(F), attn(B), attn(W); communication combine(B), dispatch(F), dispatch(B),
combine(F). Each waits for its inputs: mlp(B) for combine(B) (the gradient it dispatches), dispatch(F) for attn(F),
mlp(F) for dispatch(F), dispatch(B) for mlp(B), attn(B) for dispatch(B), combine(F) for mlp(F); across blocks,
attn(F) of the next block waits for combine(F), combine(B) of the next for attn(B). Nothing else is assumed: the
pair's time is what these dependencies and the kernel times give. A lone chunk (pipeline warm-up, or a schedule
without overlap) runs its compute and its communication one after the other.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from common.parallel import pipeline
from common.systems.v3 import kernels as v3kernels

COMPUTE_ORDER = ("attn(F)", "mlp(B)", "mlp(W)", "mlp(F)", "attn(B)", "attn(W)")
COMM_ORDER = ("combine(B)", "dispatch(F)", "dispatch(B)", "combine(F)")
DEPENDS = {"mlp(B)": "combine(B)", "dispatch(F)": "attn(F)", "mlp(F)": "dispatch(F)", "dispatch(B)": "mlp(B)",
           "attn(B)": "dispatch(B)", "combine(F)": "mlp(F)"}
FORWARD = ("attn(F)", "dispatch(F)", "mlp(F)", "combine(F)")
BACKWARD = ("combine(B)", "mlp(B)", "mlp(W)", "dispatch(B)", "attn(B)", "attn(W)")


@dataclass(frozen=True)
class Block:
    """One block of a stage (an MoE layer, a dense layer, the heads): seconds per phase."""
    kind: str
    phases: tuple   # ((phase, seconds), ...)

    def t(self, phase: str) -> float:
        return dict(self.phases).get(phase, 0.0)

    @property
    def forward(self) -> float:
        return sum(self.t(p) for p in FORWARD)

    @property
    def backward(self) -> float:
        return sum(self.t(p) for p in BACKWARD)

    @property
    def weights(self) -> float:
        return self.t("mlp(W)") + self.t("attn(W)")


def block(kind: str, kernels) -> Block:
    return Block(kind, tuple(v3kernels.by_phase(kernels).items()))


def blocks(cfg, s: v3kernels.Setup) -> dict:
    """{kind: Block} for "moe", "dense", "heads" at setup `s`."""
    values = getattr(cfg, "values", cfg)
    return _blocks(tuple(sorted(values.items())), s)


@lru_cache(maxsize=64)
def _blocks(items: tuple, s: v3kernels.Setup) -> dict:
    cfg = dict(items)
    return {"moe": block("moe", v3kernels.moe_layer(cfg, s)), "dense": block("dense", v3kernels.dense_layer(cfg, s)),
            "heads": block("heads", v3kernels.heads(cfg, s))}


@dataclass
class Pair:
    step: float
    spans: list        # (resource, phase, index, start, end); resource "compute" or "comm"

    def phase_seconds(self) -> dict:
        out: dict = {}
        for _, ph, _, s, e in self.spans:
            out[ph] = out.get(ph, 0.0) + (e - s)
        return out


def pair(f_blocks, b_blocks) -> Pair:
    """The overlapped F&B pair of a forward chunk through `f_blocks` and a backward chunk through `b_blocks`
    (lists of Block, in the order each chunk visits them)."""
    n = max(len(f_blocks), len(b_blocks))
    free = {"compute": 0.0, "comm": 0.0}
    done: dict = {}
    spans = []
    prev_cf = prev_ab = 0.0
    for i in range(n):
        fb = f_blocks[i] if i < len(f_blocks) else None
        bb = b_blocks[i] if i < len(b_blocks) else None

        def dur(phase):
            src = fb if phase in FORWARD else bb
            return src.t(phase) if src is not None else 0.0

        ready = {"attn(F)": prev_cf, "combine(B)": prev_ab}
        # the two streams in the trace's order; each phase waits for its resource and its input
        order = [("comm", "combine(B)"), ("compute", "attn(F)"), ("comm", "dispatch(F)"), ("compute", "mlp(B)"),
                 ("compute", "mlp(W)"), ("comm", "dispatch(B)"), ("compute", "mlp(F)"), ("comm", "combine(F)"),
                 ("compute", "attn(B)"), ("compute", "attn(W)")]
        for res, ph in order:
            start = max(free[res], ready.get(ph, 0.0), done.get((i, DEPENDS[ph]), 0.0) if ph in DEPENDS else 0.0)
            end = start + dur(ph)
            done[(i, ph)] = end
            free[res] = end
            spans.append((res, ph, i, start, end))
        prev_cf, prev_ab = done[(i, "combine(F)")], done[(i, "attn(B)")]
    return Pair(max(free.values()), spans)


def lone(blocks_, direction: str) -> float:
    """A chunk with nothing to overlap with: its compute and its communication in sequence."""
    if direction not in ("F", "B", "W"):
        raise ValueError(f"direction={direction!r} is not allowed; allowed: 'F', 'B', 'W'")
    attr = {"F": "forward", "B": "backward", "W": "weights"}[direction]
    return sum(getattr(b, attr) for b in blocks_)


# ---------------------------------------------------------------- stages

def layer_list(cfg) -> list:
    """The blocks of the whole model in order: dense layers, MoE layers, the MTP module's MoE layer, the heads."""
    dense = cfg["first_k_dense_replace"]
    moe = cfg["num_hidden_layers"] - dense + cfg["num_nextn_predict_layers"]
    return ["dense"] * dense + ["moe"] * moe + ["heads"]


def stage_plan(cfg, pp: int, blk: dict, schedule: str = "dualpipe", max_blocks: int = 5) -> list:
    """Split the blocks into `pp` contiguous stages (the heads on the last) so that the busiest rank is as light as
    it can be. 1F1B: a rank holds one stage, costed as its lone F + B. DualPipe: rank r holds stages r and pp-1-r and
    runs their F&B pairs, costed as the compute of both plus the all-to-all of the MoE blocks that have no partner
    block to hide behind. DeepSeek does not publish its split; this is the best contiguous one (stages of at most
    `max_blocks` blocks), so the imbalance it leaves is a lower bound. Costs are taken relative to an MoE layer and
    rounded to 1%, so small changes of the inputs keep the split, as a real run keeps its configured one."""
    kinds = tuple(layer_list(cfg))
    if not isinstance(pp, int) or pp < 1 or pp > len(kinds):
        raise ValueError(f"pp={pp!r} is not allowed; allowed: 1..{len(kinds)} stages")
    # costs relative to an MoE layer's compute, to 1%: a split is a design choice, not re-made for every input
    unit = sum(blk["moe"].t(p) for p in COMPUTE_ORDER)
    if schedule == "dualpipe":
        if pp % 2:
            raise ValueError(f"pp={pp!r}: DualPipe needs an even number of stages")
        parts = tuple((k, round(sum(blk[k].t(p) for p in COMPUTE_ORDER) / unit, 2),
                       round(sum(blk[k].t(p) for p in COMM_ORDER) / 2 / unit, 2)) for k in kinds)
        cuts = _paired_cuts(parts, pp, max_blocks)
    else:
        cuts = _linear_cuts(tuple(round((blk[k].forward + blk[k].backward) / unit, 2) for k in kinds), pp)
    return [list(kinds[i:j]) for i, j in zip(cuts, cuts[1:])]


@lru_cache(maxsize=32)
def _linear_cuts(costs: tuple, pp: int) -> tuple:
    n = len(costs)
    prefix = [0.0]
    for v in costs:
        prefix.append(prefix[-1] + v)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(pp + 1)]
    cut = [[0] * (n + 1) for _ in range(pp + 1)]
    best[0][0] = 0.0
    for s in range(1, pp + 1):
        for j in range(s, n + 1):
            for i in range(s - 1, j):
                v = max(best[s - 1][i], prefix[j] - prefix[i])
                if v < best[s][j] - 1e-15:
                    best[s][j], cut[s][j] = v, i
    out, j = [n], n
    for s in range(pp, 0, -1):
        j = cut[s][j]
        out.append(j)
    return tuple(reversed(out))


@lru_cache(maxsize=32)
def _paired_cuts(parts: tuple, pp: int, max_blocks: int) -> tuple:
    """Cut points for DualPipe: ranks 0..pp/2-1 each take the next stage from the front and the next from the back;
    minimise the largest rank load. parts: (kind, compute seconds, one chunk's all-to-all seconds) per block."""
    n, half = len(parts), pp // 2
    comp, comm = [0.0], [0.0]
    for _, c, a in parts:
        comp.append(comp[-1] + c)
        comm.append(comm[-1] + a)

    def load(a0, a1, b0, b1):   # a chunk through [a0, a1) paired with one through [b0, b1): unpaired blocks expose
        na, nb = a1 - a0, b1 - b0
        extra = comm[a1] - comm[a0 + nb] if na > nb else (comm[b1] - comm[b0 + na] if nb > na else 0.0)
        return comp[a1] - comp[a0] + comp[b1] - comp[b0] + 2 * extra

    memo: dict = {}

    def g(r, i, j):   # ranks r.. with i blocks used from the front, j from the back
        key = (r, i, j)
        if key in memo:
            return memo[key]
        left = n - i - j
        res = (float("inf"), None)
        if r == half - 1:
            if 2 <= left <= 2 * max_blocks:
                k = i + (left + 1) // 2
                res = (load(i, k, k, n - j), None)
        else:
            for a in range(1, max_blocks + 1):
                for b in range(1, max_blocks + 1):
                    if left - a - b < 2 * (half - 1 - r):
                        break
                    here = load(i, i + a, n - j - b, n - j)
                    if here >= res[0]:
                        continue
                    v = max(here, g(r + 1, i + a, j + b)[0])
                    if v < res[0] - 1e-15:
                        res = (v, (a, b))
        memo[key] = res
        return res

    if g(0, 0, 0)[0] == float("inf"):
        raise ValueError(f"{n} blocks do not fit {pp} stages of at most {max_blocks} blocks")
    front, back, i, j = [0], [n], 0, 0
    for r in range(half - 1):
        a, b = g(r, i, j)[1]
        i, j = i + a, j + b
        front.append(i)
        back.append(n - j)
    front.append(i + (n - i - j + 1) // 2)   # the middle rank's two stages: halves of what is left
    return tuple(front + list(reversed(back)))


def rank_pairs(plan, blk: dict, schedule: str = "dualpipe") -> list:
    """Per rank: (lone F, lone B, W, F&B pair) seconds. DualPipe: rank r holds stages r and pp-1-r and pairs the
    forward of one with the backward of the other, both ways as often: the mean of its two stages and pairings."""
    pp = len(plan)
    out = []
    for r in range(pp):
        mine = [blk[k] for k in plan[r]]
        if schedule != "dualpipe":
            out.append((lone(mine, "F"), lone(mine, "B"), lone(mine, "W"), lone(mine, "F") + lone(mine, "B")))
            continue
        other = [blk[k] for k in plan[pp - 1 - r]]
        fb = (pair(mine, list(reversed(other))).step + pair(other, list(reversed(mine))).step) / 2
        out.append(tuple((lone(mine, d) + lone(other, d)) / 2 for d in ("F", "B", "W")) + (fb,))
    return out


def durations(rows, pp_send: float = 0.0) -> pipeline.Durations:
    """pipeline.Durations for the simulator (one set for every rank): the heaviest rank's, an upper bound on what
    unequal stages cost (the pipeline goes at the pace of its slowest rank)."""
    F, B, W, FB = (max(r[i] for r in rows) for i in range(4))
    return pipeline.Durations(F=F, B=B, W=W, FB=FB, comm=pp_send)


def trace_durations(prof, pp_send: float = 0.0, transfer_scale: float = 1.0) -> pipeline.Durations:
    """pipeline.Durations from DeepSeek's trace (seconds). F&B: its measured step. F, B: a lone chunk -- the
    compute phases of that direction plus its DeepEP transfer kernels (dispatch and combine; the notify kernels are
    left out: in the trace they spin while the overlapped peers catch up, which a lone chunk does not wait for),
    times `transfer_scale` (below 1: a lone chunk's transfers faster than the overlapped ones the trace timed).
    W: the weight-gradient phases."""
    from common.systems.v3 import trace as deepseek_trace
    ph = deepseek_trace.phases(prof)

    def busy(names):
        return sum(ph[p]["busy_ms"] for p in names if p in ph) / 1e3

    def transfer(names):
        return sum(ph[p]["classes"].get(c, 0.0) for p in names if p in ph
                   for c in ("deepep_dispatch", "deepep_combine")) / 1e3

    F = busy(("attn(F)", "mlp(F)")) + transfer_scale * transfer(("dispatch(F)", "combine(F)"))
    B = busy(("mlp(B)", "mlp(W)", "attn(B)", "attn(W)")) + transfer_scale * transfer(("dispatch(B)", "combine(B)"))
    W = busy(("mlp(W)", "attn(W)"))
    return pipeline.Durations(F=F, B=B, W=W, FB=deepseek_trace.step_ms(prof) / 1e3, comm=pp_send)


def scaled(d: pipeline.Durations, f: float, b: float, w: float, fb: float, comm=None) -> pipeline.Durations:
    return pipeline.Durations(F=d.F * f, B=d.B * b, W=d.W * w, FB=d.fb * fb, comm=d.comm if comm is None else comm)


@lru_cache(maxsize=256)
def makespan(schedule: str, pp: int, micro_batches: int, d: pipeline.Durations) -> pipeline.Result:
    """lab 08's simulator on `schedule` (cached: the same durations give the same result)."""
    return pipeline.run(schedule, pp, micro_batches, d)
