"""Checkers for lab 14 (MLA and inference): KV bytes per token of a model config, absorbed MLA equal to the
decompressed form, a token's cache through a block table, the decode arithmetic intensity against batch, the cost
per million tokens from throughput and price; and three builds -- one step of a continuous-batching scheduler, the
paged MLA decode loop, a prefix cache (their scenarios and named wrong policies: `common.exercises.lab14_cases`).

Each checker starts with fixed, asymmetric cases (no two mistakes give the same number), then random cases from a
fresh seed that a failure prints."""
from __future__ import annotations

import contextlib
import copy

import torch

from common.core.checks import checker, expect, expect_close, fail, near
from common.exercises import lab14_cases as lc
from common.exercises.lab14_cases import mla_cases as mc
from common.exercises.lab14_cases import warmup_cases as wc
from common.exercises.lab14_cases.watch import call
from common.exercises.cases import as_number, fresh_cases, replayable
from common.facts import models
from common.kernels import mla, mla_decode
from common.systems.inference import kvcache, prefix_cache, scheduler, service

NUMBER = "one number (a float)"


# ---------------------------------------------------------------- 14.1

def _kv_configs(rng) -> list:
    v3, llama = models.load_model_config("deepseek_v3"), models.load_model_config("llama3_70b")
    kimi, mixtral = models.load_model_config("kimi_k2"), models.load_model_config("mixtral_8x7b")
    fixed = [(v3, 2, False), (llama, 2, False), (kimi, 1, False), (mixtral, 4, False)]
    layers = rng.randint(2, 90)
    rand = [(v3.replace(num_hidden_layers=rng.randint(4, 90), kv_lora_rank=rng.choice([128, 256, 384]),
                        qk_rope_head_dim=rng.choice([16, 32])), rng.choice([1, 2, 4]), True),
            (llama.replace(num_hidden_layers=layers, first_k_dense_replace=layers, num_attention_heads=48,
                           num_key_value_heads=rng.choice([2, 4, 6]), head_dim=rng.choice([64, 96])),
             rng.choice([1, 2, 4]), True)]
    return fixed + rand


@checker("14.1", "KV bytes per token of a model config")
@replayable
def check_kv_bytes_per_token(kv_bytes_per_token, cases):
    """kv_bytes_per_token(cfg, bytes_per_value) -> bytes one token adds to the KV cache of the whole model: MLA
    (cfg["attention"] == "mla") caches one latent plus one RoPE key per layer; GQA caches K and V of every KV head."""
    rows = []
    for cfg, b, is_random in _kv_configs(cases.rng):
        expected = mc.kv_reference(cfg, b)
        where = f"kv_bytes_per_token({cfg.name} config{' (changed)' if is_random else ''}, {b}){cases.tag(is_random)}"
        got = as_number(call(kv_bytes_per_token, (cfg, b), where,
                             (kvcache.mla_bytes_per_token, kvcache.kv_bytes_per_token)), where, NUMBER)
        rows.append((where, got, expected, mc.kv_mistakes(cfg, b, expected)))
    mc.name_number_mistake(rows, 1e-12)
    return "DeepSeek-V3: 576 values x 2 B x 61 layers = 70,272 B per token; Llama-3-70B (GQA, 8 KV heads): 327,680 B"


# ---------------------------------------------------------------- 14.2

def _mla_case(cases, is_random: bool):
    """A case whose shapes tell the per-head keys and values apart from every tensor of the absorbed form."""
    rng = cases.rng
    if is_random:
        while True:
            d = mla.MLADims(rng.randint(2, 6), rng.choice([16, 20, 40]), rng.choice([8, 12, 24]),
                            rng.choice([4, 6, 10]), rng.choice([8, 14, 20]))
            T, Q = rng.randint(5, 40), rng.randint(1, 3)
            if mc.mla_dims_ok(d, T, Q):
                return d, mla.random_case(d, T, Q, cases.gen)
    d = mla.MLADims(3, 20, 12, 6, 10)
    return d, mla.random_case(d, 9, 2, torch.Generator().manual_seed(14))


@checker("14.2", "absorbed MLA equals decompressed MLA")
@replayable
def check_absorbed_attention(absorbed_attention, cases):
    """absorbed_attention(q_nope, q_rope, latent, k_rope, w_uk, w_uv, scale) -> (Q, H, v_dim): MLA with W_uk folded
    into the query and W_uv applied after the attention, causal (query i at position T - Q + i), equal to the
    decompressed form within rounding."""
    for is_random in (False, True, True, True):
        d, c = _mla_case(cases, is_random)
        args = tuple(c[k].clone() for k in ("q_nope", "q_rope", "latent", "k_rope", "w_uk", "w_uv"))
        T, Q = c["latent"].shape[0], c["q_nope"].shape[0]
        where = (f"absorbed_attention(Q={Q}, H={d.heads}, T={T}, kv_lora={d.kv_lora}, nope={d.nope}, rope={d.rope}, "
                 f"v_dim={d.v_dim}, scale=1/sqrt({d.qk_dim})){cases.tag(is_random)}")
        guard = mc.per_head_guard(T, d)
        with guard:
            got = call(absorbed_attention, args + (d.scale,), where, (mla.absorbed, mla.mqa, mla.decompressed))
        expected = mla.decompressed(*[c[k] for k in ("q_nope", "q_rope", "latent", "k_rope", "w_uk", "w_uv")],
                                    scale=d.scale)
        if not isinstance(got, torch.Tensor):
            fail(f"{where} returned {type(got).__name__}; expected a tensor of shape {tuple(expected.shape)}")
        for a, k in zip(args, ("q_nope", "q_rope", "latent", "k_rope", "w_uk", "w_uv")):
            expect(torch.equal(a, c[k]), f"{where} changed its input {k}; leave the inputs as they are")
        if guard.seen:
            fail(mc.decompressed_verdict(where, guard.seen))
        if got.shape != expected.shape:
            fail(f"{where}: shape {tuple(got.shape)}, expected {tuple(expected.shape)} = (Q, H, v_dim): apply W_uv "
                 f"(H, kv_lora, v_dim) to the attention's latent output, head by head")
        mc.judge_absorbed(got, c, d, expected, where)
        # rounding is judged at the output's scale: float32 is fine (4e-7 off on an element of 2e-4 in an output of
        # max ~1 was once called wrong at atol 1e-7); every named mistake moves the output by percents
        expect_close(got.double(), expected, where, rtol=1e-5, atol=max(1e-7, 1e-5 * float(expected.abs().max())))
    return "equal to the decompressed form within rounding on 4 cases (1 fixed, 3 random, causal with 1-3 queries)"


# ---------------------------------------------------------------- 14.3

def _paged_case(gen, page, length, spare=3):
    """A cache whose top 4 blocks no table entry uses (so a misreading stays in bounds and can be named), and a
    table that maps no logical block to the physical block of the same number (a derangement): reading logical
    blocks never agrees with the table by chance, so each misreading has one name (a table with row[0] == 0 made
    blocks-of-64 and logical reads equal for the first 64 tokens)."""
    blocks = -(-length // page)
    kv = torch.randn(blocks + spare + 4, page, 6, generator=gen, dtype=torch.float64)
    while True:                            # about e draws on average
        row = torch.randperm(blocks + spare, generator=gen)
        if not bool((row == torch.arange(blocks + spare)).any()):
            return kv, row.to(torch.int32)


@checker("14.3", "a sequence's cache through its block table")
@replayable
def check_gather_paged(gather_paged, cases):
    """gather_paged(kv_cache, table_row, length) -> (length, width): the first `length` tokens of one sequence, in
    order, when logical block j of the sequence lives in physical block table_row[j] of kv_cache (num_blocks,
    block_size, width)."""
    rng = cases.rng
    fixed = [(16, 40, False), (32, 32, False), (64, 1, False), (16, 17, False), (32, 100, False)]
    rand = [(p, rng.randint(1, 5 * p), True) for p in (rng.choice([16, 32, 64]) for _ in range(3))]
    for page, length, is_random in fixed + rand:
        kv, row = _paged_case(cases.gen, page, length)
        expected = mla_decode.gather_sequence(kv, row[None], 0, length)
        where = f"gather_paged(kv_cache [{kv.shape[0]}, {page}, 6], table_row, length={length}){cases.tag(is_random)}"
        copy_ = kv.clone()
        got = call(gather_paged, (copy_, row.clone(), length), where, (mla_decode.gather_sequence,))
        if not isinstance(got, torch.Tensor):
            fail(f"{where} returned {type(got).__name__}; expected a tensor of shape {tuple(expected.shape)}")
        expect(torch.equal(copy_, kv), f"{where} changed kv_cache; leave the cache as it is")
        mc.judge_gather_shape(got, kv, row, length, expected, where)
        for wrong, why in mc.gather_misreadings(kv, row, length):
            if torch.equal(got, wrong) and not torch.equal(wrong, expected):
                fail(f"{where}: {why}")
        expect_close(got, expected, where, rtol=0, atol=0)
    return "token t of a sequence lives at kv_cache[table_row[t // block_size], t % block_size]"


# ---------------------------------------------------------------- 14.4

@checker("14.4", "decode arithmetic intensity against batch")
@replayable
def check_decode_intensity(decode_intensity, cases):
    """decode_intensity(batch, active_params, weight_bytes, context, kv_bytes_per_token, attn_flops_per_kv_token)
    -> FLOPs per HBM byte of one decode step of `batch` sequences: each new token through its active weights (2
    FLOPs per weight) and over its `context` cached tokens; the weights (`weight_bytes`, all of them) read once for
    the whole batch, each sequence's cache read once."""
    rng = cases.rng
    v3 = (37e9, 671e9, 4989, 70272, 2 * 128 * 1088 * 61)
    fixed = [(1,) + v3 + (False,), (64,) + v3 + (False,), (32, 70.6e9, 141.2e9, 2000, 327680, 2 * 64 * 256 * 80, False),
             (7, 3e9, 4.5e9, 300, 1000, 5000, False)]
    rand = []
    for _ in range(4):
        active = rng.uniform(1e9, 1e11)
        rand.append((rng.choice([1, 3, 16, 100]), active, active * rng.choice([0.5, 1, 2, 9]), rng.randint(100, 9000),
                     rng.uniform(1e4, 5e5), rng.uniform(1e4, 1e7), True))
    rows = []
    for B, A, W, T, kvb, af, is_random in fixed + rand:
        where = f"decode_intensity({B}, {A:.4g}, {W:.4g}, {T}, {kvb:.6g}, {af:.6g}){cases.tag(is_random)}"
        got = as_number(call(decode_intensity, (B, A, W, T, kvb, af), where), where, NUMBER)
        rows.append((where, got, mc.intensity_reference(B, A, W, T, kvb, af),
                     mc.intensity_mistakes(B, A, W, T, kvb, af)))
    mc.name_number_mistake(rows, 1e-9)
    return ("batch x (2 A + T a) / (W + batch x T kv): as the batch grows it levels off at (2 A + T a) / (T kv), "
            "453 FLOP/B for DeepSeek-V3 at 4,989 tokens")


# ---------------------------------------------------------------- 14.5

@checker("14.5", "cost per million tokens from throughput and price")
@replayable
def check_cost_per_m_tokens(cost_per_m_tokens, cases):
    """cost_per_m_tokens(tokens_per_s_per_node, usd_per_gpu_hour, gpus_per_node) -> US dollars per million tokens."""
    rng = cases.rng
    fixed = [(14800.0, 2.0, 8, False), (73700.0, 2.0, 8, False), (1000.0, 3.5, 4, False)]
    rand = [(rng.uniform(100, 1e5), rng.uniform(0.5, 10), rng.choice([1, 2, 4, 8, 72]), True) for _ in range(4)]
    for tps, usd, g, is_random in fixed + rand:
        expected = service.cost_per_m_tokens(tps, usd, g)
        where = f"cost_per_m_tokens({tps:.6g}, {usd:.6g}, {g}){cases.tag(is_random)}"
        got = as_number(call(cost_per_m_tokens, (tps, usd, g), where, (service.cost_per_m_tokens,)), where,
                        NUMBER)
        mistakes = [(expected / g, "prices one GPU for the node's throughput (or multiplies tokens_per_s_per_node by "
                                   "the GPU count, as if it were per GPU): the node's tokens cost gpus_per_node x "
                                   "usd_per_gpu_hour"),
                    (expected * 3600, "takes the price per GPU-second; it is per GPU-hour (divide by 3600)"),
                    (expected / 3600, "divides by 3600 twice (or counts tokens per hour twice)"),
                    (expected / 1000, "is per thousand tokens; the question asks per million"),
                    (expected / 1e6, "is per token; multiply by a million")]
        for value, why in mistakes:
            if near(got, value) and not near(got, expected):
                fail(f"{where} = {got:.6g}: that {why} (expected {expected:.6g})")
        expect(got > 0, f"{where} = {got:.6g}: a cost is positive")
        expect_close(got, expected, where, rtol=1e-9, atol=0.0)
    return (f"$2/GPU-hour, 8 GPUs: {service.cost_per_m_tokens(14800, 2, 8):.3f} $/M output tokens at the reported "
            f"14.8K per node")


# ---------------------------------------------------------------- 14.6

@checker("14.6", "one step of a continuous-batching scheduler")
@replayable
def check_schedule_step(schedule_step, cases):
    """schedule_step(running, waiting, free_blocks, block_size, max_batch) -> (running, waiting, finished,
    free_blocks): finish, grow (preempting the newest when the pool is dry), admit first come first served, advance
    -- the policy of `common.systems.inference.scheduler`, judged on fixed states, random ones and a whole trace."""
    states = lc.scheduler_states(cases.rng)
    for state, is_random, label in states:
        where = label + lc.describe_state(*state) + cases.tag(is_random)
        got = call(schedule_step, copy.deepcopy(state), where, (scheduler.schedule_step, scheduler.Scheduler.step),
                   ("common.systems.inference.scheduler.Seq",))
        got = lc.step_result(got, where)
        expected = scheduler.canonical(scheduler.Scheduler().step(*copy.deepcopy(state)))
        if got != expected:
            lc.name_scheduler_mistake(state, got, where)
            fail(f"{where}: expected {lc.describe_result(expected)}; got {lc.describe_result(got)}")
    return (f"the same step as the reference on {len(lc.scheduler_scenarios())} fixed states, 30 random ones and "
            f"every step of a 30-request trace through a pool of 24 blocks")


# ---------------------------------------------------------------- 14.7

@checker("14.7", "the paged MLA decode loop")
@replayable
def check_paged_mla_decode(paged_mla_decode, cases):
    """paged_mla_decode(q_nope, q_rope, kv_cache, block_table, seq_lens, w_uk, w_uv, scale) -> (B, S, H, v_dim):
    absorbed MLA over a paged latent cache, block by block through the block table, causal across the S new tokens
    (token s of sequence b at position seq_lens[b] - S + s), equal to `mla_decode.paged_mla` within rounding."""
    refs = (mla_decode.paged_mla, mla_decode.paged_reference, mla_decode.paged_attention, mla_decode.gather_sequence,
            mla_decode.mla_decode, mla.absorbed, mla.mqa_attention, mla.decompressed)
    all_cases = lc.decode_cases(cases)
    for c, is_random, label in all_cases:
        B, S, H, nope = c["q_nope"].shape
        where = (f"paged_mla_decode({label}: B={B}, S={S}, H={H}, kv_lora={c['w_uk'].shape[2]}, rope="
                 f"{c['q_rope'].shape[3]}, page={c['kv_cache'].shape[1]}, seq_lens={c['seq_lens'].tolist()}, "
                 f"scale={c['scale']:.4g}){cases.tag(is_random)}")
        args = tuple(c[k].clone() if isinstance(c[k], torch.Tensor) else c[k] for k in lc.DECODE_ARGS)
        guard = mc.decode_guard(c)
        with guard or contextlib.nullcontext():
            got = call(paged_mla_decode, args, where, refs)
        expected = mla_decode.paged_mla(*[c[k] for k in lc.DECODE_ARGS])
        if not isinstance(got, torch.Tensor):
            fail(f"{where} returned {type(got).__name__}; expected a tensor of shape {tuple(expected.shape)}")
        for a, k in zip(args, lc.DECODE_ARGS):
            expect(not isinstance(a, torch.Tensor) or torch.equal(a, c[k]),
                   f"{where} changed its input {k}; leave the inputs as they are")
        if guard is not None and guard.seen:
            fail(mc.decompressed_verdict(where, guard.seen))
        if got.shape == expected.shape[:3] + (c["w_uk"].shape[2],):
            fail(f"{where}: shape {tuple(got.shape)} is the latent output: apply W_uv (H, kv_lora, v_dim) head by "
                 f"head after the attention")
        if got.shape != expected.shape:
            fail(f"{where}: shape {tuple(got.shape)}, expected {tuple(expected.shape)} = (B, S, H, v_dim)")
        got = got.double()
        if not bool(torch.isfinite(got).all()):
            fail(f"{where}: your output has NaN or inf -- exp of a raw score overflows (the scores here reach the "
                 f"thousands): subtract the running max before exp, and rescale by exp(m_old - m_new)")
        if not torch.allclose(got, expected, rtol=1e-5, atol=1e-6 * float(expected.abs().max())):
            lc.name_decode_mistake(c, got, where)
        expect_close(got, expected, where, rtol=1e-5, atol=1e-6 * float(expected.abs().max()))
    return (f"equal to the float64 reference on {len(all_cases)} cases: MTP's 2 tokens, a one-token sequence, V3's "
            f"widths with its YaRN scale, scores in the thousands, 3 random ones")


# ---------------------------------------------------------------- 14.8

def _prefix_call(refs):
    """learner_call for the prefix cache's two functions, with their results checked for shape."""
    def one(fn, args, i, op):
        where = f"op {i + 1}, {lc.describe_op(op, args[0].block_size)}"
        got = call(fn, args, where, refs, ("common.systems.inference.prefix_cache.CacheState",))
        state = got[0] if op[0] == "alloc" and isinstance(got, (tuple, list)) and len(got) == 3 else got
        if op[0] == "alloc" and not (isinstance(got, (tuple, list)) and len(got) == 3):
            fail(f"{where} returned {type(got).__name__}; expected (state, blocks, hit_tokens)")
        if not isinstance(state, prefix_cache.CacheState):
            fail(f"{where}: the state returned is {type(state).__name__}; return the CacheState you were given")
        if op[0] == "alloc":
            n = -(-len(op[2]) // state.block_size)
            if not isinstance(got[1], (list, tuple)) or len(got[1]) != n:
                fail(f"{where}: blocks = {got[1]!r:.80}; expected a list of {n} block ids (one per "
                     f"{state.block_size} tokens, the last one partial)")
            as_number(got[2], f"{where}: hit_tokens", "a whole number of tokens", integer=True)
        return got
    return one


@checker("14.8", "a prefix cache")
def check_prefix_cache(allocate, release, seed=None):
    """allocate(state, tokens) -> (state, blocks, hit_tokens) and release(state, blocks) -> state: automatic prefix
    caching over a pool of blocks -- full blocks named by (parent's name, tokens), reference counts, least recently
    used eviction of unreferenced blocks, no partial block shared (`common.systems.inference.prefix_cache`)."""
    refs = (prefix_cache.allocate, prefix_cache.release, prefix_cache.PrefixCachePolicy.allocate,
            prefix_cache.PrefixCachePolicy.release)
    with fresh_cases(seed, replay=True) as cases:
        scripts = lc.prefix_scripts(cases.rng)
        for k, (num_blocks, bs, ops, label) in enumerate(scripts):
            tag = f"{label}, {num_blocks} blocks of {bs} tokens{cases.tag(k > 0)}"
            ref = lc.mistake_trajectory(prefix_cache.PrefixCachePolicy, num_blocks, bs, ops)
            seen = []
            for i, got in enumerate(lc.prefix_trajectory(allocate, release, num_blocks, bs, ops, _prefix_call(refs))):
                seen.append(got)
                if got == ref[i]:
                    continue
                where = f"{tag}: op {i + 1}, {lc.describe_op(ops[i], bs)}"
                for cls, why in lc.PREFIX_MISTAKES:
                    if lc.mistake_trajectory(cls, num_blocks, bs, ops)[:i + 1] == seen:
                        fail(f"{where}: your cache {why}")
                if len(got) == 4 and len(set(got[0])) != len(got[0]):
                    fail(f"{where}: blocks {list(got[0])} holds a block twice")
                fail(f"{where}: expected {lc.describe_seen(ref[i])}; got {lc.describe_seen(got)}")
    return (f"the same blocks, hits, free queue and references as the reference after every call, on "
            f"{len(scripts)} request sequences (one scripted, {len(scripts) - 1} random chats through small pools)")


# ---------------------------------------------------------------- warm-ups: 14.9, 14.10 (for 14.6), 14.11 (for 14.7),
# 14.12, 14.13 (for 14.8); their cases and named wrong answers: lab14_cases.warmup_cases

@checker("14.9", "blocks a running request needs for its next token")
@replayable
def check_blocks_to_grow(blocks_to_grow, cases):
    """blocks_to_grow(tokens, block_size) -> 0 or 1: the new blocks a running request that holds `tokens` tokens in
    ceil(tokens / block_size) blocks needs before this step writes its next token."""
    n = wc.judge_all(blocks_to_grow, wc.grow_cases(cases.rng), wc.grow_right, wc.GROW_MISTAKES, wc.describe_grow,
                     wc.read_whole)
    return f"right on {n} requests, at and around block boundaries"


@checker("14.10", "can the front of the queue be admitted?")
@replayable
def check_can_admit(can_admit, cases):
    """can_admit(tokens, running, free_blocks, block_size, max_batch) -> bool: a waiting request of `tokens` tokens
    may join the batch now (it will compute its next token this step)."""
    n = wc.judge_all(can_admit, wc.admit_cases(cases.rng), wc.admit_right, wc.ADMIT_MISTAKES, wc.describe_admit,
                     wc.read_bool)
    return f"right on {n} requests, full batches and pools that are just big enough included"


@checker("14.11", "where the new tokens sit: the causal mask of a decode step")
@replayable
def check_new_token_mask(new_token_mask, cases):
    """new_token_mask(seq_len, s_q, positions) -> bool (s_q, len(positions)): True where new token s (of the s_q
    this step decodes, all counted in seq_len) may attend the cached token at that position."""
    n = wc.judge_all(new_token_mask, wc.mask_cases(cases.rng), wc.mask_right, wc.MASK_MISTAKES, wc.describe_mask,
                     wc.read_mask, (mla.causal_keep,))
    return f"right on {n} blocks (1-3 new tokens, blocks past the sequence's end)"


@checker("14.12", "the names of a request's full blocks")
@replayable
def check_block_names(block_names, cases):
    """block_names(tokens, block_size) -> [name of each full block]: name = hash((parent's name, tuple(block))),
    the first block's parent None; the partial last block gets no name."""
    all_cases = wc.name_cases(cases.rng)
    for tokens, bs in all_cases:
        where = wc.describe_names(tokens, bs)
        given = list(tokens)
        names = call(block_names, (given, bs), where, (prefix_cache.PrefixCachePolicy.name,))
        expect(given == tokens, f"{where} changed the token list it was given; leave it as it is")
        wc.check_names(names, tokens, bs, where)
    wc.first_name_consistent(block_names, wc.describe_names, 4, cases.rng)
    return f"chained names on {len(all_cases)} token lists: each full block named after its parent, none for a " \
           f"partial block"


@checker("14.13", "how many prompt tokens the cache serves")
@replayable
def check_hit_tokens(hit_tokens, cases):
    """hit_tokens(names, cached, n_tokens, block_size) -> tokens served from the cache: the leading full blocks whose
    names are cached, among those within the first n_tokens - 1 tokens."""
    n = wc.judge_all(hit_tokens, wc.hit_cases(cases.rng), wc.hit_right, wc.HIT_MISTAKES, wc.describe_hit,
                     wc.read_whole)
    return f"right on {n} requests, with gaps in the cache and prompts that end on a block boundary"
