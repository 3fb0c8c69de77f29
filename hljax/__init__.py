"""hljax."""
