"""TEST-ONLY stand-in machinery for `sgl_kernel` and `torchvision` in the mainline-SGLang test venv.

Mainline SGLang imports both at module level on every path, and neither has a CPU wheel that fits the
local CPU torch 2.13.0 (sgl_kernel's CPU build is compiled from source; torchvision's wheels are built
against other torch releases). The CPU path hljax tests (torch_native attention, no AMX) never calls
them, so these stand-ins only have to import: any submodule imports, any attribute is a `Missing`
placeholder, and calling or instantiating one raises `StandInCalled` naming what was called.

Installed by scripts/sglang_mainline.sh setup into that venv only. Never install them anywhere else.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types


class StandInCalled(RuntimeError):
    """A test-only stand-in was used for real: this server path needs the real package."""


class _MissingMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _missing(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args, **kwargs):
        raise StandInCalled(f"{cls.__qualname__} is a test-only stand-in (tests/sglang_stubs): the real package "
                            "is not installed in this venv, and this server path needs it")

    def __getitem__(cls, item):
        return cls

    def __or__(cls, other):
        return cls

    __ror__ = __or__

    def __bool__(cls):
        return False

    def __repr__(cls):
        return f"<test-only stand-in {cls.__qualname__}>"


def _missing(qualname: str) -> type:
    """A placeholder class: subclassable and usable in annotations; calling it raises StandInCalled."""
    cls = _MissingMeta(qualname.rsplit(".", 1)[-1], (), {"__module__": qualname.rsplit(".", 1)[0]})
    cls.__qualname__ = qualname
    return cls


class StandInModule(types.ModuleType):
    """A module whose every missing attribute is a placeholder."""

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = _missing(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves every submodule of `root` not found on disk as a StandInModule."""

    def __init__(self, root: str):
        self.root = root

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(self.root + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = StandInModule(spec.name)
        module.__path__ = []
        module.__hljax_test_standin__ = True
        return module

    def exec_module(self, module):
        pass


def install(module: types.ModuleType, version: str) -> None:
    """Make `module` (a stand-in package's __init__) a StandInModule with stand-in submodules."""
    module.__class__ = StandInModule
    module.__version__ = version
    module.__hljax_test_standin__ = True
    if not any(isinstance(f, _Finder) and f.root == module.__name__ for f in sys.meta_path):
        sys.meta_path.append(_Finder(module.__name__))  # Last: a real submodule on disk would win.
