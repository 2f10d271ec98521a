"""Engines: token ids in, token ids + logprobs out (see `base.Engine`)."""

from kwrl.engines.base import Completion, Engine, EngineError, SamplingParams

__all__ = ["Completion", "Engine", "EngineError", "SamplingParams"]
