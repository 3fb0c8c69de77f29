"""Entry points: python -m launch.<name>."""

import os

# transformers warns on import that PyTorch is missing (hljax uses only its tokenizers): a line on
# stderr before anything of ours, which would bury a one-line start-up error.
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
