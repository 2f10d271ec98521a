"""Benchmark: the local engine against transformers' `generate` on the tiny model (target >= 3x).

Both sample at temperature 1 (top_p 1, no top-k), from the same B random prompts of 3/4
`--prompt` to `--prompt` tokens, exactly `--new` tokens each (no stop tokens), in one process, in
`--repeats` interleaved rounds (HF, pause, engine, pause), so the ratio is what to compare across
runs on a shared, noisy machine. HF takes the better of 1 and 2 torch threads, the engine runs on
1. Reported: wall time, and process CPU time (every thread), which is less sensitive to being
descheduled by other processes. Also reported, per workload: the largest absolute difference
between the engine's logprobs and a plain forward pass's log-softmax at the sampled tokens
(target < 1e-4 in fp32), over every completion of the last engine run at the last batch size.

Workloads (`--group`): 1, B distinct prompts; G, GRPO's case: B / G distinct prompts, each
requested G times at once (HF gets the same B prompts, left-padded as always), which the engine's
static decoder serves with shared-prefix attention (`kwrl.engines.decoders`).

    .venv/bin/python benchmarks/bench_engine.py [--batches 16 64] [--prompt 256] [--new 128]
        [--group 1 8]

Measured 2026-11-29 on the shared 2-core machine, `--prompt 768 --new 128 --group 1 8`, three
runs, best HF over best engine of 3 rounds each (wall; CPU); run 4 after a refactor that
moved the prefix bookkeeping to `kwrl.engines.prefixes`, on an otherwise idle machine:

    workload          run 1          run 2          run 3          run 4
    batch 16, G=1     2.39x; 2.41x   1.71x; 2.48x   1.67x; 2.53x   1.64x; 2.36x
    batch 64, G=1     2.55x; 2.61x   1.61x; 2.41x   1.57x; 2.57x   1.47x; 2.33x
    batch 16, G=8     4.80x; 4.95x   3.79x; 5.39x   5.07x; 4.96x   3.54x; 5.21x
    batch 64, G=8     5.76x; 6.00x   3.99x; 6.34x   8.31x; 6.54x   4.02x; 6.25x

Another process loaded the second core during run 1 and the end of run 3 (load average 3-4); in run
2 and the start of run 3 it was mostly free, and HF's 2-thread run was its faster. Run 1 was of an
earlier revision of the decoder (before groups of one got their own call and the saved-share
threshold), the same computation for these workloads. Best engine time per run, G=8: batch 16
0.25-0.28 s (prefill ~0.02 s; ~7,300-8,100 tok/s), batch 64 0.91-0.95 s (prefill 0.09-0.12 s;
~8,600-9,000 tok/s), against HF's best 3.65-7.80 s at batch 64; G=1: batch 16 0.61-0.63 s (prefill
0.17-0.20 s), batch 64 2.21-2.37 s (prefill 0.70-0.80 s). Max logprob difference 9.5e-7 in both
workloads. The wall ratio swings with whether HF's 2-thread run gets both cores (on an idle machine
it does, while the engine uses one); the CPU ratio holds. Shared prefixes meet the 3x target for
GRPO's workload: the prefix is prefilled once instead of 8 times, and each step reads it once per
group. Distinct prompts take the engine's plain path and miss 3x: a decode step there is mostly
SDPA reading the fp32 KV cache, bound by the memory bandwidth the shared machine gives one core,
plus per-op overhead at small batches (see `kwrl.engines.decoders`; torch.compile measured slower).
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


def prompts_for(batch: int, length: int, vocab: int, seed: int, group: int = 1
                ) -> list[list[int]]:
    """`batch` random prompts of 3/4 `length` to `length` tokens: batch / group distinct ones,
    each repeated `group` times in a row (GRPO's samples of one prompt)."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(length * 3 // 4, length + 1, (batch // group,), generator=generator)
    distinct = [torch.randint(9, vocab, (int(n),), generator=generator).tolist() for n in lengths]
    return [prompt for prompt in distinct for _ in range(group)]


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
    parser.add_argument("--group", type=int, nargs="+", default=[1],
                        help="samples per distinct prompt (GRPO's G); each value is a workload")
    args = parser.parse_args()
    if any(batch % group for batch in args.batches for group in args.group):
        parser.error("every batch size must be a multiple of every --group")
    model, vocab = build(args.vocab)
    print(f"tiny Qwen3: vocab {vocab}, {sum(p.numel() for p in model.parameters()):,} params, "
          f"engine {args.threads} thread(s), prompts {args.prompt * 3 // 4}-{args.prompt} tokens, "
          f"{args.new} new tokens, temperature 1")
    engine = LocalEngine(model, max_batch=max(args.batches), num_threads=args.threads)
    warm = prompts_for(4, 32, vocab, seed=99)
    hf_generate(model, warm, 8)
    engine_generate(engine, warm, 8)
    for group in args.group:
        for batch in args.batches:
            prompts = prompts_for(batch, args.prompt, vocab, seed=batch, group=group)
            completions = compare(model, engine, prompts, args.new, args.repeats,
                                  f"batch {batch:3d}, group {group}")
        diff = max_logprob_diff(model, prompts, completions)
        print(f"group {group}: max |engine logprob - forward log-softmax| over {len(completions)} "
              f"completions: {diff:.2e} (target < {TARGET_LOGPROB_DIFF:.0e})")
    print(f"engine stats: {engine.stats}")
    engine.close()


def compare(model: torch.nn.Module, engine: object, prompts: list[list[int]], new: int,
            repeats: int, label: str) -> list:
    """`repeats` interleaved rounds of HF and the engine on `prompts`; prints each round and the
    best HF over the best engine; returns the last engine run's completions."""
    tokens = len(prompts) * new
    hf_all, engine_all = [], []
    for _ in range(repeats):
        hf = hf_generate(model, prompts, new)
        prefill = engine.stats.prefill_seconds  # type: ignore[attr-defined]
        timing, completions = engine_generate(engine, prompts, new)
        prefill = engine.stats.prefill_seconds - prefill  # type: ignore[attr-defined]
        hf_all.append(hf)
        engine_all.append(timing)
        print(f"{label}: HF generate {tokens / hf.wall:6.0f} tok/s ({hf.wall:.2f} s, "
              f"cpu {hf.cpu:.2f}) | engine {tokens / timing.wall:6.0f} tok/s ({timing.wall:.2f}"
              f" s: prefill {prefill:.2f}; cpu {timing.cpu:.2f}) | ratio "
              f"{hf.wall / timing.wall:4.2f}x, cpu {hf.cpu / timing.cpu:4.2f}x")
    wall = min(h.wall for h in hf_all) / min(e.wall for e in engine_all)
    cpu = min(h.cpu for h in hf_all) / min(e.cpu for e in engine_all)
    print(f"{label}: best HF / best engine: wall {wall:.2f}x, cpu {cpu:.2f}x "
          f"(target {TARGET_RATIO:.0f}x)")
    return completions


if __name__ == "__main__":
    main()
