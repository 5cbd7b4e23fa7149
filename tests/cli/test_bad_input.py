"""Every command meets bad input with one line: each case runs `rstar2 ...` as a user does (a
fresh process, the console entry's `app()`), and must exit with status 2 printing exactly one
non-empty line, `error: ...`, that names the bad value, with no traceback, and without a network
attempt (an audit hook ends the process at the first lookup or connection to a non-local host).

The cases start from placeholders the fixture fills: {model} (a folder that passes the checkpoint
checks, though it holds no real weights: nothing may load it), {empty} (a plain folder), {file}
(a plain file), {badyaml} (a recipe with a YAML error), {emptyyaml} (a recipe of comments only),
{emptyjsonl} (a data file of no rows), {noanswer} and {emptyanswer} (a row without an answer),
{problems} (a problems .jsonl), {sft} (an SFT .jsonl), {usedrun} (an RL run folder with checkpoints
through step 4), {loggedrun} (one with metrics.jsonl rows through step 3 and no checkpoint),
{binary} (binary bytes named .jsonl), {bindata} (a data dir whose aime25.jsonl is binary), {badgz}
(a gzip stream cut short), {notparquet} (text named .parquet), {gzcsv} (a gzipped .csv), {tmp},
{busy} (a port this test listens on), {closed} (a local port nothing listens on) and {free} (a port
free to listen on). Each process gets $RSTAR2_DATA_DIR with one-row versions of the four eval sets
(they win over the copies shipped in the package), an empty Hugging Face cache, and runs in {tmp}.
"""
from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNSET = None

# Runs the CLI as the `rstar2` console script does, after installing a hook that ends the process
# with status 97 at the first name lookup or TCP/UDP connection to a host other than this one.
RUNNER = r"""
import os, socket, sys
LOCAL = ("localhost", "127.", "::1", "0.0.0.0")
def local(host):
    host = host.decode() if isinstance(host, bytes) else str(host or "localhost")
    return host.startswith(LOCAL)
def hook(event, args):
    if event == "socket.getaddrinfo" and not local(args[0]) or (
            event == "socket.connect" and args[0].family in (socket.AF_INET, socket.AF_INET6)
            and not local(args[1][0])):
        os.write(2, f"network: {event} {args[-1] if event == 'socket.connect' else args[0]}\n".encode())
        os._exit(97)
sys.addaudithook(hook)
sys.argv[0] = "rstar2"
from rstar2_cli.cli import app
sys.exit(app())
"""

# (case id, argv, a fragment the one line must hold, environment changes)
CASES = [
    # the three first tries of a new user, with and without a local copy of the eval sets
    ("eval-missing-checkpoint", ["eval", "aime25", "/nonexistent/ckpt"], "MODEL /nonexistent/ckpt: no such folder", {}),
    ("eval-missing-checkpoint-no-data", ["eval", "aime25", "/nonexistent/ckpt"], "/nonexistent/ckpt",
     {"RSTAR2_DATA_DIR": UNSET}),
    ("eval-folder-not-a-model", ["eval", "aime25", "{empty}"], "{empty}: not a model folder (no config.json)", {}),
    ("eval-folder-not-a-model-no-data", ["eval", "aime25", "{empty}"], "not a model folder",
     {"RSTAR2_DATA_DIR": UNSET}),
    ("serve-sandbox-redis-down", ["serve-sandbox", "--redis", "redis://127.0.0.1:{closed}/0", "--redis-wait", "1",
                                  "--port", "{free}"], "--redis redis://127.0.0.1:{closed}/0: no Redis answered", {}),
    ("serve-sandbox-worker-redis-down", ["serve-sandbox", "--worker", "--redis", "redis://127.0.0.1:{closed}/0",
                                         "--redis-wait", "1", "--unsafe-no-isolation"],
     "--redis redis://127.0.0.1:{closed}/0: no Redis answered within 1 s", {}),
    ("serve-sandbox-port-out-of-range", ["serve-sandbox", "--port", "99999"], "--port 99999", {}),
    # eval
    ("eval-checkpoint-is-a-file", ["eval", "aime25", "{file}"], "a file, not a model folder", {}),
    ("eval-hub-id-not-cached", ["eval", "aime25", "org/not-cached"], "org/not-cached: no such folder", {}),
    ("eval-config-not-json", ["eval", "aime25", "{badconfig}"], "config.json", {}),
    ("eval-no-weights", ["eval", "aime25", "{noweights}"], "no weights", {}),
    ("eval-no-tokenizer", ["eval", "aime25", "{notokenizer}"], "no tokenizer files", {}),
    ("eval-unknown-benchmark", ["eval", "aime26", "{model}"], "aime26", {}),
    ("eval-empty-data", ["eval", "custom", "{model}", "--data", "{emptyjsonl}"],
     "--data {emptyjsonl}: no rows (the file is empty)", {}),
    ("eval-openai-nothing-there", ["eval", "aime25", "served-model", "--engine", "openai", "--base-url",
                                   "http://127.0.0.1:{closed}/v1", "--tokenizer", "{model}"],
     "--base-url http://127.0.0.1:{closed}/v1: no server answers there", {}),
    ("eval-zero-samples", ["eval", "aime25", "{model}", "--samples", "0"], "samples", {}),
    ("eval-negative-temperature", ["eval", "aime25", "{model}", "--temperature", "-1"], "temperature", {}),
    ("eval-missing-data-file", ["eval", "custom", "{model}", "--data", "/nonexistent.jsonl"],
     "--data /nonexistent.jsonl: no such file", {}),
    ("eval-output-under-a-file", ["eval", "aime25", "{model}", "--out", "{file}/out"], "--out {file}/out", {}),
    ("eval-data-dir-missing", ["eval", "aime25", "{model}", "--data-dir", "/nonexistent"], "/nonexistent", {}),
    ("eval-no-local-set-and-hub-down", ["eval", "gpqa_diamond", "{model}"], "benchmark gpqa_diamond",
     {"RSTAR2_DATA_DIR": UNSET, "HF_ENDPOINT": "http://127.0.0.1:{closed}"}),
    ("eval-openai-bad-base-url", ["eval", "aime25", "served", "--engine", "openai", "--tokenizer", "{model}",
                                  "--base-url", "ftp://host/v1"], "--base-url ftp://host/v1", {}),
    ("eval-openai-no-tokenizer", ["eval", "aime25", "served", "--engine", "openai", "--base-url",
                                  "http://127.0.0.1:{closed}/v1"], "served", {}),
    ("eval-bad-sandbox-url", ["eval", "aime25", "{model}", "--sandbox-url", "localhost:8088"], "--sandbox-url", {}),
    ("eval-missing-protocol-recipe", ["eval", "aime25", "{model}", "--protocol-from", "/nonexistent.yaml"],
     "/nonexistent.yaml", {}),
    ("eval-missing-arguments", ["eval"], "Missing argument", {}),
    ("eval-binary-data", ["eval", "custom", "{model}", "--data", "{binary}"], "--data {binary}: not UTF-8 text", {}),
    ("eval-binary-named-set", ["eval", "aime25", "{model}"], "benchmark aime25: {bindata}/aime25.jsonl: not UTF-8",
     {"RSTAR2_DATA_DIR": "{bindata}"}),     # a file in the data folder wins over the packaged set
    ("eval-binary-named-set-data-dir", ["eval", "aime25", "{model}", "--data-dir", "{bindata}"],
     "benchmark aime25: {bindata}/aime25.jsonl: not UTF-8", {"RSTAR2_DATA_DIR": UNSET}),
    ("eval-broken-gzip-data", ["eval", "custom", "{model}", "--data", "{badgz}"], "--data {badgz}: gzip", {}),
    # serve-sandbox and bench-tools
    ("serve-sandbox-port-zero", ["serve-sandbox", "--port", "0"], "--port 0", {}),
    ("serve-sandbox-port-not-a-number", ["serve-sandbox", "--port", "http"], "--port http", {}),
    ("serve-sandbox-port-in-use", ["serve-sandbox", "--port", "{busy}"], "--port {busy} on 127.0.0.1", {}),
    ("serve-sandbox-zero-timeout", ["serve-sandbox", "--timeout", "0"], "--timeout 0", {}),
    ("serve-sandbox-unknown-isolation", ["serve-sandbox", "--isolation", "jail"], "--isolation jail", {}),
    ("serve-sandbox-unknown-log-level", ["serve-sandbox", "--log-level", "loud"], "--log-level loud", {}),
    ("serve-sandbox-redis-not-a-redis-url", ["serve-sandbox", "--redis", "http://host"], "--redis http://host", {}),
    ("serve-sandbox-zero-workers", ["serve-sandbox", "--workers", "0"], "--workers 0", {}),
    ("serve-sandbox-worker-without-redis", ["serve-sandbox", "--worker"], "--redis", {}),
    ("bench-tools-bad-concurrency", ["bench-tools", "--concurrency", "1,x"], "--concurrency 1,x", {}),
    ("bench-tools-zero-concurrency", ["bench-tools", "--concurrency", "0"], "--concurrency 0", {}),
    ("bench-tools-unknown-workload", ["bench-tools", "--workloads", "trivial,nope"], "--workloads nope", {}),
    ("bench-tools-json-under-a-file", ["bench-tools", "--json", "{file}/r.json"], "--json {file}/r.json", {}),
    ("bench-tools-bad-url", ["bench-tools", "--url", "nohost"], "--url nohost", {}),
    ("bench-tools-nothing-listening", ["bench-tools", "--url", "http://127.0.0.1:{closed}"],
     "--url http://127.0.0.1:{closed}: no sandbox server answers", {}),
    ("bench-tools-unknown-client", ["bench-tools", "--client", "grpc"], "--client grpc", {}),
    ("bench-tools-port-out-of-range", ["bench-tools", "--client", "codejudge", "--port", "70000"],
     "--port 70000", {}),
    # preflight: bad flags, and a node that fails a check (the line names the node and what failed)
    ("preflight-redis-not-a-redis-url", ["preflight", "--redis", "http://host"], "--redis http://host", {}),
    ("preflight-sandbox-url-without-scheme", ["preflight", "--sandbox-url", "localhost:8088"],
     "--sandbox-url localhost:8088", {}),
    ("preflight-zero-timeout", ["preflight", "--timeout", "0"], "--timeout 0", {}),
    ("preflight-fewer-gpus-than-asked", ["preflight", "--gpus-per-node", "8"], "sees 0 GPU(s), expected 8",
     {"GLOO_SOCKET_IFNAME": UNSET, "NCCL_SOCKET_IFNAME": UNSET}),
    ("preflight-redis-unreachable", ["preflight", "--redis", "redis://127.0.0.1:{closed}/0"],
     "Redis redis://127.0.0.1:{closed}/0 unreachable", {"RSTAR2_CPU_RANKS": "1", "GLOO_SOCKET_IFNAME": UNSET}),
    ("preflight-sandbox-unreachable", ["preflight", "--sandbox-url", "http://127.0.0.1:{closed}"],
     "sandbox front end http://127.0.0.1:{closed}/ping unreachable",
     {"RSTAR2_CPU_RANKS": "1", "GLOO_SOCKET_IFNAME": UNSET}),
    ("preflight-no-such-interface", ["preflight"], "GLOO_SOCKET_IFNAME=nosuch0: no interface nosuch0 on this node",
     {"RSTAR2_CPU_RANKS": "1", "GLOO_SOCKET_IFNAME": "nosuch0"}),
    # prepare
    ("prepare-math-no-source", ["prepare", "math"], "--source", {}),
    ("prepare-math-missing-source", ["prepare", "math", "--source", "/nonexistent.jsonl", "--out", "{tmp}/o.jsonl"],
     "--source /nonexistent.jsonl: no such file", {}),
    ("prepare-math-unknown-eval-set", ["prepare", "math", "--source", "{problems}", "--out", "{tmp}/o.jsonl",
                                       "--eval-set", "aime26"], "--eval-set aime26", {}),
    ("prepare-math-output-under-a-file", ["prepare", "math", "--source", "{problems}", "--out", "{file}/o.jsonl"],
     "--out {file}/o.jsonl", {}),
    ("prepare-math-output-type", ["prepare", "math", "--source", "{problems}", "--out", "{tmp}/o.csv"], "o.csv", {}),
    ("prepare-math-missing-spec", ["prepare", "math", "--spec", "/nonexistent.yaml"], "/nonexistent.yaml", {}),
    ("prepare-math-spec-not-a-mapping", ["prepare", "math", "--spec", "{listyaml}"], "{listyaml}", {}),
    ("prepare-math-spec-bad-yaml", ["prepare", "math", "--spec", "{badyaml}"], "{badyaml}:3:11: not valid YAML", {}),
    ("prepare-math-threshold-above-one", ["prepare", "math", "--source", "{problems}", "--out", "{tmp}/o.jsonl",
                                          "--near-dup-threshold", "2"], "near_dup_threshold", {}),
    ("prepare-math-zero-ngram", ["prepare", "math", "--ngram", "0"], "--ngram 0", {}),
    ("prepare-math-named-set-and-hub-down", ["prepare", "math", "--source", "dapo_math_17k", "--out",
                                             "{tmp}/o.jsonl"], "--source dapo_math_17k",
     {"RSTAR2_DATA_DIR": UNSET, "HF_ENDPOINT": "http://127.0.0.1:{closed}"}),
    ("prepare-math-binary-source", ["prepare", "math", "--source", "{binary}", "--out", "{tmp}/o.jsonl"],
     "--source {binary}: not UTF-8 text", {}),
    ("prepare-math-binary-eval-set", ["prepare", "math", "--source", "{problems}", "--out", "{tmp}/o.jsonl",
                                      "--eval-set", "aime25"], "--eval-set aime25: {bindata}/aime25.jsonl: not UTF-8",
     {"RSTAR2_DATA_DIR": "{bindata}"}),
    ("prepare-math-broken-gzip-source", ["prepare", "math", "--source", "{badgz}", "--out", "{tmp}/o.jsonl"],
     "--source {badgz}: gzip", {}),
    ("prepare-math-not-parquet", ["prepare", "math", "--source", "{notparquet}", "--out", "{tmp}/o.jsonl"],
     "--source {notparquet}: not a Parquet file", {}),
    ("prepare-sft-binary-input", ["prepare", "sft", "{binary}", "--out", "{tmp}/o.jsonl", "--format", "openai"],
     "IN_PATH {binary}: not UTF-8 text", {}),
    ("prepare-sft-broken-gzip-input", ["prepare", "sft", "{badgz}", "--out", "{tmp}/o.jsonl", "--format", "openai"],
     "IN_PATH {badgz}: gzip", {}),
    ("prepare-sft-nothing-converts", ["prepare", "sft", "{problems}", "--out", "{tmp}/o.jsonl", "--format", "openai"],
     "{problems}: 0 of 1 rows convert as --format openai (line 1: ", {}),
    ("prepare-sft-missing-input", ["prepare", "sft", "/nonexistent.jsonl", "--out", "{tmp}/o.jsonl", "--format",
                                   "openai"], "/nonexistent.jsonl: no such file", {}),
    ("prepare-sft-unknown-format", ["prepare", "sft", "{sft}", "--out", "{tmp}/o.jsonl", "--format", "alpaca"],
     "--format alpaca", {}),
    ("prepare-sft-output-is-a-folder", ["prepare", "sft", "{sft}", "--out", "{empty}", "--format", "openai"],
     "--out {empty}: a folder, not a file", {}),
    ("prepare-hard-policy-not-a-model", ["prepare", "hard", "--policy", "{empty}"], "--policy {empty}", {}),
    ("prepare-hard-missing-data", ["prepare", "hard", "--policy", "{model}", "--data", "/nonexistent.jsonl"],
     "--data /nonexistent.jsonl", {}),
    ("prepare-hard-binary-data", ["prepare", "hard", "--policy", "{model}", "--data", "{binary}"],
     "--data {binary}: not UTF-8 text", {}),
    ("inspect-missing-folder", ["inspect", "/nonexistent"], "/nonexistent: no such folder", {}),
    ("inspect-neither-run-nor-eval", ["inspect", "{empty}"], "{empty}: neither an RL run folder", {}),
    ("inspect-a-file", ["inspect", "{file}"], "{file}", {}),
    ("prepare-hard-zero-samples", ["prepare", "hard", "--policy", "{model}", "--samples", "0"], "--samples 0", {}),
    ("prepare-hard-output-under-a-file", ["prepare", "hard", "--policy", "{model}", "--data", "{problems}", "--out",
                                          "{file}/hard.jsonl"], "--out {file}/hard.jsonl", {}),
    ("prepare-hard-no-run-recipe", ["prepare", "hard", "--policy", "{model}", "--data", "{problems}"],
     "--policy {model}: no resolved_recipe.yaml in it or any folder above it", {}),
    ("prepare-hard-missing-recipe", ["prepare", "hard", "--policy", "{model}", "--recipe", "/nonexistent.yaml"],
     "/nonexistent.yaml: recipe not found", {}),
    ("prepare-hard-negative-temperature", ["prepare", "hard", "--policy", "{model}", "--data", "{problems}",
                                           "--max-turns", "2", "--max-tokens", "16", "--top-p", "1",
                                           "--temperature", "-1"], "--temperature -1.0: Input should be", {}),
    ("prepare-eval-data-missing-file", ["prepare", "eval-data", "--gpqa", "/nonexistent.csv", "--out", "{tmp}/ed"],
     "--gpqa /nonexistent.csv", {}),
    ("prepare-eval-data-gzip-csv", ["prepare", "eval-data", "--gpqa", "{gzcsv}", "--out", "{tmp}/ed"],
     "--gpqa {gzcsv}: gzip-compressed", {}),
    ("prepare-eval-data-bad-row", ["prepare", "eval-data", "--ifeval", "{sft}", "--out", "{tmp}/ed"],
     "{sft}:1: missing field 'key'", {}),
    # sft
    ("sft-missing-recipe", ["sft", "/nonexistent.yaml"], "/nonexistent.yaml: recipe file not found", {}),
    ("sft-bad-override-value", ["sft", "--set", "lr=fast"], "lr", {}),
    ("sft-override-without-value", ["sft", "--set", "lr"], "--set 'lr'", {}),
    ("sft-unknown-field", ["sft", "--set", "epoch=3"], "epoch: unknown field", {}),
    ("sft-default-hub-model-not-cached", ["sft"], "model Qwen/Qwen3-14B-Base", {}),
    ("sft-model-not-a-model", ["sft", "--set", "model={empty}"], "model {empty}", {}),
    ("sft-missing-data", ["sft", "--set", "model={model}", "--set", "data=/nonexistent.jsonl"],
     "data /nonexistent.jsonl: no such file", {}),
    ("sft-output-is-a-file", ["sft", "--set", "model={model}", "--set", "data={sft}", "--set", "out_dir={file}"],
     "out_dir {file}", {}),
    # rl
    ("rl-no-recipe-or-stage", ["rl"], "--stage", {}),
    ("rl-missing-recipe", ["rl", "/nonexistent.yaml"], "/nonexistent.yaml", {}),
    ("rl-recipe-bad-yaml", ["rl", "{badyaml}"], "{badyaml}:3:11: not valid YAML (mapping values are not allowed", {}),
    ("rl-recipe-empty", ["rl", "{emptyyaml}"], "{emptyyaml}: the recipe is empty", {}),
    ("sft-recipe-bad-yaml", ["sft", "{badyaml}"], "{badyaml}:3:11: not valid YAML", {}),
    ("rl-stage-out-of-range", ["rl", "--stage", "4"], "--stage 4", {}),
    ("rl-unknown-field", ["rl", "--stage", "1", "--set", "optim.lrr=1"], "optim.lrr: unknown field", {}),
    ("rl-stage-2-before-stage-1", ["rl", "--stage", "2"], "model.path runs/stage1/final: no such folder", {}),
    ("rl-missing-train-data", ["rl", "--stage", "1", "--set", "model.path={model}", "--set",
                               "data.train=/nonexistent.jsonl"], "data.train /nonexistent.jsonl", {}),
    ("rl-unknown-eval-set", ["rl", "--stage", "1", "--set", "model.path={model}", "--set", "data.train={problems}",
                             "--set", "train.eval_sets=[aime26]"], "train.eval_sets aime26", {}),
    ("rl-binary-train-data", ["rl", "--stage", "1", "--set", "model.path={model}", "--set", "data.train={binary}"],
     "data.train {binary}: not UTF-8 text", {}),
    ("rl-train-row-without-answer", ["rl", "--stage", "1", "--set", "model.path={model}", "--set",
                                     "data.train={noanswer}"], "data.train: {noanswer}:2: missing field 'answer'", {}),
    ("rl-train-empty-answer", ["rl", "--stage", "1", "--set", "model.path={model}", "--set",
                               "data.train={emptyanswer}"], "data.train: {emptyanswer}:1: empty field 'answer'", {}),
    ("rl-train-no-rows", ["rl", "--stage", "1", "--set", "model.path={model}", "--set", "data.train={emptyjsonl}"],
     "data.train {emptyjsonl}: no rows (the file is empty)", {}),
    ("rl-resume-without-checkpoint", ["rl", "--stage", "1", "--set", "model.path={model}", "--set",
                                      "data.train={problems}", "--set", "train.out_dir={tmp}/no-run", "--resume"],
     "--resume: no checkpoint in {tmp}/no-run; --resume auto starts fresh", {}),
    ("rl-output-under-a-file", ["rl", "--stage", "1", "--set", "model.path={model}", "--set",
                                "data.train={problems}", "--set", "train.out_dir={file}/rl"],
     "train.out_dir {file}/rl", {}),
    ("rl-out-dir-holds-a-run", ["rl", "--stage", "1", "--set", "model.path={model}", "--set", "data.train={problems}",
                                "--set", "train.out_dir={usedrun}"],
     "train.out_dir {usedrun}: already holds a run, at step 4 (latest -> step_000004", {}),
    ("rl-out-dir-holds-metrics-rows", ["rl", "--stage", "1", "--set", "model.path={model}", "--set",
                                       "data.train={problems}", "--set", "train.out_dir={loggedrun}"],
     "train.out_dir {loggedrun}: already holds a run, at step 3 (metrics.jsonl through step 3); a new run there would "
     "mix with it. Continue it with --resume (its latest checkpoint) or --resume auto (that, else a fresh start), or "
     "give this run another train.out_dir (--set train.out_dir=DIR)", {}),
    ("rl-master-port-out-of-range", ["rl", "--stage", "1", "--master-port", "70000"], "--master-port 70000", {}),
    ("rl-bad-sizes", ["rl", "--stage", "1", "--gpus", "12", "--nodes", "8", "--master-addr", "h", "--dry-run"],
     "not divisible by nodes", {}),
    # quickstart and the top level
    ("quickstart-bad-seed-list", ["quickstart", "--seeds", "0,one"], "--seeds", {}),
    ("quickstart-zero-steps", ["quickstart", "--steps", "0"], "--steps 0", {}),
    ("quickstart-output-is-a-file", ["quickstart", "--out", "{file}"], "--out {file}", {}),
    ("unknown-command", ["evaluate"], "evaluate", {}),
    ("unknown-option", ["version", "--verbose"], "--verbose", {}),
]


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad_input")
    model = root / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    (model / "model.safetensors").write_bytes(b"")
    (model / "tokenizer_config.json").write_text("{}")
    variants = {"badconfig": {"config.json": "{not json"}, "noweights": {"model.safetensors": None},
                "notokenizer": {"tokenizer_config.json": None}}
    p = {"model": str(model), "tmp": str(root)}
    for name, changes in variants.items():
        folder = root / name
        folder.mkdir()
        for f in ("config.json", "model.safetensors", "tokenizer_config.json"):
            text = changes.get(f, (model / f).read_text())
            if text is not None:
                (folder / f).write_text(text)
        p[name] = str(folder)
    (root / "empty").mkdir()
    (root / "file").write_text("not a folder\n")
    data = root / "data"
    data.mkdir()
    row = json.dumps({"id": "1", "problem": "What is 1+1?", "answer": "2"})
    for name in ("aime24", "aime25", "math500", "hmmt25", "problems"):
        (data / f"{name}.jsonl").write_text(row + "\n")
    (root / "sft.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                                             {"role": "assistant", "content": "hello"}]}) + "\n")
    (root / "list.yaml").write_text("- a\n")
    (root / "bad.yaml").write_text("name: x\ntrain:\n  steps: 3: 4\n")     # a colon too many, line 3 column 11
    (root / "empty.yaml").write_text("# settings to come\n")
    (root / "empty.jsonl").write_text("\n")
    (root / "noanswer.jsonl").write_text(row + "\n" + json.dumps({"id": "2", "problem": "What is 2+2?"}) + "\n")
    (root / "emptyanswer.jsonl").write_text(json.dumps({"id": "1", "problem": "What is 1+1?", "answer": ""}) + "\n")
    for n in (2, 4):                                      # what `rstar2 rl` leaves in train.out_dir
        (root / "usedrun" / f"step_{n:06d}" / "state").mkdir(parents=True)
    (root / "usedrun" / "latest").write_text("step_000004")
    (root / "loggedrun").mkdir()
    for folder, steps in (("usedrun", 4), ("loggedrun", 3)):
        rows = "".join(json.dumps({"step": i}) + "\n" for i in range(1, steps + 1))
        (root / folder / "metrics.jsonl").write_text(rows)
    # what a new user hands over by mistake: binary data, a gzip file cut short, a csv still gzipped
    (root / "binary.jsonl").write_bytes(bytes(range(256)) * 4)
    (root / "bindata").mkdir()
    (root / "bindata" / "aime25.jsonl").write_bytes(bytes(range(256)) * 4)
    (root / "cut.jsonl").write_bytes(gzip.compress((row + "\n").encode() * 200)[:40])
    (root / "table.parquet").write_text(row + "\n")
    (root / "gpqa.csv").write_bytes(gzip.compress(b"Question,Correct Answer\nq,a\n"))
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))     # bound, never listening: connections are refused
    with socket.socket() as probe:    # a port free to listen on
        probe.bind(("127.0.0.1", 0))
        free = str(probe.getsockname()[1])
    p.update(empty=str(root / "empty"), file=str(root / "file"), problems=str(data / "problems.jsonl"),
             sft=str(root / "sft.jsonl"), listyaml=str(root / "list.yaml"), data=str(data),
             badyaml=str(root / "bad.yaml"), emptyyaml=str(root / "empty.yaml"), emptyjsonl=str(root / "empty.jsonl"),
             noanswer=str(root / "noanswer.jsonl"), emptyanswer=str(root / "emptyanswer.jsonl"),
             usedrun=str(root / "usedrun"), loggedrun=str(root / "loggedrun"),
             binary=str(root / "binary.jsonl"), badgz=str(root / "cut.jsonl"), notparquet=str(root / "table.parquet"),
             gzcsv=str(root / "gpqa.csv"), bindata=str(root / "bindata"),
             busy=str(busy.getsockname()[1]), closed=str(closed.getsockname()[1]), free=free)
    yield p
    busy.close()
    closed.close()


def run_case(places: dict[str, str], argv: list[str], env_changes: dict) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "RSTAR2_", "TRANSFORMERS_"))}
    env.update(PYTHONPATH=str(REPO), RSTAR2_DATA_DIR=places["data"], HF_HOME=f"{places['tmp']}/hf", COLUMNS="200")
    for key, value in env_changes.items():
        if value is UNSET:
            env.pop(key, None)
        else:
            env[key] = value.format(**places)
    args = [a.format(**places) for a in argv]
    return subprocess.run([sys.executable, "-c", RUNNER, *args], capture_output=True, text=True, env=env,
                          cwd=places["tmp"], timeout=120)


@pytest.fixture(scope="module")
def results(places):
    """Every case's process, run four at a time (each costs about one interpreter start-up)."""
    with ThreadPoolExecutor(4) as pool:
        futures = {case: pool.submit(run_case, places, argv, env) for case, argv, _, env in CASES}
    return {case: f.result() for case, f in futures.items()}


@pytest.mark.parametrize("case, argv, fragment, env", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_naming_the_value(results, places, case, argv, fragment, env):
    proc = results[case]
    output = proc.stdout + proc.stderr
    lines = [line for line in output.splitlines() if line.strip()]
    assert not output.startswith("network:"), output
    assert "Traceback" not in output, output
    assert proc.returncode == 2, output
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    assert fragment.format(**places) in lines[0], output


def test_every_command_has_a_case():
    """A new command (or prepare subcommand) gets its bad-input cases here too."""
    from typer.main import get_command

    from rstar2_cli.cli import app

    root = get_command(app)
    names = {n for n, c in root.commands.items() if not hasattr(c, "commands")}
    names |= {f"{n} {s}" for n, c in root.commands.items() for s in getattr(c, "commands", {})}
    covered = {" ".join(argv[:2]) if argv[0] == "prepare" else argv[0] for _, argv, _, _ in CASES}
    assert names <= covered, sorted(names - covered)
