"""Build the C++ core as the extension module ``refdec._C``.

Portable flags by default; set ``REFDEC_NATIVE=1`` to add ``-march=native`` and
``REFDEC_SANITIZE=1`` for an AddressSanitizer + UBSan build with the debug
asserts of the C++ core enabled.
"""

import glob
import os

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

extra_compile_args = ["-O3", "-fvisibility=hidden"]
extra_link_args = []
if os.environ.get("REFDEC_NATIVE") == "1":
    extra_compile_args.append("-march=native")
if os.environ.get("REFDEC_SANITIZE") == "1":
    # -fno-wrapv: CPython's CFLAGS carry -fwrapv, which defines signed overflow and hides it from UBSan
    san = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-g", "-O1", "-UNDEBUG", "-fno-wrapv"]
    extra_compile_args = [a for a in extra_compile_args if a != "-O3"] + san
    extra_link_args += san

ext_modules = [
    Pybind11Extension(
        "refdec._C",
        sorted(glob.glob("csrc/*.cc")),
        include_dirs=["csrc"],
        cxx_std=17,
        extra_compile_args=extra_compile_args,
        extra_link_args=extra_link_args,
    )
]

setup(ext_modules=ext_modules, cmdclass={"build_ext": build_ext})
