"""Benchmark: the local engine against transformers' `generate` on the tiny model (target >= 3x).

Both sample at temperature 1 (top_p 1, no top-k), from the same B random prompts of ~256 tokens,
exactly `--new` tokens each (no stop tokens), in one process, in `--repeats` interleaved rounds
(HF, pause, engine, pause), so the ratio is what to compare across runs on a shared, noisy
machine. HF takes the better of 1 and 2 torch threads, the engine runs on 1. Reported: wall
time, and process CPU time (every thread), which is less sensitive to being descheduled by other
processes. Also reported: the largest absolute difference between the engine's logprobs and a
plain forward pass's log-softmax at the sampled tokens (target < 1e-4 in fp32), over every
completion of the last engine run.

    .venv/bin/python benchmarks/bench_engine.py [--batches 16 64] [--prompt 256] [--new 128]

Measured 2026-11-29 on the shared 2-core machine (load average 2-4 from other processes), three
runs of the command above, best HF over best engine of 3 rounds each:
batch 16: HF ~0.61-0.73 s (~2,800-3,350 tok/s), engine ~0.28-0.33 s (~6,200-7,200 tok/s):
2.14x, 2.27x, 2.27x wall (2.17-2.38x CPU); batch 64: HF ~2.3-2.7 s, engine ~1.07-1.13 s
(~7,300-7,650 tok/s): 2.11x, 2.35x, 2.36x wall (2.09-2.37x CPU); single rounds ranged 1.5-3.2x.
Max logprob difference 9.5e-7. The engine this replaced measured, in one process with the new
one: batch 16 1.98x -> 2.25x, batch 64 1.56x -> 2.24x (wall).

The 3x target is not met, and cannot be with this design on this machine. Per decode step (CPU
time, engine worker): batch 16 ~1.3-1.6 ms, of which ~0.5-0.9 ms is SDPA reading the fp32 KV
cache (~10 MB per step), ~0.3 ms the matmuls and ~0.35 ms per-op overhead (the same step at
batch 1); batch 64 ~5.5 ms, of which ~4 ms is SDPA reading ~42 MB at ~10 GB/s, the memory
bandwidth this shared machine gives one core. At batch 64, 128 steps of that attention alone
(~0.5 s) plus the prefill (~0.23 s, 2.2x faster than HF's) already equal HF's time / 3; at
batch 16, reaching 3x would need the per-op overhead gone (a fused, compiled step; torch.compile
measured slower here, see `kwrl.engines.decoders`) and the cache to stay in L3.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import NamedTuple

import torch

TARGET_RATIO = 3.0
TARGET_LOGPROB_DIFF = 1e-4
SETTLE_S = 0.2
"""Pause between the HF and the engine runs, so that neither starts while the other's OpenMP
threads still spin."""


class Timing(NamedTuple):
    wall: float
    """Seconds of wall-clock time."""
    cpu: float
    """CPU seconds of the whole process (every thread): the work done, less sensitive than the
    wall time to being descheduled on a shared machine."""


def timed(run: object) -> tuple[Timing, object]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = run()  # type: ignore[operator]
    return Timing(time.perf_counter() - wall, time.process_time() - cpu), result


def build(vocab: int) -> tuple[torch.nn.Module, int]:
    from kwrl.models import build_model, build_tokenizer
    from kwrl.models.corpus import sample_corpus

    tokenizer = build_tokenizer(sample_corpus(n=400), vocab_size=vocab)
    return build_model(tokenizer), len(tokenizer)


def prompts_for(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(length * 3 // 4, length + 1, (batch,), generator=generator)
    return [torch.randint(9, vocab, (int(n),), generator=generator).tolist() for n in lengths]


def hf_generate(model: torch.nn.Module, prompts: list[list[int]], new: int) -> Timing:
    """`generate` sampling `new` tokens after each (left-padded) prompt, with 1 and with 2 torch
    threads (on 2 shared cores either can win): the better wall time and the better CPU time,
    so the baseline is the strongest one measured."""
    runs = [_hf_generate(model, prompts, new, threads) for threads in (1, 2)]
    torch.set_num_threads(1)
    time.sleep(SETTLE_S)
    return Timing(min(r.wall for r in runs), min(r.cpu for r in runs))


def _hf_generate(model: torch.nn.Module, prompts: list[list[int]], new: int, threads: int
                 ) -> Timing:
    torch.set_num_threads(threads)
    width = max(map(len, prompts))
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1

    def run() -> torch.Tensor:
        with torch.inference_mode():
            return model.generate(ids, attention_mask=mask, do_sample=True, temperature=1.0,
                                  top_p=1.0, top_k=0, max_new_tokens=new, min_new_tokens=new,
                                  eos_token_id=None, pad_token_id=0)

    timing, out = timed(run)
    assert out.shape[1] == width + new  # type: ignore[union-attr]
    return timing


def engine_generate(engine: object, prompts: list[list[int]], new: int) -> tuple[Timing, list]:
    from kwrl.engines import SamplingParams

    async def run() -> list:
        return await asyncio.gather(*(
            engine.generate(p, SamplingParams(max_tokens=new, seed=i))  # type: ignore[attr-defined]
            for i, p in enumerate(prompts)))

    timing, completions = timed(lambda: asyncio.run(run()))
    assert all(len(c.token_ids) == new for c in completions)  # type: ignore[union-attr]
    time.sleep(SETTLE_S)
    return timing, completions  # type: ignore[return-value]


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
            hf = hf_generate(model, prompts, args.new)
            prefill = engine.stats.prefill_seconds
            timing, completions = engine_generate(engine, prompts, args.new)
            prefill = engine.stats.prefill_seconds - prefill
            hf_all.append(hf)
            engine_all.append(timing)
            print(f"batch {batch:3d}: HF generate {tokens / hf.wall:6.0f} tok/s ({hf.wall:.2f} s, "
                  f"cpu {hf.cpu:.2f}) | engine {tokens / timing.wall:6.0f} tok/s ({timing.wall:.2f}"
                  f" s: prefill {prefill:.2f}; cpu {timing.cpu:.2f}) | ratio "
                  f"{hf.wall / timing.wall:4.2f}x, cpu {hf.cpu / timing.cpu:4.2f}x")
        wall = min(h.wall for h in hf_all) / min(e.wall for e in engine_all)
        cpu = min(h.cpu for h in hf_all) / min(e.cpu for e in engine_all)
        print(f"batch {batch:3d}: best HF / best engine: wall {wall:.2f}x, cpu {cpu:.2f}x "
              f"(target {TARGET_RATIO:.0f}x)")
    diff = max_logprob_diff(model, prompts, completions)
    print(f"max |engine logprob - forward log-softmax| over {len(completions)} completions: "
          f"{diff:.2e} (target < {TARGET_LOGPROB_DIFF:.0e})")
    print(f"engine stats: {engine.stats}")
    engine.close()


if __name__ == "__main__":
    main()
