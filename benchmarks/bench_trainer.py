"""Benchmark: the Trainer's step against a bare PyTorch loop on the same model and batch.

The baseline is the smallest honest policy-gradient step: one padded forward, fp32 log-softmax,
gather, -(A * lp) token mean, backward, grad-norm clip, AdamW step. The Trainer does the same
work plus packing, full-batch reduction weights, the DPPO trust region and its metrics
(entropy included). Both run on copies of one model, alternately, in one process, and each
reports its best step time (the one least disturbed by other work on a shared machine; medians
are printed too), so the ratio is what to compare across runs (target: Trainer overhead
<= 15%). Also reported: achieved FLOP/s of each as a fraction of this CPU's matmul peak,
measured in the same run as the best of square fp32 matmuls.

FLOPs per step count matmuls only, forward + backward = 3x forward: 6 x (linear weights + the
output head) per token, plus 12 x layers x T x (heads x head_dim) per token for attention's
two T x T products (counted in full, although causal attention could skip half).

    .venv/bin/python benchmarks/bench_trainer.py [--large] [--batch 16] [--length 256] [--reps 4]
                                                 [--threads N]

Default: the repo's tiny shape (build_model defaults: hidden 128, 2 layers); `--large`: hidden
256, 4 layers, 8 heads of 32.

Measured 2026-11-29 on the shared 2-core machine (load average 3-5: other work on both cores, so
single steps vary 2x and more; only same-run ratios mean anything), batch 16 x 256, fp32:
tiny: bare 3,000-5,300 tok/s; Trainer with one micro-batch -5% to +13% (target <= 15% met),
with four micro-batches +22% to +44%; 23-56% of a measured 45-59 GFLOP/s matmul peak.
--large (4.4M params): bare ~1,300 tok/s at 66% of peak, Trainer -14% (noise), four
micro-batches +50%: smaller matmuls run further from peak on this CPU.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

TARGET_OVERHEAD = 0.15


def build(vocab: int, large: bool) -> torch.nn.Module:
    from kwrl.models import build_model, build_tokenizer
    from kwrl.models.corpus import sample_corpus

    tokenizer = build_tokenizer(sample_corpus(n=400), vocab_size=vocab)
    if large:
        return build_model(tokenizer, hidden=256, layers=4, heads=8, head_dim=32,
                           intermediate=1024)
    return build_model(tokenizer)


def make_batch(batch: int, length: int, vocab: int) -> list:
    """`batch` tapes of `length` tokens: a quarter prompt (mask 0), the rest sampled."""
    from kwrl.train.trainer import PolicySample

    generator = torch.Generator().manual_seed(0)
    prompt = length // 4
    samples = []
    for i in range(batch):
        ids = torch.randint(9, vocab, (length,), generator=generator).tolist()
        mask = (0,) * prompt + (1,) * (length - prompt)
        advantage = 1.0 if i % 2 else -1.0
        samples.append(PolicySample(tuple(ids), mask, (0.0,) * length, advantage, group=i // 4))
    return samples


def with_rollout_logprobs(trainer: object, samples: list) -> list:
    from kwrl.train.trainer import PolicySample

    out = []
    for s, lps in zip(samples, trainer.logprobs(samples), strict=True):  # type: ignore[attr-defined]
        rollout = tuple(lp if m else 0.0 for lp, m in zip(lps, s.loss_mask, strict=True))
        out.append(PolicySample(s.token_ids, s.loss_mask, rollout, s.advantage, s.group))
    return out


class BareLoop:
    """The baseline: one padded forward/backward of the whole batch and an AdamW step."""

    def __init__(self, model: torch.nn.Module, samples: list, lr: float) -> None:
        self.model = model.train()
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95))
        self.ids_BT = torch.tensor([s.token_ids for s in samples])
        self.mask_BT = torch.tensor([s.loss_mask for s in samples], dtype=torch.float32)
        self.adv_BT = torch.tensor([s.advantage for s in samples])[:, None] * self.mask_BT

    def step(self) -> float:
        logits_BTV = self.model(input_ids=self.ids_BT).logits
        logp_BTV = torch.log_softmax(logits_BTV[:, :-1].float(), dim=-1)
        lp_BT = logp_BTV.gather(-1, self.ids_BT[:, 1:, None]).squeeze(-1)
        loss = -(self.adv_BT[:, 1:] * lp_BT).sum() / self.mask_BT.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.item()


def step_flops(model: torch.nn.Module, tokens: int, length: int) -> float:
    config = model.config
    linear = sum(m.weight.numel() for name, m in model.named_modules()
                 if isinstance(m, torch.nn.Linear) and name != "lm_head")
    head = config.vocab_size * config.hidden_size
    attention = 2 * config.num_hidden_layers * length * config.num_attention_heads * config.head_dim
    return 6.0 * tokens * (linear + head + attention)


def matmul_peak(n: int = 1024, reps: int = 10) -> float:
    """Best fp32 FLOP/s of an n x n matmul on this CPU with torch's current thread count."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    best = float("inf")
    for _ in range(reps):
        started = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - started)
    return 2.0 * n**3 / best


def timed(fn: object) -> float:
    started = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - started


def main() -> None:
    from kwrl.train.trainer import Trainer, TrainerConfig

    parser = argparse.ArgumentParser()
    parser.add_argument("--large", action="store_true", help="hidden 256, 4 layers")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    model = build(args.vocab, args.large)
    tokens = args.batch * args.length
    samples = make_batch(args.batch, args.length, model.config.vocab_size)
    one_batch = Trainer(copy.deepcopy(model), TrainerConfig(micro_batch_tokens=tokens, lr=1e-5))
    samples = with_rollout_logprobs(one_batch, samples)
    four = Trainer(copy.deepcopy(model), TrainerConfig(micro_batch_tokens=tokens // 4, lr=1e-5))
    bare = BareLoop(copy.deepcopy(model), samples, lr=1e-5)
    runs = {"bare loop": bare.step,
            "Trainer, 1 micro-batch": lambda: one_batch.train_step(samples),
            "Trainer, 4 micro-batches": lambda: four.train_step(samples)}
    for fn in runs.values():
        fn()  # warm-up
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.reps):
        for name, fn in runs.items():
            seconds[name].append(timed(fn))
    peak = matmul_peak()
    flops = step_flops(model, tokens, args.length)
    params = sum(p.numel() for p in model.parameters())
    print(f"Qwen3 hidden {model.config.hidden_size}, {model.config.num_hidden_layers} layers, "
          f"vocab {model.config.vocab_size}, {params:,} params; batch {args.batch} x "
          f"{args.length} tokens; {torch.get_num_threads()} threads; best of {args.reps}")
    print(f"matmul peak (best 1024^3 fp32 mm): {peak / 1e9:.1f} GFLOP/s; "
          f"step = {flops / 1e9:.2f} GFLOP")
    base = min(seconds["bare loop"])
    for name, times in seconds.items():
        best = min(times)
        print(f"{name:26s} {tokens / best:6.0f} tok/s  {best:6.3f} s/step (median "
              f"{statistics.median(times):6.3f})  overhead {best / base - 1:+6.1%}  "
              f"{flops / best / 1e9:5.1f} GFLOP/s = {flops / best / peak:5.1%} of peak")
    overhead = min(seconds["Trainer, 1 micro-batch"]) / base - 1
    verdict = "met" if overhead <= TARGET_OVERHEAD else "NOT met"
    print(f"Trainer overhead {overhead:+.1%} (target <= {TARGET_OVERHEAD:.0%}): {verdict}")


if __name__ == "__main__":
    main()
