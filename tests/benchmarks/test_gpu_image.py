"""benchmarks/gpu/gpu_image.py, the stand-in for the lent GPU image's packages: a script run under it
cannot import what the image lacks (as `import` or as an optional-dependency probe), except the
dependencies this venv's versions of the image's own packages need."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gpu_image

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import importlib.util, json, sys
out = {"probe_pydantic": importlib.util.find_spec("pydantic") is not None}
for name in ("pydantic", "annotated_types", "torch", "rich"):
    try:
        __import__(name)
        out[name] = "imported"
    except ImportError as e:
        out[name] = type(e).__name__
json.dump(out, open(sys.argv[1], "w"))
"""


def test_the_image_list_has_what_the_proof_needs_and_not_what_it_must_do_without():
    image = {gpu_image.normalize(n) for n in gpu_image.IMAGE_PACKAGES}
    assert {"torch", "transformers", "safetensors", "numpy", "typer", "rich"} <= image
    assert not {"pydantic", "pydantic-core", "vllm", "math-verify", "datasets", "trl", "redis"} & image


def test_a_script_sees_only_the_image_packages(tmp_path):
    script, result, report = tmp_path / "probe.py", tmp_path / "out.json", tmp_path / "report.json"
    script.write_text(SCRIPT)
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu" / "gpu_image.py"), "--report", str(report),
                          str(script), str(result)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    seen = json.loads(result.read_text())
    assert seen == {"probe_pydantic": False, "pydantic": "ModuleNotFoundError",
                    "annotated_types": "ModuleNotFoundError", "torch": "imported", "rich": "imported"}
    refused = json.loads(report.read_text())["refused"]
    assert refused["pydantic"] == "__main__" and refused["annotated_types"] == "__main__"


def test_a_dependency_of_an_image_package_is_let_through_and_what_it_imports_too():
    policy = gpu_image.ImagePolicy()
    policy.absent = {"httpx2": "httpx2", "httpcore2": "httpcore2", "annotated_types": "annotated-types"}
    policy.image = frozenset({"huggingface_hub"})

    def asked_by(importer: str, name: str) -> bool:
        scope = {"__name__": importer, "policy": policy}
        exec(f"hidden = policy.hides({name!r})", scope)       # the frame of `importer`'s code asks
        return scope["hidden"]

    assert asked_by("huggingface_hub._http", "httpx2") is False
    assert asked_by("httpx2._client", "httpcore2") is False           # let through for a let-through module
    assert asked_by("rstar2_cli.config", "annotated_types") is True
    assert asked_by("huggingface_hub", "pydantic") is True             # never on the image, whoever asks
    assert asked_by("rstar2_cli.config", "httpx2.sub") is False        # submodules go with their package
    assert policy.refused == {"annotated_types": "rstar2_cli", "pydantic": "huggingface_hub"}
