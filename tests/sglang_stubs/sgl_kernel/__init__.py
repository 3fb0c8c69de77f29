"""TEST-ONLY stand-in for `sgl_kernel` (see tests/sglang_stubs/README.md): importable, never callable.

Mainline SGLang's CPU path tested here (torch_native attention, no AMX: `torch.ops.sgl_kernel` has no
`convert_weight_packed`) uses torch's own ops instead. Never install this outside the test venv."""

from _hljax_test_standin import install

install(__import__(__name__), "0.0.0+hljax.test.standin")
