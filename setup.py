"""The CPU kernels, built ahead of time: one plain shared library per instruction set.

Everything else about the package is in pyproject.toml. Each library is the C sources of
src/specgen/kernels/cpu compiled for one variant (kernels/cpu_build.py: AVX-512 with and
without VNNI, AVX2 with and without AVX-VNNI, portable), loaded through ctypes at run time
by what the CPU can execute, so a wheel runs at full speed where no C compiler is. They are
not Python extension modules (plain C ABI, no Python headers); setuptools builds them as
its extensions only so that wheels and editable installs carry them. A variant the
compiler cannot build is left out with a warning (specgen then builds it on first use where
it can, or takes the next best).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location(
    "cpu_build", HERE / "src/specgen/kernels/cpu_build.py"
)
cpu_build = sys.modules["cpu_build"] = importlib.util.module_from_spec(_spec)  # dataclasses ask
_spec.loader.exec_module(cpu_build)
VARIANTS = {
    f"specgen.kernels.cpu.{cpu_build.PREFIX}{v.name}": v for v in cpu_build.variants() if v.prebuilt
}


class BuildKernels(build_ext):
    def get_ext_filename(self, fullname: str) -> str:
        return fullname.replace(".", "/") + ".so"  # no Python ABI tag: a plain C library

    def build_extension(self, ext: Extension) -> None:
        out = Path(self.get_ext_fullpath(ext.name))
        cc = cpu_build.compiler()
        try:
            if cc is None:
                raise OSError("no C compiler (set CC)")
            cpu_build.compile_variant(VARIANTS[ext.name], out, cc)
        except OSError as e:
            print(f"specgen: CPU kernels {ext.name}: not built ({e})", file=sys.stderr)


setup(
    ext_modules=[Extension(name, sources=[]) for name in VARIANTS],
    cmdclass={"build_ext": BuildKernels},
)
