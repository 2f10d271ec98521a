"""The tiny Qwen3: built from nothing, saved and loaded like any Hugging Face checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from kwrl.models import build_model, build_tokenizer, init_model, load_model, parameter_count
from kwrl.models.corpus import sample_corpus
from kwrl.models.tiny import MANIFEST

NON_EMBEDDING = 2 * (4 * 128 * 128 + 3 * 128 * 512 + 2 * 128 + 2 * 32) + 128
"""Per layer: q, k, v, o; gate, up, down; two RMSNorms of 128, q/k norms of 32. Plus final norm."""


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerFast:
    return build_tokenizer(sample_corpus(), vocab_size=512)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model(tmp_path_factory.mktemp("tiny") / "model", texts=sample_corpus(),
                      vocab_size=512, seed=3)


def test_the_model_has_the_recipe_shape_with_tied_embeddings(tok: PreTrainedTokenizerFast) -> None:
    model = build_model(tok)
    config = model.config
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
            config.head_dim, config.vocab_size) == (128, 2, 4, 32, 512)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert parameter_count(model) == 512 * 128 + NON_EMBEDDING
    assert model.dtype == torch.float32
    assert config.eos_token_id == [2, 0] and config.pad_token_id == 0
    assert model.generation_config.eos_token_id == [2, 0]


def test_weights_depend_on_the_seed_alone_and_leave_the_global_rng_alone(
    tok: PreTrainedTokenizerFast,
) -> None:
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a, b, c = build_model(tok, seed=0), build_model(tok, seed=0), build_model(tok, seed=1)
    assert torch.rand(1) == expected_next
    state_a, state_b, state_c = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)
    assert not torch.equal(state_a["model.layers.0.mlp.up_proj.weight"],
                           state_c["model.layers.0.mlp.up_proj.weight"])


def test_a_saved_checkpoint_loads_through_the_auto_classes(
    checkpoint: Path, tok: PreTrainedTokenizerFast
) -> None:
    assert {p.name for p in checkpoint.iterdir()} >= {
        "model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
        "tokenizer_config.json", "chat_template.jinja", MANIFEST}
    tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, local_files_only=True)
    assert model.config.model_type == "qwen3" and model.config.tie_word_embeddings
    assert tokenizer.chat_template == tok.chat_template
    built = build_model(tokenizer, seed=3)
    loaded, fresh = model.state_dict(), built.state_dict()
    assert loaded.keys() == fresh.keys()
    assert all(torch.equal(loaded[k], fresh[k]) for k in loaded)
    manifest = json.loads((checkpoint / MANIFEST).read_text())
    assert manifest["vocab_size"] == 512 and manifest["parameters"] == parameter_count(model)


def test_two_builds_from_the_same_inputs_are_byte_identical(checkpoint: Path, tmp_path: Path
                                                            ) -> None:
    again = init_model(tmp_path / "again", texts=sample_corpus(), vocab_size=512, seed=3)
    for path in checkpoint.iterdir():
        assert (again / path.name).read_bytes() == path.read_bytes(), path.name


def test_init_refuses_a_non_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError):
        init_model(tmp_path, texts=["a"])


def test_load_model_gives_an_fp32_eval_model_on_cpu_that_generates(checkpoint: Path) -> None:
    model, tokenizer = load_model(checkpoint, device="cpu")
    assert model.dtype == torch.float32 and not model.training
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Revenue?"}],
                                           add_generation_prompt=True, return_dict=False)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=5, do_sample=False)
        logits = model(torch.tensor([prompt])).logits
    assert out.shape[1] > len(prompt) and logits.shape == (1, len(prompt), 512)


def test_load_model_refuses_a_directory_without_a_model(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_model(tmp_path)


@pytest.mark.slow
def test_the_default_build_from_generated_worlds_has_the_recipe_size(tmp_path: Path) -> None:
    # Build time is reported by `kwrl model init` (5-12 s here), never asserted in a test.
    model, tokenizer = load_model(init_model(tmp_path / "model"), device="cpu")
    assert len(tokenizer) == 1024 and parameter_count(model) == 1024 * 128 + NON_EMBEDDING
