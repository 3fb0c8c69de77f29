"""Experiment configs (ml_collections files, one per experiment) and the Reasoning Gym family lists."""
