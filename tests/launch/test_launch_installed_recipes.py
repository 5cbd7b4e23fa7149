"""A non-editable install (a wheel, as `pip install .` and the ROCm image make) carries the recipes:
`rstar2 rl --stage 2 --dry-run` finds stage 2 from any folder and prints its launch plan."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SKIP = shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", "build", "dist", "runs", ".venv", ".pytest_cache")


@pytest.mark.slow
def test_an_installed_wheel_finds_the_stage_recipe_and_plans_the_launch(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=SKIP)                 # the build writes build/ and egg-info: not in the repo
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist"), str(src)], check=True, timeout=600)
    wheel = next((tmp_path / "dist").glob("rstar2-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for name in ("stage1.yaml", "stage2.yaml", "stage3.yaml", "sft.yaml", "slurm_rl.sbatch"):
        assert f"rstar2_cli/recipes/{name}" in names, f"{name} is not in {wheel.name}"

    # A fresh venv with the wheel alone; the dependencies come from this interpreter's site-packages,
    # appended by a .pth (a plain path line: that folder's own .pth files, an editable rstar2's
    # finder among them, are not run), so the wheel's rstar2_cli is the one imported.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "shared_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)],
                   check=True, timeout=600)

    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    where = subprocess.run([str(py), "-c", "import rstar2_cli; print(rstar2_cli.__file__)"], cwd=work, env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert where.startswith(str(site)), f"imported {where}, not the installed wheel"
    run = subprocess.run([str(venv / "bin" / "rstar2"), "rl", "--stage", "2", "--gpus", "64", "--master-addr", "HEAD",
                          "--dry-run", "--gpu-memory", "mi300x"], cwd=work, env={**env, "COLUMNS": "200"},
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    text = " ".join(run.stdout.split())
    assert "resolved recipe: stage2 (stage 2)" in text and "64 GPUs = 8 node(s) x 8" in text
    assert "--rdzv-endpoint HEAD:29500" in text
    # sized from the memory plan: 0.91 of each MI300X for the engine, CUDA graphs, and it fits
    assert "engines: gpu_memory_utilization 0.91, max_num_seqs 512, max_num_batched_tokens 16384, CUDA graphs" in text
    assert "fits: at most 180.8 of 192 GiB per GPU" in text
