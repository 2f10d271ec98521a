"""kwrl: reinforcement learning for LLM agents on professional knowledge work."""

__version__ = "0.1.0"
