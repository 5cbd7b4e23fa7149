"""Checks every command runs on its paths and values before it loads anything.

A failed check is one `error: ...` line naming the flag (or recipe field) and the value, through
`commands.fail` (exit status 2), within a moment and without waiting on the network. The rules:

- A checkpoint (eval's MODEL, `prepare hard --policy`, a recipe's model path) is a folder holding a
  config.json with a JSON object, weights (*.safetensors or *.bin) and, where a tokenizer is read
  from it, tokenizer.json or tokenizer_config.json; or the id of a Hub repository already in the
  local Hugging Face cache. A command never downloads a model: `hf download ID` fetches one first.
- A named problem set (aime24, aime25, math500, hmmt25, dapo_math_17k, and eval's gpqa_diamond and
  ifeval: `data.problems.HUB_IDS`) is read from `<data dir>/<name>.jsonl`; without that file the
  Hub must accept a connection within `HUB_PROBE_S` seconds, unless HF_HUB_OFFLINE is set (then
  the datasets cache answers). bfcl's rows come with the bfcl-eval package, which must be installed.
  An eval benchmark name is never read as a path; `eval all` lists a set without data in its row
  ("no data: how to add it", `eval_data_missing`) instead of stopping.
- A data file (eval's --data, a problem source, an SFT input) reads as its format: its head is
  UTF-8 text (gzip-compressed .jsonl/.json are read as their text) or, for .parquet, Parquet
  (`data_file`, from `data.problems.unreadable`), so binary data stops before a model loads.
- An output path is not a folder where a file is wanted (or the reverse), and its nearest existing
  folder takes a new file (tried with a temporary file, which also catches read-only mounts and
  root on /proc).
- A port is 1-65535 (Typer's `min`/`max` on the option) and, for a server, free on its host.
"""
from __future__ import annotations

import functools
import json
import os
import re
import socket
import tempfile
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import urlsplit

from rstar2_cli.commands import fail, shown
from rstar2_cli.data.problems import (
    DATA_DIR_ENV, HUB_IDS, NAMED_SETS, DataError, find_named_set_file, load_problems, resolve_data_dir, unreadable,
)

HUB_PROBE_S = 3.0               # how long a Hub reachability probe may take before it counts as down
WEIGHT_GLOBS = ("*.safetensors", "*.bin")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
# A Hub repo id: `name` or `namespace/name` (huggingface_hub's validate_repo_id accepts these characters).
_REPO_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)?$")


def _hub_cached(repo_id: str, files: Iterable[str]) -> bool:
    """Whether the local Hugging Face cache holds one of `files` of the model repo `repo_id`."""
    if not _REPO_ID.match(repo_id) or ".." in repo_id or "--" in repo_id:
        return False
    from huggingface_hub import try_to_load_from_cache

    try:
        return any(isinstance(try_to_load_from_cache(repo_id, f), str) for f in files)
    except ValueError:          # huggingface_hub's HFValidationError: not a repo id after all
        return False


def model_dir(value: str, what: str, *, tokenizer: bool = True, hint: str = "") -> None:
    """`value` is a servable HF model folder (with tokenizer files if `tokenizer`) or a cached Hub id;
    `hint` ends the error when the folder does not exist (where it should have come from)."""
    path = Path(value).expanduser()
    if not path.exists():
        if _hub_cached(value, ["config.json"]):
            return
        if not _REPO_ID.match(value):
            fail(f"{what} {shown(value)}: no such folder{hint}")
        fail(f"{what} {shown(value)}: no such folder, and no Hub model of that id in the local Hugging Face "
             f"cache (commands do not download models; fetch one first with `hf download {value}`)")
    if not path.is_dir():
        fail(f"{what} {shown(value)}: a file, not a model folder")
    config = path / "config.json"
    if not config.is_file():
        fail(f"{what} {shown(value)}: not a model folder (no config.json)")
    try:
        ok = isinstance(json.loads(config.read_text(encoding="utf-8")), dict)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        fail(f"{what} {shown(value)}: config.json is unreadable ({e})")
    if not ok:
        fail(f"{what} {shown(value)}: config.json does not hold a JSON object")
    if not any(next(path.glob(g), None) for g in WEIGHT_GLOBS):
        fail(f"{what} {shown(value)}: no weights in the folder ({' or '.join(WEIGHT_GLOBS)})")
    if tokenizer:
        tokenizer_source(value, what)


def tokenizer_source(value: str, what: str) -> None:
    """`value` is a folder with tokenizer files, or a Hub id whose tokenizer is in the local cache."""
    path = Path(value).expanduser()
    if not path.exists():
        if _hub_cached(value, TOKENIZER_FILES):
            return
        if not _REPO_ID.match(value):
            fail(f"{what} {shown(value)}: no such folder")
        fail(f"{what} {shown(value)}: no such folder, and no Hub tokenizer of that id in the local Hugging Face cache")
    if not path.is_dir() or not any((path / f).is_file() for f in TOKENIZER_FILES):
        fail(f"{what} {shown(value)}: no tokenizer files ({' or '.join(TOKENIZER_FILES)})")


def input_file(value: str | os.PathLike, what: str) -> None:
    path = Path(value).expanduser()
    if not path.exists():
        fail(f"{what} {shown(value)}: no such file")
    if not path.is_file():
        fail(f"{what} {shown(value)}: a folder, not a file")


def data_file(value: str | os.PathLike, what: str) -> None:
    """`value` is a file whose head reads as its format (`data.problems.unreadable`: UTF-8 text,
    gzip-compressed for .jsonl/.json, or Parquet), checked in a moment whatever its size."""
    input_file(value, what)
    reason = unreadable(Path(value).expanduser())
    if reason:
        fail(f"{what} {shown(value)}: {reason}")


def output_dir(value: str | os.PathLike, what: str) -> None:
    """`value` is, or can be created as, a folder this process can write into."""
    path = Path(value).expanduser()
    if path.exists() and not path.is_dir():
        fail(f"{what} {shown(value)}: exists and is not a folder")
    _writable_parent(path, value, what)


def output_file(value: str | os.PathLike, what: str) -> None:
    """`value` is, or can be created as, a file this process can write."""
    path = Path(value).expanduser()
    if path.is_dir():
        fail(f"{what} {shown(value)}: a folder, not a file")
    _writable_parent(path.parent, value, what)


def _writable_parent(path: Path, value: Any, what: str) -> None:
    base = path.absolute()
    while not base.exists():
        base = base.parent
    if not base.is_dir():
        fail(f"{what} {shown(value)}: {shown(base)} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=base):
            pass
    except OSError as e:
        fail(f"{what} {shown(value)}: cannot write in {shown(base)} ({e.strerror or e})")


def problem_source(value: str, what: str, data_dir: str | None, *, hub_ids: bool = False,
                   allow_hub: bool = True) -> None:
    """`value` is a data file, a named set with a local copy or a reachable Hub, or (with `hub_ids`,
    as `prepare math --source` takes them) a Hub dataset id `namespace/name`."""
    path = Path(value).expanduser()
    if path.exists():
        return data_file(value, what)
    if value in NAMED_SETS or value in HUB_IDS:
        root = resolve_data_dir(data_dir)
        if root is not None and not root.is_dir():
            fail(f"data dir {shown(root)}: no such folder (from --data-dir or ${DATA_DIR_ENV})")
        found = find_named_set_file(value, root)
        if found is not None:
            return data_file(found, f"{what} {value}:")
        where = (f"no {value}.jsonl in {shown(root)}" if root
                 else f"no --data-dir (or ${DATA_DIR_ENV}) with {value}.jsonl")
    elif hub_ids and "/" in value and not path.suffix and _REPO_ID.match(value):
        where = "a Hub dataset id"
    elif path.suffix:
        fail(f"{what} {shown(value)}: no such file")
    else:
        fail(f"{what} {shown(value)}: no such file or named set ({', '.join(NAMED_SETS)})")
    if not allow_hub:
        fail(f"{what} {shown(value)}: {where}, and Hub loading is off")
    if not hub_reachable():
        fail(f"{what} {shown(value)}: {where}, and the Hub ({hub_endpoint()}) does not answer; give a data dir "
             f"holding it, or set HF_HUB_OFFLINE=1 to read the Hugging Face datasets cache")


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def hub_reachable(timeout: float = HUB_PROBE_S) -> bool:
    """True when HF_HUB_OFFLINE is set (the caller then reads the cache) or the Hub endpoint accepts
    a TCP connection within `timeout` seconds, name lookup included (run in a thread, since
    `getaddrinfo` has no timeout of its own)."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return True
    url = urlsplit(hub_endpoint())
    host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
    result: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            result.append(True)
        except (OSError, ValueError):
            result.append(False)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(result and result[0])


def url(value: str, what: str, schemes: tuple[str, ...] = ("http", "https")) -> None:
    """`value` is `scheme://host[:port][/...]` with one of `schemes` and a port in range."""
    parts = urlsplit(value)
    try:
        parts.port
    except ValueError:
        fail(f"{what} {shown(value)}: port out of range 1-65535")
    if parts.scheme not in schemes or not (parts.hostname or (parts.scheme == "unix" and parts.path)):
        fail(f"{what} {shown(value)}: expected a URL like {schemes[0]}://host:port ({', '.join(schemes)})")


def server_answers(value: str, what: str, timeout: float = 5.0) -> None:
    """An OpenAI-compatible server answers HTTP at `value` (its `/models`), so a run does not start
    its tokenizer and sandbox only to find nothing there. Any HTTP answer counts (an auth error or a
    404 is the server's own word, which the run then shows)."""
    try:
        with urllib.request.urlopen(value.rstrip("/") + "/models", timeout=timeout):
            pass
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", None) or e
        fail(f"{what} {shown(value)}: no server answers there ({reason}); start it first "
             f"(e.g. vllm serve MODEL --port 8000) or give its address")


def free_port(host: str, port: int, what: str = "--port") -> None:
    """Nothing else listens on `host:port` (bound and released at once, as uvicorn binds it)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as e:
        fail(f"--host {shown(host)}: {getattr(e, 'strerror', None) or e}")
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as e:
            fail(f"{what} {port} on {host}: {e.strerror or e}")


def positive(value: float | None, what: str) -> None:
    if value is not None and not value > 0:
        fail(f"{what} {shown(value)}: must be > 0")


def choice(value: str, choices: Iterable[str], what: str) -> None:
    choices = list(choices)
    if value not in choices:
        fail(f"{what} {shown(value)}: choose one of {', '.join(choices)}")


def int_list(text: str, what: str, *, minimum: int = 1) -> list[int]:
    """'1,8,64' -> [1, 8, 64], each at least `minimum`."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        fail(f"{what} {shown(text)}: expected comma-separated integers like 1,8,64")
    if not values or min(values) < minimum:
        fail(f"{what} {shown(text)}: expected comma-separated integers >= {minimum}")
    return values


def eval_settings(s: Any, *, data: bool = True) -> None:
    """An `EvalSettings`' paths: the checkpoint (or, with `--engine openai`, the tokenizer), its
    context against `--max-model-len`, the sandbox and server URLs, the output folder, and last
    (it may probe the Hub; `data=False` skips it, as `eval all` does, which lists a set without
    data instead of stopping) its problem set, whose file, where there is one, must read as its
    format. A benchmark name is never read as a path."""
    if s.engine == "vllm":
        model_dir(s.model, "MODEL", tokenizer=s.tokenizer is None)
        from rstar2_cli.eval.settings import model_context_limit  # lazy: pydantic, for --help's speed (cli.py)

        limit = model_context_limit(s.model)
        if s.max_model_len and limit and s.max_model_len > limit:
            fail(f"--max-model-len {s.max_model_len}: above MODEL {shown(s.model)}'s context of {limit} tokens "
                 f"(max_position_embeddings in its config.json)")
    if s.tokenizer is not None or s.engine != "vllm":
        tokenizer_source(s.tokenizer or s.model, "--tokenizer" if s.tokenizer else "MODEL (the tokenizer)")
    if s.base_url:
        url(s.base_url, "--base-url")
        if s.engine == "openai":
            server_answers(s.base_url, "--base-url")
    if s.sandbox_url:
        url(s.sandbox_url, "--sandbox-url")
    output_dir(s.out_dir or "runs/eval", "--out")
    if s.data:
        return data_file(s.data, "--data")

    if data:
        reason = eval_data_missing(s.benchmark, s.data_dir)
        if reason:
            fail(f"benchmark {s.benchmark}: {reason}")
    found = find_named_set_file(s.benchmark, resolve_data_dir(s.data_dir))
    if found is not None:
        data_file(found, f"benchmark {s.benchmark}:")


def eval_data_missing(benchmark: str, data_dir: str | None) -> str | None:
    """None when `rstar2 eval` can read `benchmark`'s rows: a file in the data dir, the bfcl-eval
    package, or (no file) a Hub that answers or HF_HUB_OFFLINE=1 (the datasets cache); else the
    "no data: how to add it" line."""
    from rstar2_cli.eval.benchmarks import missing_data  # lazy: pydantic via the families, for --help (cli.py)

    root = resolve_data_dir(data_dir)
    if root is not None and not root.is_dir():
        fail(f"data dir {shown(root)}: no such folder (from --data-dir or ${DATA_DIR_ENV})")
    reason = missing_data(benchmark, data_dir)
    if reason is None or benchmark == "bfcl":
        return reason
    return None if _hub_up(hub_endpoint(), os.environ.get("HF_HUB_OFFLINE", "")) else \
        f"{reason} (the Hub ({hub_endpoint()}) does not answer)"


@functools.lru_cache(maxsize=4)
def _hub_up(endpoint: str, offline_flag: str) -> bool:
    """`hub_reachable` for one endpoint and HF_HUB_OFFLINE value, probed once (`eval all` asks
    for up to seven sets)."""
    return hub_reachable()


def rl_recipe(cfg: Any) -> None:
    """An RL recipe's paths, checked on the machine that trains: the starting checkpoint, the output
    folder, the training problems (every row read) and the held-out sets (when validation is on)."""
    hint = f" (init_from: {cfg.init_from}; that stage's final checkpoint)" if cfg.init_from else ""
    model_dir(cfg.model.path, "model.path", hint=hint)
    output_dir(cfg.train.out_dir, "train.out_dir")
    problem_source(cfg.data.train, "data.train", cfg.data.data_dir)
    local = Path(cfg.data.train).expanduser()
    if not local.exists():    # a named set: its local copy, if any (a Hub set is the trainer's to load)
        local = find_named_set_file(cfg.data.train, resolve_data_dir(cfg.data.data_dir))
    if local is not None:     # every row, before an engine starts: a row without an answer would fail a step
        try:
            problems = load_problems(local)
        except DataError as e:
            fail(f"data.train: {e}")
        if not problems:
            fail(f"data.train {shown(cfg.data.train)}: no problems in it")
    if cfg.train.eval_every > 0:
        for name in cfg.train.eval_sets:
            problem_source(name, "train.eval_sets", cfg.data.data_dir)
