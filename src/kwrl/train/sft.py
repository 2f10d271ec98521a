"""Supervised fine-tuning on token tapes: loss on the policy's own tokens only.

A demonstration is a tape like any rollout's (`token_ids`, `loss_mask`): produced by running the
real harness loop with an engine that replays the oracle's turns, so what the model is fine-tuned
on is byte for byte the format it later samples in. The loss is the mean cross-entropy over
mask-1 tokens (the assistant's turns, stop tokens included); prompts, tool results and nudges are
context only.

Two additions teach the tiny model to copy (see `kwrl.train.augment`): `copy_augment` redraws
the figures an answer copies from a tool result each time a tape is drawn, so they can only be
copied, never memorised; and `drill_steps` first trains on answer drills (the question, the last
call and result, the answer), short tapes on which the retrieval circuit forms, before training on
whole tapes.

The defaults are the recipe that made a 0.66M-parameter model learn to copy values in minutes on
this CPU (FACTS.md): AdamW lr 3e-3, betas (0.9, 0.95), weight decay 0.1, a short linear warm-up
then cosine decay, batches of 16 tapes.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

import torch

from kwrl.train.augment import CopyAugment, answer_drill

IGNORE = -100
"""Label of a position that does not train (the HF convention)."""


@dataclass(frozen=True)
class SftExample:
    token_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    """1 where the token was (or would be) sampled by the policy."""

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.loss_mask):
            raise ValueError("token_ids and loss_mask differ in length")


@dataclass(frozen=True)
class SftConfig:
    steps: int = 200
    batch_size: int = 16
    lr: float = 3e-3
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.1
    warmup_steps: int = 10
    grad_clip: float = 1.0
    max_len: int = 4096
    """Longer tapes are cut (from the end) to this many tokens."""
    seed: int = 0
    lm_weight: float = 0.0
    """Weight of an extra next-token loss on *every* token (prompt, tool results too). Tool
    results echo the path and query of the call before them and hold the values the answer
    copies, so this adds copy supervision the assistant tokens alone do not give."""
    copy_augment: float = 0.0
    """Probability that a drawn tape's copied answer figures are redrawn (`CopyAugment`). Below 1,
    the rest keep the world's own values, so priors such as valid days and times survive."""
    drill_steps: int = 0
    """Steps on answer drills before the `steps` on whole tapes (their own warm-up, constant lr).
    A drill's copied figures are always redrawn: drills exist to teach the copy."""
    drill_batch_size: int = 32


def batches(examples: Sequence[SftExample], batch_size: int, pad_id: int, max_len: int,
            rng: random.Random, augment: CopyAugment | None = None
            ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Endless shuffled batches: (input_ids [B, T], attention_mask [B, T], labels [B, T]),
    right-padded; labels are the token where the mask is 1, IGNORE elsewhere. `augment`
    rewrites each tape as it is drawn."""
    if not examples:
        raise ValueError("no examples to train on")
    order: list[int] = []
    while True:
        if len(order) < batch_size:
            fresh = list(range(len(examples)))
            rng.shuffle(fresh)
            order.extend(fresh)
        chosen = [examples[i] for i in order[:batch_size]]
        if augment is not None:
            chosen = [SftExample(augment(e.token_ids, e.loss_mask, rng), e.loss_mask)
                      for e in chosen]
        del order[:batch_size]
        yield _collate(chosen, pad_id, max_len)


def _collate(chosen: Sequence[SftExample], pad_id: int, max_len: int
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = min(max_len, max(len(e.token_ids) for e in chosen))
    ids_BT = torch.full((len(chosen), width), pad_id, dtype=torch.long)
    attention_BT = torch.zeros((len(chosen), width), dtype=torch.long)
    labels_BT = torch.full((len(chosen), width), IGNORE, dtype=torch.long)
    for row, example in enumerate(chosen):
        ids = torch.tensor(example.token_ids[:width], dtype=torch.long)
        mask = torch.tensor(example.loss_mask[:width], dtype=torch.bool)
        ids_BT[row, : len(ids)] = ids
        attention_BT[row, : len(ids)] = 1
        labels_BT[row, : len(ids)] = torch.where(mask, ids, IGNORE)
    return ids_BT, attention_BT, labels_BT


def masked_loss(model: torch.nn.Module, ids_BT: torch.Tensor, attention_BT: torch.Tensor,
                labels_BT: torch.Tensor, lm_weight: float = 0.0) -> torch.Tensor:
    """Mean next-token cross-entropy over positions whose label is not IGNORE, plus
    `lm_weight` x the mean over every non-padding position."""
    logits_BTV = model(input_ids=ids_BT, attention_mask=attention_BT).logits
    # Position t predicts token t+1.
    logits = logits_BTV[:, :-1].reshape(-1, logits_BTV.shape[-1]).float()
    targets = labels_BT[:, 1:].reshape(-1)
    loss = torch.nn.functional.cross_entropy(logits, targets, ignore_index=IGNORE)
    if lm_weight:
        every = torch.where(attention_BT[:, 1:].bool(), ids_BT[:, 1:], IGNORE).reshape(-1)
        loss = loss + lm_weight * torch.nn.functional.cross_entropy(logits, every,
                                                                    ignore_index=IGNORE)
    return loss


def lr_at(step: int, config: SftConfig) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def train_sft(model: torch.nn.Module, examples: Sequence[SftExample], config: SftConfig,
              pad_id: int, on_step: Callable[[int, float], None] | None = None, *,
              augment: CopyAugment | None = None, turn_start_id: int | None = None
              ) -> list[float]:
    """Fine-tune `model` in place for `config.drill_steps` steps on answer drills (cut from
    `examples` at `turn_start_id`), then `config.steps` on whole tapes; return every step's loss.

    `augment` (needed for drills or `config.copy_augment`) redraws copied figures: in every
    drill, and in a tape with probability `config.copy_augment`.
    """
    if (config.copy_augment or config.drill_steps) and augment is None:
        raise ValueError("copy_augment and drill_steps need a CopyAugment (the digit ids)")
    torch.manual_seed(config.seed)
    rng = random.Random(config.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=config.betas,
                                  weight_decay=config.weight_decay)
    model.train()
    losses: list[float] = []
    drill_steps = config.drill_steps
    if drill_steps:
        if turn_start_id is None:
            raise ValueError("drill_steps needs turn_start_id (the <|im_start|> token)")
        drills = [SftExample(*d) for e in examples
                  if (d := answer_drill(e.token_ids, e.loss_mask, turn_start_id))]
        if not drills:
            raise ValueError("no demonstration has a tool call before its answer: no drills")
        drill_stream = batches(drills, config.drill_batch_size, pad_id, config.max_len, rng,
                               replace(augment, p=1.0))
    augment = replace(augment, p=config.copy_augment) if config.copy_augment else None
    stream = batches(examples, config.batch_size, pad_id, config.max_len, rng, augment)
    for step in range(drill_steps + config.steps):
        drilling = step < drill_steps
        for group in optimizer.param_groups:
            group["lr"] = (config.lr * min(1.0, (step + 1) / config.warmup_steps) if drilling
                           else lr_at(step - drill_steps, config))
        if drilling:
            loss = masked_loss(model, *next(drill_stream))
        else:
            loss = masked_loss(model, *next(stream), lm_weight=config.lm_weight)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        losses.append(loss.item())
        if on_step is not None:
            on_step(step, losses[-1])
    model.eval()
    return losses
