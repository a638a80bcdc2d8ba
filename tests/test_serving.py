"""common.systems.inference.serving: the tiny MLA model decodes exactly what a full prefill computes, batching never changes a
request's tokens, and continuous batching beats static batching."""
import pytest
import torch

from common.systems.inference import serving

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model():
    return serving.TinyMLA(serving.TinyConfig(vocab=128, hidden=64, layers=2, heads=4, kv_lora=32, nope=16, rope=16,
                                              v_dim=16, ffn=128), seed=0)


def test_decode_over_the_paged_cache_equals_a_full_prefill(model):
    toks = torch.randint(0, 128, (45,), generator=torch.Generator().manual_seed(1))
    cache = model.new_cache(8, block_size=16)
    _, rows = model.prefill(toks[:30])
    cache.add(0)
    cache.append(0, rows)
    for i in range(30, 45):                  # crosses a block boundary at 32
        got = model.decode(toks[i:i + 1], cache, [0])[0]
        ref, ref_rows = model.prefill(toks[:i + 1])
        assert float((got - ref).abs().max()) < 1e-4 * float(ref.abs().max())
    for layer in range(2):
        assert torch.allclose(cache.gather(0, layer), ref_rows[layer], atol=1e-5)


def test_batching_does_not_change_tokens(model):
    reqs = serving.random_requests(6, 128, prompt_range=(3, 40), new_range=(1, 9), seed=2)
    one = serving.serve(model, reqs, 1)
    assert one.tokens() == serving.serve(model, reqs, 4).tokens() == serving.serve(model, reqs, 3, "static").tokens()
    assert [len(one.tokens()[r.rid]) for r in reqs] == [r.max_new for r in reqs]
    assert one.decode_tokens == sum(r.max_new - 1 for r in reqs) and one.prefill_tokens == sum(r.prompt.numel()
                                                                                               for r in reqs)


def test_continuous_batching_needs_fewer_steps_than_static(model):
    reqs = serving.random_requests(12, 128, prompt_range=(4, 12), new_range=(2, 20), seed=3)
    cont, static = serving.serve(model, reqs, 4), serving.serve(model, reqs, 4, "static")
    assert cont.steps < static.steps and cont.mean_batch > static.mean_batch
    assert cont.mean_batch <= 4 and 0 < cont.per_user_tokens_per_s and cont.mean_latency_s > 0


def test_serve_and_step_errors(model):
    reqs = serving.random_requests(2, 128, seed=4)
    with pytest.raises(ValueError, match=r"policy='fifo' is not allowed"):
        serving.serve(model, reqs, 2, "fifo")
    with pytest.raises(ValueError, match=r"max_batch=0 must be an integer >= 1"):
        serving.serve(model, reqs, 0)
    with pytest.raises(ValueError, match=r"cannot hold the longest request"):
        serving.serve(model, reqs, 2, num_blocks=1)
    with pytest.raises(ValueError, match=r"a prompt of 0 tokens is not allowed"):
        model.prefill(torch.zeros(0, dtype=torch.long))


def test_decode_step_timing_leaves_the_cache_as_it_was(model):
    t = serving.decode_step_seconds(model, 3, 20, min_run_time=0.01)
    assert t.median_s > 0 and len(t.times) >= 3


def test_batch_speedup_is_a_median_over_interleaved_repeats(model):
    r = serving.batch_speedup(model, batch=4, context=16, blocks=3, per_block=2)
    assert r["batch"] == 4 and len(r["ratios"]) == 3 and r["low"] <= r["speedup"] <= r["high"]
    assert r["step_s_batch_1"] > 0 and r["step_s_batch"] > 0
    with pytest.raises(ValueError, match=r"batch=1 must be an integer >= 2"):
        serving.batch_speedup(model, batch=1)
