"""Proposer training: GRPO and SFT."""
