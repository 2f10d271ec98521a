"""Run configs: TOML files, dotted overrides, validation that names the bad key, a dry-run view."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from rich.console import Console

from kwrl.harness.loop import NUDGE_TEXT
from kwrl.harness.prompt import LOOKUP_MCP_TOOLS, SMALL_MCP_TOOLS
from kwrl.rl import ADVANTAGES, LOSSES, off_policy_correction
from kwrl.train.config import (
    ConfigError,
    RunConfig,
    describe,
    dump_config,
    flatten,
    load_config,
    loads_config,
)

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
CONFIG_FILES = sorted(CONFIGS.glob("*.toml"))


def error_of(text: str = "", overrides: tuple[str, ...] = ()) -> str:
    with pytest.raises(ConfigError) as caught:
        loads_config(text, overrides)
    return str(caught.value)


# --- the shipped configs -----------------------------------------------------------------------


def test_the_three_shipped_configs_exist() -> None:
    names = {p.name for p in CONFIG_FILES}
    assert {"quickstart.toml", "overfit.toml", "gpu-qwen3-lora.toml"} <= names


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.name)
def test_every_shipped_config_loads_and_round_trips_through_toml(path: Path) -> None:
    cfg = load_config(path)
    text = dump_config(cfg)
    assert loads_config(text) == cfg
    assert dump_config(loads_config(text)) == text


def test_the_quickstart_trains_with_the_recipe_algorithm() -> None:
    cfg = load_config(CONFIGS / "quickstart.toml")
    algo = cfg.algorithm
    assert (algo.loss, algo.reduction, algo.advantage) == ("dppo_binary_tv", "prompt_mean", "grpo")
    assert algo.resolved_loss_kwargs() == {"delta_lo": 0.15, "delta_hi": 0.15}
    assert algo.advantage_kwargs() == {"norm_by_std": False}
    assert cfg.harness.nudge.enabled and cfg.harness.nudge.at == 0.8
    assert cfg.eval.before and cfg.eval.after and not cfg.eval.nudge
    assert cfg.model.build.kind == "tiny_sft" and cfg.model.device == "cpu"
    assert cfg.model.dtype == "float32"
    assert cfg.data.train.dir != cfg.data.test.dir


def test_the_overfit_config_trains_on_the_same_32_tasks_until_reward_0_9() -> None:
    cfg = load_config(CONFIGS / "overfit.toml")
    assert cfg.data.train.max_tasks == 32 and cfg.data.tasks_per_step == 32
    assert cfg.data.max_resample == 0
    assert cfg.run.target_reward == 0.9
    assert cfg.run.steps >= 50


def test_the_gpu_config_runs_a_user_supplied_qwen3_with_lora_in_bf16() -> None:
    cfg = load_config(CONFIGS / "gpu-qwen3-lora.toml")
    assert "Qwen3" in str(cfg.model.path)
    assert cfg.model.build.kind == "never"
    assert (cfg.model.dtype, cfg.model.device) == ("bfloat16", "cuda")
    assert 16 <= cfg.optim.lora_rank <= 64
    assert cfg.harness.tools == "small"
    assert cfg.harness.max_turns > RunConfig().harness.max_turns
    assert cfg.harness.turn_token_cap > RunConfig().harness.turn_token_cap


def test_a_user_supplied_model_path_overrides_the_placeholder() -> None:
    cfg = load_config(CONFIGS / "gpu-qwen3-lora.toml", ["model.path=/models/Qwen3-1.7B"])
    assert cfg.model.path == Path("/models/Qwen3-1.7B")


# --- defaults ----------------------------------------------------------------------------------


def test_the_defaults_are_the_recipe_and_round_trip() -> None:
    cfg = load_config(None)
    assert cfg == RunConfig()
    assert cfg.algorithm.loss == "dppo_binary_tv" and cfg.algorithm.reduction == "prompt_mean"
    assert cfg.algorithm.advantage == "grpo" and not cfg.algorithm.normalize_std
    assert cfg.algorithm.kl_coef == 0.0 and not cfg.algorithm.correction.enabled
    assert cfg.optim.betas == (0.9, 0.98)
    assert loads_config(dump_config(cfg)) == cfg


def test_fields_left_unset_in_a_file_keep_their_defaults() -> None:
    cfg = loads_config("[optim]\nlr = 3e-4\n")
    assert cfg.optim.lr == 3e-4
    assert cfg.optim.grad_clip == RunConfig().optim.grad_clip
    assert cfg.harness == RunConfig().harness


# --- overrides ---------------------------------------------------------------------------------


def test_overrides_are_read_as_toml_values_or_else_as_strings() -> None:
    cfg = loads_config("", [
        "optim.lr=1e-4",
        "harness.tools=lookup",
        "algorithm.loss_kwargs.delta_hi=0.2",
        "data.tiers=[2, 1]",
        "run.resume=true",
        "harness.context_window=2048",
        "run.out=runs/x y",
    ])
    assert cfg.optim.lr == 1e-4 and isinstance(cfg.optim.lr, float)
    assert cfg.harness.tools == "lookup"
    assert cfg.algorithm.loss_kwargs == {"delta_hi": 0.2}
    assert cfg.algorithm.resolved_loss_kwargs() == {"delta_lo": 0.15, "delta_hi": 0.2}
    assert cfg.data.tiers == (1, 2)
    assert cfg.run.resume is True
    assert cfg.harness.context_window == 2048
    assert cfg.run.out == Path("runs/x y")


def test_an_override_of_a_path_that_looks_like_a_number_stays_a_path() -> None:
    assert loads_config("", ["run.out=2024"]).run.out == Path("2024")


def test_overrides_apply_on_top_of_the_file_and_later_ones_win() -> None:
    cfg = loads_config("[run]\nsteps = 5\n", ["run.steps=7", "run.steps=9"])
    assert cfg.run.steps == 9


def test_null_resets_an_optional_field() -> None:
    cfg = loads_config("[run]\ntarget_reward = 0.9\n", ["run.target_reward=null"])
    assert cfg.run.target_reward is None


def test_an_unknown_override_key_names_it_and_lists_the_section_keys() -> None:
    message = error_of(overrides=("optim.lrr=1",))
    assert "'optim.lrr'" in message
    assert "valid keys of [optim]" in message and "lr" in message and "grad_clip" in message


def test_an_unknown_override_section_lists_the_sections() -> None:
    message = error_of(overrides=("optimizer.lr=1",))
    assert "'optimizer'" in message
    for section in ("run", "data", "model", "algorithm", "optim", "harness", "eval"):
        assert section in message


def test_an_override_into_a_value_is_refused() -> None:
    message = error_of(overrides=("optim.lr.x=1",))
    assert "'optim.lr' is a value" in message


@pytest.mark.parametrize("override", ["lr=3", "optim.lr", "optim..lr=3"])
def test_a_malformed_override_is_refused(override: str) -> None:
    assert "section.key=value" in error_of(overrides=(override,))


# --- validation --------------------------------------------------------------------------------


def test_a_typo_in_a_toml_key_is_an_error_naming_the_key() -> None:
    message = error_of("[optim]\nlr = 1e-4\nwarmup = 3\n")
    assert "optim.warmup" in message and "unknown key" in message
    assert "warmup_steps" in message


def test_a_typo_in_a_nested_table_names_the_full_key() -> None:
    message = error_of("[harness.nudge]\nenable = false\n")
    assert "harness.nudge.enable" in message and "valid keys of [harness.nudge]" in message


def test_an_unknown_section_in_a_file_is_an_error() -> None:
    message = error_of("[optimizer]\nlr = 1\n")
    assert "optimizer" in message and "unknown key" in message


@pytest.mark.parametrize(("key", "registry"), [
    ("algorithm.loss", LOSSES),
    ("algorithm.advantage", ADVANTAGES),
    ("algorithm.reduction", {"token_mean": 0, "prompt_mean": 0}),
])
def test_algorithm_names_must_be_registered(key: str, registry: dict) -> None:
    message = error_of(overrides=(f"{key}=nonesuch",))
    assert key in message and "'nonesuch'" in message
    for name in registry:
        assert name in message


def test_a_hyperparameter_the_loss_does_not_take_is_an_error_listing_those_it_does() -> None:
    message = error_of(overrides=("algorithm.loss_kwargs.threshold=0.2",))
    assert "algorithm.loss_kwargs" in message and "'threshold'" in message
    assert "delta_hi" in message and "delta_lo" in message


def test_switching_the_loss_checks_the_kwargs_against_the_new_loss() -> None:
    text = "[algorithm.loss_kwargs]\ndelta_hi = 0.2\n"
    assert "delta_hi" in error_of(text, ("algorithm.loss=ppo",))
    cfg = loads_config("", ["algorithm.loss=ppo", "algorithm.loss_kwargs.eps_hi=0.28"])
    assert cfg.algorithm.resolved_loss_kwargs()["eps_hi"] == 0.28


def test_std_normalisation_is_only_for_grpo() -> None:
    message = error_of(overrides=("algorithm.advantage=rloo", "algorithm.normalize_std=true"))
    assert "algorithm.normalize_std" in message and "rloo" in message
    assert loads_config("", ["algorithm.normalize_std=true"]).algorithm.advantage_kwargs() == {
        "norm_by_std": True}


@pytest.mark.parametrize(("override", "key"), [
    ("harness.name=browser", "harness.name"),
    ("harness.tools=everything", "harness.tools"),
    ("data.group_size=1", "data.group_size"),
    ("data.tasks_per_step=0", "data.tasks_per_step"),
    ("run.steps=-1", "run.steps"),
    ("optim.lr=0", "optim.lr"),
    ("optim.micro_batch_tokens=0", "optim.micro_batch_tokens"),
    ("optim.betas=[1.0, 0.9]", "optim.betas"),
    ("data.tiers=[0, 5]", "data.tiers"),
    ("data.tiers=[]", "data.tiers"),
    ("eval.samples=0", "eval.samples"),
    ("harness.nudge.at=1.5", "harness.nudge.at"),
    ("harness.context_window=big", "harness.context_window"),
    ("data.train.files_per_world=10", "data.train.files_per_world"),
    ("model.device=tpu", "model.device"),
    ("run.target_reward=1.5", "run.target_reward"),
])
def test_bad_values_are_errors_naming_the_key(override: str, key: str) -> None:
    message = error_of(overrides=(override,))
    assert f"{key}:" in message


def test_train_and_test_must_be_different_directories() -> None:
    message = error_of(overrides=("data.test.dir=data/train",))
    assert "same directory" in message


def test_bf16_on_cpu_is_refused() -> None:
    message = error_of(overrides=("model.device=cpu", "model.dtype=bfloat16"))
    assert "model.dtype" in message and "float32" in message


def test_a_turn_must_fit_in_the_context_window() -> None:
    message = error_of(overrides=("harness.context_window=512", "harness.turn_token_cap=512"))
    assert "turn_token_cap" in message


def test_the_nudge_text_may_only_use_percent_left() -> None:
    message = error_of(overrides=("harness.nudge.text=only {tokens} left",))
    assert "harness.nudge.text" in message and "percent_left" in message
    cfg = loads_config("", ["harness.nudge.text=~{percent_left}% left"])
    assert cfg.harness.limits(4096).nudge_text == "~{percent_left}% left"


def test_every_problem_is_reported_at_once() -> None:
    message = error_of(overrides=("run.steps=-1", "optim.lr=-1"))
    assert "run.steps:" in message and "optim.lr:" in message


def test_an_unreadable_or_invalid_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "absent.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("[run\nsteps = 3\n")
    with pytest.raises(ConfigError, match="broken.toml is not valid TOML"):
        load_config(broken)
    bad = tmp_path / "bad.toml"
    bad.write_text("[run]\nsteps = -1\n")
    with pytest.raises(ConfigError, match=r"bad\.toml"):
        load_config(bad)


def test_assignment_is_validated_too() -> None:
    cfg = RunConfig()
    with pytest.raises(ValueError):
        cfg.data.group_size = 1


# --- what the config hands to the components ---------------------------------------------------


def test_the_harness_limits_take_the_models_window_and_drop_the_nudge_for_evals() -> None:
    harness = RunConfig().harness
    train = harness.limits(4096)
    assert train.context_window == 4096 and train.nudge_at == 0.8
    assert train.nudge_text == NUDGE_TEXT
    assert harness.limits(4096, nudge=False).nudge_at is None
    off = loads_config("", ["harness.nudge.enabled=false"]).harness.limits(4096)
    assert off.nudge_at is None
    fixed = loads_config("", ["harness.context_window=1024"]).harness.limits(4096)
    assert fixed.context_window == 1024


def test_the_turn_cap_shrinks_to_fit_a_small_model_window() -> None:
    limits = loads_config("", ["harness.turn_token_cap=4096"]).harness.limits(2048)
    assert limits.turn_token_cap == 2047


def test_the_tools_preset_picks_the_subset() -> None:
    def subset(*overrides: str) -> tuple[str, ...] | None:
        return loads_config("", list(overrides)).harness.tool_subset()

    assert subset("harness.tools=lookup") == LOOKUP_MCP_TOOLS
    assert subset("harness.tools=small") == SMALL_MCP_TOOLS
    assert subset("harness.tools=all") is None
    assert subset("harness.name=code", "harness.tools=lookup") is None


def test_the_loss_and_correction_settings_call_the_real_functions() -> None:
    cfg = loads_config("", [
        "algorithm.loss_kwargs.delta_hi=0.2",
        "algorithm.correction.token_bounds=[0.5, 2.0]",
        "algorithm.correction.tis=token",
    ])
    lp_BT = torch.tensor([[-1.0, -0.5, -2.0]], requires_grad=True)
    mask_BT = torch.tensor([[0, 1, 1]])
    rollout_BT = torch.tensor([[0.0, -0.6, -1.9]])
    loss = LOSSES[cfg.algorithm.loss](lp_BT, torch.ones(1, 3), mask_BT,
                                      rollout_logprobs_BT=rollout_BT,
                                      **cfg.algorithm.resolved_loss_kwargs())
    assert loss.loss_BT[0, 0] == 0.0 and loss.kept_BT[0, 1:].all()
    assert cfg.algorithm.correction.enabled
    correction = off_policy_correction(lp_BT.detach(), rollout_BT, mask_BT,
                                       **cfg.algorithm.correction.kwargs())
    assert correction.weight_BT.shape == (1, 3)


# --- dry run -----------------------------------------------------------------------------------


def test_describe_shows_every_key_and_the_defaults_of_changed_ones() -> None:
    cfg = loads_config("", ["optim.lr=0.0003", "data.group_size=4"])
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(describe(cfg))
    text = console.file.getvalue()
    for key in flatten(cfg):
        assert key in text
    lr_row = next(line for line in text.splitlines() if "optim.lr " in line)
    assert "0.0003" in lr_row and "0.0001" in lr_row
    assert "8 tasks x 4 samples = 32 trials/step" in text
    assert "dppo_binary_tv(delta_lo=0.15, delta_hi=0.15)" in text


def test_flatten_lists_leaves_by_dotted_key() -> None:
    flat = flatten(loads_config("", ["algorithm.loss_kwargs.delta_hi=0.2"]))
    assert flat["optim.lr"] == 1e-4
    assert flat["data.train.dir"] == "data/train"
    assert flat["algorithm.loss_kwargs"] == {"delta_hi": 0.2}
    assert flat["harness.nudge.at"] == 0.8
