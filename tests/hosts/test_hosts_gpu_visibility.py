"""An engine's GPU group reaches its process through CUDA_VISIBLE_DEVICES and HIP_VISIBLE_DEVICES
alike, so vLLM's ROCm platform accepts it whatever the launcher exported."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rstar2_cli.hosts.gpu_visibility import VISIBILITY_VARS, visible_gpus

HIP, CUDA = "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"


def test_unlimited_process_sets_both_and_removes_both_after():
    env: dict[str, str] = {"ROCR_VISIBLE_DEVICES": "0,1,2,3"}
    with visible_gpus((2, 3), env) as value:
        assert value == env[CUDA] == env[HIP] == "2,3"
    assert env == {"ROCR_VISIBLE_DEVICES": "0,1,2,3"}     # the runtime's own filter is left alone


@pytest.mark.parametrize("exported", [{CUDA: "4,5,6,7"}, {HIP: "4,5,6,7"}, {CUDA: "4,5,6,7", HIP: "4,5,6,7"}])
def test_ids_index_the_exported_limit_and_it_is_restored(exported):
    env = dict(exported)
    with visible_gpus((1, 2), env):
        assert env[CUDA] == env[HIP] == "5,6"
    assert env == exported
    with pytest.raises(RuntimeError, match="engine failed"):   # a failed engine start restores both too
        with visible_gpus((0,), env):
            raise RuntimeError("engine failed")
    assert env == exported


def test_conflicting_limits_and_ids_outside_them_fail_in_one_line():
    env = {CUDA: "0,1", HIP: "2,3"}
    with pytest.raises(ValueError, match=r"HIP_VISIBLE_DEVICES='2,3' and CUDA_VISIBLE_DEVICES='0,1' differ"):
        with visible_gpus((0,), env):
            pass
    assert env == {CUDA: "0,1", HIP: "2,3"}
    env = {HIP: "4,5,6,7"}
    with pytest.raises(ValueError, match=r"gpu id 4 is not one of the 4 devices in HIP_VISIBLE_DEVICES='4,5,6,7'"):
        with visible_gpus((4,), env):
            pass
    with pytest.raises(ValueError, match="must be >= 0"):
        with visible_gpus((-1,), env):
            pass
    assert env == {HIP: "4,5,6,7"}


PROBE = """
import json, os, sys
out = []
for env in json.loads(sys.argv[1]):
    for name in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        os.environ.pop(name, None)
    os.environ.update(env)
    try:
        import vllm.platforms.rocm   # runs vLLM's HIP/CUDA consistency check at import
        out.append("imported")
    except Exception as e:           # on a CPU-only torch the import stops after the check
        out.append(f"{type(e).__name__}: {e}")
    sys.modules.pop("vllm.platforms.rocm", None)
print(json.dumps(out))
"""


def test_vllms_rocm_platform_accepts_what_an_engine_process_inherits():
    launcher = {HIP: "0,1,2,3,4,5,6,7"}            # what some ROCm launchers export
    env = dict(launcher)
    with visible_gpus((2, 3), env):
        ours = {k: env[k] for k in VISIBILITY_VARS}
    cuda_only = {**launcher, CUDA: "2,3"}         # CUDA_VISIBLE_DEVICES alone over the launcher's HIP
    run = subprocess.run([sys.executable, "-c", PROBE, json.dumps([ours, cuda_only])], capture_output=True,
                         text=True, timeout=300, env={k: v for k, v in os.environ.items() if k not in VISIBILITY_VARS})
    assert run.returncode == 0, run.stderr[-2000:]
    got_ours, got_cuda_only = json.loads(run.stdout.strip().splitlines()[-1])
    assert "Inconsistent GPU visibility" in got_cuda_only
    assert "Inconsistent GPU visibility" not in got_ours
