"""Argument types and checks for the command line: bad input is refused before anything runs.

Why here and not inside the commands: a typo must cost the user one line on stderr and exit
status 2 at once, not a traceback (or a wrong result) after a long run. Every converter raises
``argparse.ArgumentTypeError`` with a message that says what was expected and what was given;
:class:`Parser` prints it as one line.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys
from typing import NoReturn

__all__ = ["Parser", "positive_int", "nonneg_int", "positive_float", "nonneg_float", "int_list",
           "existing_file", "output_file", "output_dir", "missing_module"]


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (``prog: error: ...``), exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return v


def positive_int(text: str) -> int:
    v = _int(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be an integer > 0, got {text!r}")
    return v


def nonneg_int(text: str) -> int:
    v = _int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return v


def positive_float(text: str) -> float:
    v = _float(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return v


def nonneg_float(text: str) -> float:
    v = _float(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return v


def int_list(text: str) -> list[int]:
    """``"256,512,1024"`` -> ``[256, 512, 1024]``; every item an integer > 0, at least one."""
    items = [x.strip() for x in text.split(",")]
    if not any(items):
        raise argparse.ArgumentTypeError(f"expected a comma list of integers > 0, got {text!r}")
    out = []
    for x in items:
        if not x:
            continue
        try:
            v = int(x)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma list of integers > 0, got {x!r} in {text!r}") from None
        if v <= 0:
            raise argparse.ArgumentTypeError(f"expected a comma list of integers > 0, got {x!r} in {text!r}")
        out.append(v)
    return out


def existing_file(text: str) -> str:
    if not os.path.exists(text):
        raise argparse.ArgumentTypeError(f"no such file: {text!r}")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a directory, not a file")
    if not os.access(text, os.R_OK):
        raise argparse.ArgumentTypeError(f"cannot read {text!r} (permission denied)")
    return text


def output_file(text: str) -> str:
    """A file to (over)write: its directory must exist and be writable; it must not be a directory."""
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a directory; give a file name")
    parent = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(parent):
        raise argparse.ArgumentTypeError(f"directory {os.path.dirname(text) or '.'!r} does not exist")
    if not os.access(parent, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write to directory {os.path.dirname(text) or '.'!r}")
    if os.path.exists(text) and not os.access(text, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text!r} (permission denied)")
    return text


def output_dir(text: str) -> str:
    """A directory to write several files into: it exists, or its parent does (then it is created)."""
    if os.path.exists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} exists and is not a directory (this option takes a directory)")
    target = text if os.path.isdir(text) else os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(target):
        raise argparse.ArgumentTypeError(f"neither {text!r} nor its parent directory exists")
    if not os.access(target, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write to directory {target!r}")
    return text


def missing_module(module: str) -> bool:
    """True when ``module`` cannot be imported here (checked without importing it)."""
    if module in sys.modules:
        return sys.modules[module] is None
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True
