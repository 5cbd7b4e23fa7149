"""Run a script with only the imports the lent GPU machine's image has.

The lent GPU machine runs a fixed image (Python 3.12, torch 2.11 cu130, transformers 5.17, no vLLM)
and can fetch nothing, so a benchmark meant for it must import only what is installed there and
this source tree. `IMAGE_PACKAGES` is that image's package list as read on a machine running it on
2026-11-17 (the device tool's KINDS.md, "Python packages already there").

    python benchmarks/gpu/gpu_image.py --report blocked.json benchmarks/gpu/gpu_trainer_proof.py --device cpu ...

runs the script with `sys.meta_path`'s finders blind (`HidingFinder`) to

  * `ALWAYS_BLOCKED`: what the project uses that the image does not have (vLLM, pydantic, math-verify,
    datasets, TRL, redis): never importable, whoever imports it;
  * every other top-level module of a distribution installed here but not on the image, when the
    code importing it is this project's (the tree, a script) or another such module. The same module
    imported by a package the image does have, or by a module let through for one (the
    huggingface_hub installed here needs httpx2, which needs httpcore2; the image's version has its
    own dependencies), is let through: the image's copy of that package brings what it needs. Once
    loaded, a module let through is not looked up again, so a later import of it by the project
    goes unnoticed.

`--report FILE` writes the modules refused, with who asked, as JSON. A script that completes under
it needs nothing fetched on the image; torch or transformers API differences between the versions
installed here and the image's are not caught by it.
"""
from __future__ import annotations

import argparse
import importlib.abc
import importlib.metadata
import json
import re
import runpy
import sys
from pathlib import Path

IMAGE_PACKAGES = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy
peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel
wrapt xarray xxhash yarl zipp
""".split())
# Top-level modules the project imports (directly or as an optional dependency) that the image lacks.
ALWAYS_BLOCKED = frozenset({"vllm", "pydantic", "pydantic_core", "math_verify", "datasets", "trl", "redis"})
PROJECT_DISTRIBUTION = "rstar2"      # this tree: it travels with the command


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def not_on_image() -> dict[str, str]:
    """{top-level module: its distribution} for every distribution installed here that the image
    lacks (this project's own excepted)."""
    image = {normalize(n) for n in IMAGE_PACKAGES} | {PROJECT_DISTRIBUTION}
    found: dict[str, str] = {}
    for module, dists in importlib.metadata.packages_distributions().items():
        missing = [d for d in dists if normalize(d) not in image]
        if missing and len(missing) == len(dists):
            found[module] = missing[0]
    return found


def on_image_modules() -> frozenset[str]:
    """Top-level modules whose every distribution is on the image."""
    image = {normalize(n) for n in IMAGE_PACKAGES}
    return frozenset(m for m, dists in importlib.metadata.packages_distributions().items()
                     if all(normalize(d) in image for d in dists))


def _importer() -> str:
    """The top-level package of the module whose code runs the import being looked up."""
    frame = sys._getframe(2)
    while frame is not None:
        name, where = frame.f_globals.get("__name__", ""), frame.f_code.co_filename
        if not (name.startswith("importlib") or where == __file__ or where.startswith("<frozen importlib")):
            return name.split(".")[0]
        frame = frame.f_back
    return ""


class ImagePolicy:
    """Which imports the image could not satisfy (module docstring), and the ones refused so far."""

    def __init__(self):
        self.absent = not_on_image()
        self.image = on_image_modules()
        self.refused: dict[str, str] = {}
        self.let_through: set[str] = set()     # not on the image, needed by what is (here's versions)

    def hides(self, fullname: str) -> bool:
        """Whether the top-level module `fullname` is refused; submodules go with their package."""
        if "." in fullname or (fullname not in ALWAYS_BLOCKED and fullname not in self.absent):
            return False
        importer = _importer()
        if fullname not in ALWAYS_BLOCKED and (importer in self.image or importer in self.let_through):
            self.let_through.add(fullname)
            return False
        self.refused.setdefault(fullname, importer or "<script>")
        return True


class HidingFinder(importlib.abc.MetaPathFinder):
    """One of `sys.meta_path`'s finders, blind to what `policy` hides: a hidden module is then not
    found by any finder, so `import` raises ModuleNotFoundError and `importlib.util.find_spec` (how
    libraries probe optional dependencies) returns None, as on the image."""

    def __init__(self, inner, policy: ImagePolicy):
        self.inner, self.policy = inner, policy

    def find_spec(self, fullname, path=None, target=None):
        if self.policy.hides(fullname):
            return None
        find = getattr(self.inner, "find_spec", None)
        return None if find is None else find(fullname, path, target)

    def __getattr__(self, name):          # find_distributions, invalidate_caches, ...
        return getattr(self.inner, name)


def install() -> ImagePolicy:
    """Wrap every finder of `sys.meta_path` (`HidingFinder`); the policy records what it refused."""
    policy = ImagePolicy()
    sys.meta_path[:] = [HidingFinder(f, policy) for f in sys.meta_path]
    return policy


def run_as_on_image(script: str, argv: list[str], report: Path | None = None) -> int:
    """Run `script` as `__main__` with `argv` with the image's imports only (`install`); its exit status."""
    policy = install()
    sys.argv = [script, *argv]
    sys.path.insert(0, str(Path(script).resolve().parent))
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        if report is not None:
            loaded = sorted(m for m in sys.modules if m.split(".")[0] in ALWAYS_BLOCKED)
            report.write_text(json.dumps({"refused": policy.refused, "always_blocked": sorted(ALWAYS_BLOCKED),
                                          "let_through": sorted(policy.let_through),
                                          "not_on_image": sorted(policy.absent), "blocked_loaded": loaded}, indent=1))
    return code


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--report", type=Path, default=None, help="write the refused imports here (JSON)")
    ap.add_argument("script", help="the Python script to run")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="its arguments (after --)")
    args = ap.parse_args(argv)
    rest = args.args[1:] if args.args[:1] == ["--"] else args.args
    return run_as_on_image(args.script, rest, args.report)


if __name__ == "__main__":
    sys.exit(main())
