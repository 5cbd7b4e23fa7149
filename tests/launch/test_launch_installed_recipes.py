"""A non-editable install (a wheel, as `pip install .` and the ROCm image make) works as the checkout
does: `rstar2 rl --stage 2 --dry-run` finds stage 2 from any folder and prints its launch plan, a
`recipes/stage1.yaml` or a `stage1` folder in that folder changes nothing, the evaluation sets load
with no data folder and no network, and the sandbox's jail hides the working folder and imports the
dependencies from another site-packages. The wheel is
built and installed once per session."""
from __future__ import annotations

import json
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


@pytest.fixture(scope="session")
def installed_wheel(tmp_path_factory) -> tuple[Path, dict]:
    """(the venv holding the wheel alone, an environment without PYTHONPATH or VIRTUAL_ENV)."""
    tmp_path = tmp_path_factory.mktemp("wheel")
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=SKIP)                 # the build writes build/ and egg-info: not in the repo
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist"), str(src)], check=True, timeout=600)
    wheel = next((tmp_path / "dist").glob("rstar2-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for name in ("stage1.yaml", "stage2.yaml", "stage3.yaml", "sft.yaml", "slurm_rl.sbatch"):
        assert f"rstar2_cli/recipes/{name}" in names, f"{name} is not in {wheel.name}"
    licences = ("matharena-MIT.txt", "qwen2.5-math-evaluation-MIT.txt", "areal-Apache-2.0.txt")
    for name in ("aime24.jsonl", "aime25.jsonl", "math500.jsonl", "hmmt25.jsonl", "SOURCES.md",
                 *(f"licenses/{licence}" for licence in licences)):
        assert f"rstar2_cli/data/eval_sets/{name}" in names, f"{name} is not in {wheel.name}"
    assert not [n for n in names if "dapo" in n.lower()], "the training set must not ship"

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
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "RSTAR2_DATA_DIR")}
    env["COLUMNS"] = "200"
    where = subprocess.run([str(py), "-c", "import rstar2_cli, sandbox; print(rstar2_cli.__file__, sandbox.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout.split()
    assert all(w.startswith(str(site)) for w in where), f"imported {where}, not the installed wheel"
    return venv, env


def _rstar2(installed_wheel, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    venv, env = installed_wheel
    return subprocess.run([str(venv / "bin" / "rstar2"), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow
def test_an_installed_wheel_finds_the_stage_recipe_and_plans_the_launch(installed_wheel, tmp_path):
    work = tmp_path / "elsewhere"
    work.mkdir()
    run = _rstar2(installed_wheel, work, "rl", "--stage", "2", "--gpus", "64", "--master-addr", "HEAD", "--dry-run",
                  "--gpu-memory", "mi300x")
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    text = " ".join(run.stdout.split())
    assert "resolved recipe: stage2 (stage 2)" in text and "64 GPUs = 8 node(s) x 8" in text
    assert "--rdzv-endpoint HEAD:29500" in text
    # sized from the memory plan: 0.91 of each MI300X for the engine, CUDA graphs, and it fits
    assert "engines: gpu_memory_utilization 0.91, max_num_seqs 512, max_num_batched_tokens 16384, CUDA graphs" in text
    assert "fits: at most 180.4 of 191.6 GiB per GPU" in text


@pytest.mark.slow
def test_a_recipes_copy_or_a_stage_folder_in_the_working_folder_changes_nothing(installed_wheel, tmp_path):
    """The dry-run from an empty folder, then with an edited recipes/stage1.yaml and a folder called
    stage1 there: the same plan (the copy named on stderr), stage 2 still starting from runs/stage1/final."""
    work = tmp_path / "empty"
    work.mkdir()
    plain = [_rstar2(installed_wheel, work, "rl", "--stage", n, "--dry-run") for n in ("1", "2")]
    assert [r.returncode for r in plain] == [0, 0], (plain[0].stderr + plain[1].stderr)[-3000:]
    (work / "recipes").mkdir()
    (work / "recipes" / "stage1.yaml").write_text("name: mine\nstage: 1\ntrain:\n  steps: 3\n  out_dir: stage1\n")
    (work / "stage1").mkdir()
    (work / "stage1" / "config.json").write_text("{}")
    again = [_rstar2(installed_wheel, work, "rl", "--stage", n, "--dry-run") for n in ("1", "2")]
    assert [r.stdout for r in again] == [r.stdout for r in plain]
    assert "recipes/stage1.yaml differs from the packaged recipe" in again[0].stderr
    assert "continues stage1 (runs/stage1/final)" in " ".join(again[1].stdout.split())


EVAL_SET_SNIPPET = """
import json
from rstar2_cli.commands.checks import eval_data_missing
from rstar2_cli.data.problems import load_problems
from rstar2_cli.eval.benchmarks import family_of
from rstar2_cli.eval.settings import EvalSettings
aime = family_of("aime25").load(EvalSettings(benchmark="aime25", model="m"))
sizes = {n: len(load_problems(n, allow_hub=False)) for n in ("aime24", "math500", "hmmt25")}
print(json.dumps([len(aime), aime[0].id, aime[-1].answer, sizes, eval_data_missing("aime25", None)]))
"""


@pytest.mark.slow
def test_the_installed_wheel_reads_the_eval_sets_offline_from_any_folder(installed_wheel, tmp_path):
    """`rstar2 eval aime25`'s lookup from the wheel in an empty folder, with no data folder, no network
    (the Hub's address refuses) and no HF cache: the packaged sets, all rows."""
    venv, env = installed_wheel
    work = tmp_path / "empty"
    work.mkdir()
    offline = {**env, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf")}
    run = subprocess.run([str(venv / "bin" / "python"), "-c", EVAL_SET_SNIPPET], cwd=work, env=offline,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    count, first, last_answer, sizes, missing = json.loads(run.stdout.strip().splitlines()[-1])
    assert (count, first, last_answer) == (30, "2025-I-1", "240")
    assert sizes == {"aime24": 30, "math500": 500, "hmmt25": 30} and missing is None


SNIPPET = """
import json
from sandbox import Sandbox
pool = Sandbox(workers=1)
result = pool.run_sync("import numpy, sympy\\nprint(sympy.factorint(360), int(numpy.arange(4).sum()))")
print(json.dumps([pool.protections()["backend"], result.stdout, result.reason]))
"""


@pytest.mark.slow
def test_the_installed_sandbox_hides_the_working_folder_and_imports_its_dependencies(installed_wheel, tmp_path):
    """`serve-sandbox --check` from the wheel in an empty folder: isolated, project_hidden on; a jailed
    call imports sympy and numpy, which this venv finds only through its .pth line."""
    from sandbox.jail.backends import bwrap_problem, nsjail_problem

    if nsjail_problem() is not None and bwrap_problem() is not None:
        pytest.skip("neither nsjail nor bubblewrap can run here")
    work = tmp_path / "empty"
    work.mkdir()
    check = _rstar2(installed_wheel, work, "serve-sandbox", "--check", "--workers", "1")
    assert check.returncode == 0, (check.stdout + check.stderr)[-3000:]
    rows = {line.split()[1]: line.split()[-2] for line in check.stdout.splitlines() if len(line.split()) >= 4}
    assert rows.get("project_hidden") == "yes" and rows.get("home_hidden") == "yes", check.stdout
    venv, env = installed_wheel
    run = subprocess.run([str(venv / "bin" / "python"), "-c", SNIPPET], cwd=work, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    backend, out, reason = json.loads(run.stdout.strip().splitlines()[-1])
    assert backend in ("nsjail", "bwrap") and reason == "ok" and out == "{2: 3, 3: 2, 5: 1} 6\n", run.stdout
