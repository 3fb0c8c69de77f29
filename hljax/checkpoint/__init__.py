"""Checkpoint I/O: HF safetensors and orbax train state."""
