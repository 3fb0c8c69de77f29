"""Entry points: python -m launch.<name>."""
