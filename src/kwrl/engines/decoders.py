"""Batched, KV-cached forward passes for the local engine: prompts in, next-token logits out.

A `BatchDecoder` runs one batch of prompts: `start` prefills them (left-padded, with attention
masks and each row's own position ids, so padding changes neither positions nor attention) and
returns the logits for each row's first new token; `step` feeds one token per row and returns the
next logits; `keep` drops finished rows so the batch shrinks as sequences end.

Two implementations:

- `StaticQwen3Decoder`: Qwen3's forward written out over the model's own weight tensors, with a
  KV cache preallocated once per batch. On the tiny model a decode step is a few dozen small
  tensor ops, so Python and allocation overhead dominate: calling the HF modules with a
  `DynamicCache` measured ~3 ms per step at batch 16 and ~20 ms at batch 64 (the cache is
  re-grown by concatenation every step), this ~1-2 ms and ~4-6 ms (at batch 64 reading the fp32
  cache, ~25 MB per layer at 350 positions, bounds it). Numerically it is the same computation as
  `Qwen3ForCausalLM.forward` (RMSNorm in fp32, q/k norms before RoPE, SDPA); tests hold it to
  the plain forward pass's log-softmax.
- `HFDecoder`: any `AutoModelForCausalLM` through its own forward and `DynamicCache`; slower,
  but it works for every architecture transformers supports.

`make_decoder` picks the static decoder when the model is a plain Qwen3 (default RoPE, no sliding
window), the HF one otherwise.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedModel


class BatchDecoder(Protocol):
    """One batch at a time: prefill, then one token per row per step."""

    def start(self, prompts: list[list[int]], max_new_tokens: int) -> torch.Tensor:
        """Prefill `prompts`; logits_B_V (fp32) for the first new token of each row."""
        ...

    def step(self, token_B: torch.Tensor) -> torch.Tensor:
        """Append one token per current row; logits_B_V for the next one."""
        ...

    def keep(self, rows_B: torch.Tensor) -> None:
        """Keep only these rows (indices into the current batch), in this order."""
        ...

    def refresh(self) -> None:
        """Re-read the model's weights (after they were updated in place)."""
        ...


def left_pad(prompts: list[list[int]], pad_id: int, device: torch.device
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids_B_P, valid_B_P, position_B_P): prompts right-aligned, pads marked invalid, and each
    row's positions counted from its first real token (pads get position 0)."""
    lengths = [len(p) for p in prompts]
    width = max(lengths)
    ids_B_P = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids_B_P[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
    pad_B = torch.tensor([width - n for n in lengths], dtype=torch.long)
    column_P = torch.arange(width, dtype=torch.long)
    valid_B_P = column_P.unsqueeze(0) >= pad_B.unsqueeze(1)
    position_B_P = (column_P.unsqueeze(0) - pad_B.unsqueeze(1)).clamp(min=0)
    return ids_B_P.to(device), valid_B_P.to(device), position_B_P.to(device)


def supports_static(model: PreTrainedModel) -> bool:
    """Whether `StaticQwen3Decoder` computes exactly what this model's forward computes."""
    config = model.config
    rope = getattr(config, "rope_parameters", None) or {"rope_type": "default"}
    layer_types = getattr(config, "layer_types", None) or []
    return (
        config.model_type == "qwen3"
        and rope.get("rope_type", "default") == "default"
        and not getattr(config, "attention_bias", False)
        and not getattr(config, "use_sliding_window", False)
        and all(t == "full_attention" for t in layer_types)
        and config.hidden_act == "silu"
    )


def make_decoder(model: PreTrainedModel) -> BatchDecoder:
    return StaticQwen3Decoder(model) if supports_static(model) else HFDecoder(model)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """Qwen3RMSNorm: normalise in fp32, scale in the input dtype (one fused op in fp32)."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    x32 = x.float()
    x32 = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return x32 if weight is None else weight * x32


class StaticQwen3Decoder:
    """Qwen3's forward over a preallocated KV cache (see the module docstring for why).

    Written for few tensor ops per step, since their count sets the speed of a small model:
    q/k/v and gate/up are one matmul each, q and k are normed and rotated together, RoPE's
    cos/sin come from a table, and the attention mask is an additive float buffer shared by all
    layers (updated in place, one column per step).
    """

    def __init__(self, model: PreTrainedModel) -> None:
        if not supports_static(model):
            raise ValueError(f"{type(model).__name__} is not a plain Qwen3; use HFDecoder")
        config = model.config
        self.model = model
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim or config.hidden_size // config.num_attention_heads
        self.eps = config.rms_norm_eps
        self.pad_id = config.pad_token_id if isinstance(config.pad_token_id, int) else 0
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        theta = (config.rope_parameters or {}).get("rope_theta", 10_000.0)
        exponent = torch.arange(0, self.head_dim, 2, dtype=torch.float) / self.head_dim
        self.inv_freq = (1.0 / (theta ** exponent)).to(self.device)
        self._rope_table(config.max_position_embeddings)
        self.refresh()

    def refresh(self) -> None:
        """Gather the weights, fusing q/k/v and gate/up into one matrix each (fewer ops)."""
        inner = self.model.model
        self.embed = inner.embed_tokens.weight
        self.final_norm = inner.norm.weight
        self.lm_head = self.model.lm_head.weight
        self.layers = []
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qk_norm = torch.cat([attn.q_norm.weight.expand(self.heads, -1),
                                 attn.k_norm.weight.expand(self.kv_heads, -1)])
            self.layers.append((
                layer.input_layernorm.weight,
                torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).detach(),
                qk_norm.detach(), attn.o_proj.weight, layer.post_attention_layernorm.weight,
                torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).detach(),
                mlp.down_proj.weight,
            ))  # fmt: skip

    def _rope_table(self, positions: int) -> None:
        """cos and signed sin per position, as HF computes them (fp32 angles, then dtype).

        rotate_half(x) * sin == roll(x, D/2) * [-sin, sin] because both halves of sin are equal.
        """
        freqs = torch.arange(positions, device=self.device).float().unsqueeze(1) * self.inv_freq
        self.cos_table = torch.cat((freqs, freqs), dim=-1).cos().to(self.dtype)
        self.sin_table = torch.cat((-freqs.sin(), freqs.sin()), dim=-1).to(self.dtype)

    def start(self, prompts: list[list[int]], max_new_tokens: int) -> torch.Tensor:
        ids_B_P, valid_B_P, position_B_P = left_pad(prompts, self.pad_id, self.device)
        batch, width = ids_B_P.shape
        total = width + max_new_tokens
        if total > self.cos_table.shape[0]:
            self._rope_table(2 * total)
        shape = (len(self.layers), batch, self.kv_heads, total, self.head_dim)
        self.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.bias_B_T = torch.full((batch, total), float("-inf"), dtype=self.dtype,
                                   device=self.device)
        self.bias_B_T[:, :width].masked_fill_(valid_B_P, 0.0)
        self.next_position_B = position_B_P[:, -1] + 1
        self.column = width
        # Causal over real keys; a pad query may see itself, so no softmax row is all -inf.
        causal_P_P = torch.ones((width, width), dtype=torch.bool, device=self.device).tril()
        diagonal_P_P = torch.eye(width, dtype=torch.bool, device=self.device)
        allowed = (causal_P_P & (valid_B_P.unsqueeze(1) | diagonal_P_P)).unsqueeze(1)
        bias_B_1_P_P = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
        bias_B_1_P_P.masked_fill_(~allowed, float("-inf"))
        return self._forward(ids_B_P, position_B_P, bias_B_1_P_P, 0)

    def step(self, token_B: torch.Tensor) -> torch.Tensor:
        column = self.column
        self.bias_B_T[:, column] = 0.0
        logits = self._forward(token_B.unsqueeze(1), self.next_position_B.unsqueeze(1),
                               self.bias_B_T[:, None, None, : column + 1], column)
        self.column += 1
        self.next_position_B += 1
        return logits

    def keep(self, rows_B: torch.Tensor) -> None:
        rows_B = rows_B.to(self.device)
        self.k_cache = self.k_cache.index_select(1, rows_B)
        self.v_cache = self.v_cache.index_select(1, rows_B)
        self.bias_B_T = self.bias_B_T.index_select(0, rows_B)
        self.next_position_B = self.next_position_B.index_select(0, rows_B)

    def _forward(self, ids_B_S: torch.Tensor, position_B_S: torch.Tensor, bias: torch.Tensor,
                 column: int) -> torch.Tensor:
        """S new tokens per row, written at cache columns [column, column + S); the logits of
        the last one (fp32)."""
        batch, span = ids_B_S.shape
        end = column + span
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        cos_B_S_1_D = self.cos_table[position_B_S].unsqueeze(2)
        sin_B_S_1_D = self.sin_table[position_B_S].unsqueeze(2)
        x = F.embedding(ids_B_S, self.embed)
        for i, (norm1, qkv_w, qk_norm, o_w, norm2, gate_up_w, down_w) in enumerate(self.layers):
            qkv = F.linear(_rms_norm(x, norm1, self.eps), qkv_w).view(
                batch, span, heads + 2 * kv_heads, dim)
            qk = _rms_norm(qkv[:, :, : heads + kv_heads], None, self.eps) * qk_norm
            qk = qk * cos_B_S_1_D + qk.roll(dim // 2, dims=-1) * sin_B_S_1_D
            self.k_cache[i, :, :, column:end] = qk[:, :, heads:].transpose(1, 2)
            self.v_cache[i, :, :, column:end] = qkv[:, :, heads + kv_heads:].transpose(1, 2)
            attn = F.scaled_dot_product_attention(
                qk[:, :, :heads].transpose(1, 2), self.k_cache[i, :, :, :end],
                self.v_cache[i, :, :, :end], attn_mask=bias, enable_gqa=heads != kv_heads,
            )
            x = x + F.linear(attn.transpose(1, 2).reshape(batch, span, heads * dim), o_w)
            gate, up = F.linear(_rms_norm(x, norm2, self.eps), gate_up_w).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, down_w)
        return F.linear(_rms_norm(x[:, -1], self.final_norm, self.eps), self.lm_head).float()


class HFDecoder:
    """Any HF causal LM through its own forward and `DynamicCache` (the portable path)."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        pad = model.config.pad_token_id
        self.pad_id = pad if isinstance(pad, int) else 0
        self.device = next(model.parameters()).device

    def refresh(self) -> None:
        """Nothing cached outside the model."""

    def start(self, prompts: list[list[int]], max_new_tokens: int) -> torch.Tensor:
        ids_B_P, valid_B_P, position_B_P = left_pad(prompts, self.pad_id, self.device)
        self.cache = DynamicCache(config=self.model.config)
        self.mask_B_T = valid_B_P.long()
        self.next_position_B = position_B_P[:, -1] + 1
        out = self.model(input_ids=ids_B_P, attention_mask=self.mask_B_T,
                         position_ids=position_B_P, cache=self.cache, use_cache=True,
                         logits_to_keep=1)
        return out.logits[:, -1].float()

    def step(self, token_B: torch.Tensor) -> torch.Tensor:
        ones_B_1 = torch.ones_like(self.mask_B_T[:, :1])
        self.mask_B_T = torch.cat([self.mask_B_T, ones_B_1], dim=1)
        out = self.model(input_ids=token_B.unsqueeze(1), attention_mask=self.mask_B_T,
                         position_ids=self.next_position_B.unsqueeze(1), cache=self.cache,
                         use_cache=True, logits_to_keep=1)
        self.next_position_B = self.next_position_B + 1
        return out.logits[:, -1].float()

    def keep(self, rows_B: torch.Tensor) -> None:
        rows_B = rows_B.to(self.device)
        self.cache.batch_select_indices(rows_B)
        self.mask_B_T = self.mask_B_T.index_select(0, rows_B)
        self.next_position_B = self.next_position_B.index_select(0, rows_B)
