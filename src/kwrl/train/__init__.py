"""Training: supervised fine-tuning on demonstrations now; the RL trainer and orchestrator next."""
