"""SGLang on a machine without a GPU: what its storage path needs and PyPI
cannot give (kvtier.bench_peers and the tests that drive kvtier.sglang with
SGLang's own classes).

torchvision: SGLang's model-config package imports it at module level for
multimodal image preprocessing, which the storage path never runs. PyPI has
only CUDA builds of it for Linux, which cannot load under the CPU torch;
when no working torchvision is importable, a stand-in whose every function
raises answers the imports made by SGLang's modules, and only those:
transformers and everything else still find no torchvision, as is true."""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

__all__ = ["torchvision_for_sglang"]

_installed = False


def torchvision_for_sglang() -> None:
    """Installs the stand-in (once) unless a working torchvision imports."""
    global _installed
    if _installed:
        return
    try:
        import torchvision  # noqa: F401
        return
    except Exception:  # absent, or a CUDA build that cannot load its ops
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
    # transformers caches whether torchvision exists: it must see the truth (absent), not the stand-in
    from transformers.utils import import_utils
    if import_utils.is_torchvision_available():
        raise RuntimeError("transformers takes torchvision as present, yet it does not import")

    class Absent:
        def __init__(self, name: str) -> None:
            self._name = name

        def __getattr__(self, attr: str) -> Any:
            if attr.startswith("__"):
                raise AttributeError(attr)
            return Absent(f"{self._name}.{attr}")

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(f"{self._name}: torchvision is not installed (kvtier's stand-in for SGLang on a CPU)")

    class Module(types.ModuleType):
        def __getattr__(self, attr: str) -> Any:
            if attr.startswith("__"):
                raise AttributeError(attr)
            return Absent(f"{self.__name__}.{attr}")

    def imported_by_sglang() -> bool:
        f = sys._getframe(2)
        while f is not None:
            name = f.f_globals.get("__name__", "")
            if not name.startswith("importlib") and name != __name__:
                return name == "sglang" or name.startswith("sglang.")
            f = f.f_back
        return False

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
            if (name == "torchvision" or name.startswith("torchvision.")) and imported_by_sglang():
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec: Any) -> Any:
            return Module(spec.name)

        def exec_module(self, module: Any) -> None:
            module.__path__ = []

    sys.meta_path.insert(0, Finder())
    _installed = True
