"""On PYTHONPATH, this makes triton unimportable, as on a machine without it (macOS, native Windows): every finder
answers "no such module" for triton and its submodules, so importlib.util.find_spec("triton") is None and
`import triton` raises ModuleNotFoundError (tests/test_no_triton.py runs labs this way)."""
import sys


class _WithoutTriton:
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            return None
        find = getattr(self.finder, "find_spec", None)
        return find(name, path, target) if find else None

    def __getattr__(self, attr):
        return getattr(self.finder, attr)


sys.meta_path[:] = [_WithoutTriton(f) for f in sys.meta_path]
for _name in [m for m in sys.modules if m == "triton" or m.startswith("triton.")]:
    del sys.modules[_name]
