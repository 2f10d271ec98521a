"""Next-token sampling, and the logprob of each sampled token under the distribution drawn from.

The order is vLLM's (and Hugging Face's): logits -> / temperature -> top-p filter -> softmax ->
sample. The reported logprob is the log-softmax of the temperature-scaled, top-p-filtered
logits at the sampled token, i.e. vLLM's `--logprobs-mode processed_logprobs`: that is the
probability the token was actually drawn with, which is what importance weights in RL need. With
temperature 1 and top_p 1 it is exactly the model's own log-softmax.

Top-p keeps the smallest set of most likely tokens whose mass is at least `top_p` (vLLM's rule:
drop every token whose cumulative mass, counted from the least likely, is <= 1 - top_p; the most
likely token always stays). Temperature below `GREEDY_TEMPERATURE` means greedy decoding; its
logprobs are computed as at temperature 1 (as vLLM does for greedy requests).

Randomness is per request and cheap: a request draws its `max_tokens` uniforms up front from its
own `torch.Generator` (on the CPU, so the draw is the same on any device), and step t samples by
inverse CDF with the t-th one. A request's tokens thus depend on its seed, prompt and weights
only, never on which other requests share the batch. (An exponential race, as vLLM samples,
needs a vocabulary of random numbers per row per step: on this CPU that cost more than the
model's decode step itself at batch 64.)
"""

from __future__ import annotations

import torch

GREEDY_TEMPERATURE = 1e-5
"""Temperatures below this decode greedily (vLLM's `_SAMPLING_EPS`)."""


def top_p_filter(logits_B_V: torch.Tensor, top_p_B: torch.Tensor) -> torch.Tensor:
    """`logits_B_V` with the tokens outside each row's top-p nucleus set to -inf.

    Rows with top_p >= 1 come back unchanged (not even zero-probability tokens are touched), so a
    batch that mixes filtered and unfiltered requests gives the unfiltered ones exact logprobs.
    """
    sorted_B_V, order_B_V = logits_B_V.sort(dim=-1, descending=False)
    cumulative_B_V = sorted_B_V.softmax(dim=-1).cumsum(dim=-1)
    drop_B_V = cumulative_B_V <= (1.0 - top_p_B).unsqueeze(1)
    drop_B_V[:, -1] = False  # the most likely token always stays
    drop_B_V &= (top_p_B < 1.0).unsqueeze(1)
    sorted_B_V = sorted_B_V.masked_fill(drop_B_V, float("-inf"))
    return torch.empty_like(logits_B_V).scatter_(-1, order_B_V, sorted_B_V)


def processed_logprobs(
    logits_B_V: torch.Tensor,
    temperature_B: torch.Tensor,
    top_p_B: torch.Tensor,
    *,
    scale: bool = True,
    filter_top_p: bool = True,
) -> torch.Tensor:
    """Log-probabilities (fp32) of the distribution each row samples from.

    `scale` / `filter_top_p` let a caller that knows every row has temperature 1 / top_p 1 skip
    the work; the result is the same either way.
    """
    logits_B_V = logits_B_V.float()
    if scale:
        greedy_B = temperature_B < GREEDY_TEMPERATURE
        divisor_B = torch.where(greedy_B, torch.ones_like(temperature_B), temperature_B)
        logits_B_V = logits_B_V / divisor_B.unsqueeze(1)
    if filter_top_p:
        logits_B_V = top_p_filter(logits_B_V, top_p_B)
    return torch.log_softmax(logits_B_V, dim=-1)


def request_uniforms(seed: int, n: int) -> torch.Tensor:
    """The n uniforms in [0, 1) (float64) that a request with this seed samples its tokens with."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    return torch.rand(n, generator=generator, dtype=torch.float64)


def sample(
    logprobs_B_V: torch.Tensor, uniform_B: torch.Tensor, greedy_B: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(token_B, logprob_B): one token per row and its logprob under `logprobs_B_V`.

    Inverse-CDF sampling: the first token whose cumulative probability (summed in float64, in
    vocabulary order) exceeds u * total. A token of probability zero (filtered by top-p) is never
    chosen, since its cumulative probability equals its predecessor's. Greedy rows take the
    argmax. (The probabilities themselves are exponentiated in fp32, as precise as the logprobs
    they come from and half the cost of a float64 exp at batch 64.)
    """
    cdf_B_V = logprobs_B_V.exp().double().cumsum(dim=-1)
    target_B_1 = (uniform_B.to(cdf_B_V) * cdf_B_V[:, -1]).unsqueeze(1)
    token_B = torch.searchsorted(cdf_B_V, target_B_1, right=True).squeeze(1)
    token_B = token_B.clamp_(max=logprobs_B_V.shape[1] - 1)
    if greedy_B is not None:
        token_B = torch.where(greedy_B, logprobs_B_V.argmax(dim=-1), token_B)
    logprob_B = logprobs_B_V.gather(1, token_B.unsqueeze(1)).squeeze(1)
    return token_B, logprob_B
