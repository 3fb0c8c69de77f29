"""TEST-ONLY stand-in for `torchvision` (see tests/sglang_stubs/README.md): importable, never callable.

Mainline SGLang imports torchvision for its multimodal processors; a text-only model never uses them.
Never install this outside the test venv."""

from _hljax_test_standin import install

install(__import__(__name__), "0.0.0+hljax.test.standin")
