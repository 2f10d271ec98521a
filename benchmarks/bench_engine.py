"""Benchmark: the local engine against transformers' `generate` on the tiny model (target >= 3x).

Both sample at temperature 1 (top_p 1, no top-k), from the same B random prompts of ~256 tokens,
exactly `--new` tokens each (no stop tokens), in one process, so the ratio is what to compare
across runs on a shared, noisy machine. Also reported: the largest absolute difference between
the engine's logprobs and a plain forward pass's log-softmax at the sampled tokens (target < 1e-4
in fp32), over every completion of the last engine run.

    .venv/bin/python benchmarks/bench_engine.py [--batches 16 64] [--prompt 256] [--new 128]

Measured 2026-11-29 on the shared 2-core machine (another process busy on one core), engine on 1
thread, HF best of 1 and 2: batch 16 ~4,000-5,100 tok/s vs ~2,700-3,100 (1.3-1.7x); batch 64
~4,000-8,300 vs ~3,200-3,900 (1.2-2.2x); max logprob difference 9.5e-7. The 3x target is not met:
prefill (the same work for both) is ~25-35% of the engine's time, and at batch 64 a decode step
is bound by reading the fp32 KV cache (~25 MB per layer per step).
"""

from __future__ import annotations

import argparse
import asyncio
import time

import torch

TARGET_RATIO = 3.0
TARGET_LOGPROB_DIFF = 1e-4


def build(vocab: int) -> tuple[torch.nn.Module, int]:
    from kwrl.models import build_model, build_tokenizer
    from kwrl.models.corpus import sample_corpus

    tokenizer = build_tokenizer(sample_corpus(n=400), vocab_size=vocab)
    return build_model(tokenizer), len(tokenizer)


def prompts_for(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(length * 3 // 4, length + 1, (batch,), generator=generator)
    return [torch.randint(9, vocab, (int(n),), generator=generator).tolist() for n in lengths]


def hf_generate(model: torch.nn.Module, prompts: list[list[int]], new: int) -> float:
    """Seconds for `generate` to sample `new` tokens after each (left-padded) prompt: the best
    of 1 and 2 torch threads (on 2 shared cores either can win), so the baseline is the
    strongest one measured."""
    return min(_hf_generate(model, prompts, new, threads) for threads in (1, 2))


def _hf_generate(model: torch.nn.Module, prompts: list[list[int]], new: int, threads: int
                 ) -> float:
    torch.set_num_threads(threads)
    width = max(map(len, prompts))
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, do_sample=True, temperature=1.0,
                             top_p=1.0, top_k=0, max_new_tokens=new, min_new_tokens=new,
                             eos_token_id=None, pad_token_id=0)
    elapsed = time.perf_counter() - started
    assert out.shape[1] == width + new
    return elapsed


def engine_generate(engine: object, prompts: list[list[int]], new: int) -> tuple[float, list]:
    from kwrl.engines import SamplingParams

    async def run() -> list:
        return await asyncio.gather(*(
            engine.generate(p, SamplingParams(max_tokens=new, seed=i))  # type: ignore[attr-defined]
            for i, p in enumerate(prompts)))

    started = time.perf_counter()
    completions = asyncio.run(run())
    elapsed = time.perf_counter() - started
    assert all(len(c.token_ids) == new for c in completions)
    return elapsed, completions


def max_logprob_diff(model: torch.nn.Module, prompts: list[list[int]], completions: list) -> float:
    worst = 0.0
    with torch.inference_mode():
        for prompt, completion in zip(prompts, completions, strict=True):
            ids = torch.tensor([prompt + list(completion.token_ids)])
            logprobs = model(ids).logits[0].float().log_softmax(-1)
            positions = torch.arange(len(prompt) - 1, ids.shape[1] - 1)
            reference = logprobs[positions, torch.tensor(completion.token_ids)]
            worst = max(worst, (reference - torch.tensor(completion.logprobs)).abs().max().item())
    return worst


def main() -> None:
    from kwrl.engines.local import LocalEngine

    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=1, help="engine worker threads")
    parser.add_argument("--repeats", type=int, default=3,
                        help="rounds of (HF, engine) per batch size, interleaved")
    args = parser.parse_args()
    model, vocab = build(args.vocab)
    print(f"tiny Qwen3: vocab {vocab}, {sum(p.numel() for p in model.parameters()):,} params, "
          f"engine {args.threads} thread(s), prompts {args.prompt * 3 // 4}-{args.prompt} tokens, "
          f"{args.new} new tokens, temperature 1")
    engine = LocalEngine(model, max_batch=max(args.batches), num_threads=args.threads)
    warm = prompts_for(4, 32, vocab, seed=99)
    hf_generate(model, warm, 8)
    engine_generate(engine, warm, 8)
    for batch in args.batches:
        prompts = prompts_for(batch, args.prompt, vocab, seed=batch)
        tokens = batch * args.new
        hf_all, engine_all = [], []
        for _ in range(args.repeats):
            hf_s = hf_generate(model, prompts, args.new)
            prefill = engine.stats.prefill_seconds
            engine_s, completions = engine_generate(engine, prompts, args.new)
            # (busy_seconds is updated after the results are delivered: use the wall time)
            prefill = engine.stats.prefill_seconds - prefill
            hf_all.append(hf_s)
            engine_all.append(engine_s)
            print(f"batch {batch:3d}: HF generate {tokens / hf_s:6.0f} tok/s ({hf_s:.2f} s) | "
                  f"engine {tokens / engine_s:6.0f} tok/s ({engine_s:.2f} s: prefill "
                  f"{prefill:.2f}, decode {engine_s - prefill:.2f}) | ratio {hf_s / engine_s:5.2f}x")
        ratios = sorted(h / e for h, e in zip(hf_all, engine_all, strict=True))
        print(f"batch {batch:3d}: best HF {min(hf_all):.2f} s / best engine {min(engine_all):.2f} s"
              f" = {min(hf_all) / min(engine_all):.2f}x, median ratio {ratios[len(ratios) // 2]:.2f}x"
              f" (target {TARGET_RATIO:.0f}x)")
    diff = max_logprob_diff(model, prompts, completions)
    print(f"max |engine logprob - forward log-softmax| over {len(completions)} completions: "
          f"{diff:.2e} (target < {TARGET_LOGPROB_DIFF:.0e})")
    print(f"engine stats: {engine.stats}")
    engine.close()


if __name__ == "__main__":
    main()
