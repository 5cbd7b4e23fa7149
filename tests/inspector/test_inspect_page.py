"""The page `rstar2 inspect` writes: self-contained (no external URL), every text escaped, and the
command: path printed, bad input one line with exit status 2, --serve read-only, writing no file
and answering each step's trajectories on request."""
from __future__ import annotations

import gzip
import json
import re
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import pytest
from inspect_fixtures import serving, write_eval, write_rl_run
from typer.testing import CliRunner

from rstar2_cli.cli import app
from rstar2_cli.inspector.page import embedded_json, render_page
from rstar2_cli.inspector.reader import read_folder
from rstar2_cli.inspector.serve import make_server

EVIL = '</script><script>alert("x")</script><img src=x onerror=alert(1)> & <!--'


def embedded(html: str):
    block = re.search(r'<script type="application/json" id="rstar2-data">(.*?)</script>', html, re.DOTALL)
    return json.loads(block.group(1))


def test_the_page_loads_nothing_from_outside(tmp_path):
    html = render_page(read_folder(write_rl_run(tmp_path / "run")))
    assert not re.search(r"""(?:src|href|action)\s*=\s*["']?\s*(?:https?:)?//""", html, re.IGNORECASE)
    assert not re.search(r"<link\b|<script[^>]*\bsrc=|@import|url\(", html, re.IGNORECASE)
    # the one URL is SVG's XML namespace, which createElementNS needs and nothing fetches
    assert set(re.findall(r"https?://[^\s\"')]+", html)) == {"http://www.w3.org/2000/svg"}


def test_model_output_cannot_end_the_data_block(tmp_path):
    data = read_folder(write_rl_run(tmp_path / "run", steps=1))
    data["sections"][0]["trajectories"][0]["turns"][0]["text"] = EVIL
    data["source"] = "/runs/<b>x</b>"
    html = render_page(data)
    assert "<script>alert" not in html and "<img" not in html and "<b>x</b>" not in html
    assert html.count("</script>") == 2        # the data block's and the code's, nothing from the data
    assert embedded(html)["sections"][0]["trajectories"][0]["turns"][0]["text"] == EVIL
    assert "<" not in embedded_json({"t": "<x>"})


def test_the_script_sets_text_never_markup():
    from rstar2_cli.inspector.page import asset

    js = asset("page.js")
    assert not re.search(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(", js)


def test_nan_in_metrics_becomes_null(tmp_path):
    run = write_rl_run(tmp_path / "run", steps=1)
    (run / "metrics.jsonl").write_text('{"step": 1, "train/grad_norm": NaN}\n')
    assert embedded(render_page(read_folder(run)))["metrics"][0]["train/grad_norm"] is None


def test_the_command_prints_the_page_path(tmp_path):
    run = write_rl_run(tmp_path / "run")
    result = CliRunner().invoke(app, ["inspect", str(run)])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == str(run / "inspect.html") and (run / "inspect.html").is_file()
    out = tmp_path / "pages" / "ev.html"
    result = CliRunner().invoke(app, ["inspect", str(write_eval(tmp_path / "ev")), "--out", str(out)])
    assert result.exit_code == 0 and result.output.strip() == str(out)
    assert embedded(out.read_text())["kind"] == "eval"


def test_a_quickstart_folder_gets_a_page_for_each_of_its_rl_runs(tmp_path):
    """`rstar2 inspect runs/quickstart`: the RoC and GRPO runs (its held-out evals, under each run's
    own folder, are not runs of their own), one page each, in order."""
    qs = tmp_path / "quickstart"
    (qs / "sft").mkdir(parents=True)
    (qs / "settings.json").write_text("{}")
    roc, grpo = write_rl_run(qs / "rl_roc", steps=1), write_rl_run(qs / "rl_grpo", steps=2)
    write_eval(roc / "heldout" / "step_0000")
    result = CliRunner().invoke(app, ["inspect", str(qs)])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [f"rl_grpo: {grpo / 'inspect.html'}", f"rl_roc: {roc / 'inspect.html'}"]
    assert [len(embedded((run / "inspect.html").read_text())["sections"]) for run in (roc, grpo)] == [1, 2]
    result = CliRunner().invoke(app, ["inspect", str(qs), "--serve", "0"])
    assert result.exit_code == 2 and "holds 2 RL runs" in result.output and "--serve takes one" in result.output


@pytest.mark.parametrize("setup, message", [
    (lambda p: p / "nope", "no such folder"),
    (lambda p: (p / "empty").mkdir() or p / "empty", "neither an RL run folder"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, setup, message):
    result = CliRunner().invoke(app, ["inspect", str(setup(tmp_path))])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]


def test_a_corrupt_gz_is_one_line_and_exit_2(tmp_path):
    run = write_rl_run(tmp_path / "run")
    (run / "rollouts" / "step_000001.jsonl.gz").write_bytes(b"\x1f\x8b\x08garbage")
    result = CliRunner().invoke(app, ["inspect", str(run)])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert "step_000001.jsonl.gz: not a readable gzip file" in result.output


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_serve_answers_the_page_each_step_and_the_folder_read_only(tmp_path):
    run = write_rl_run(tmp_path / "run")
    (run / "rollouts" / "step_000003.jsonl.gz").write_bytes(b"\x1f\x8b\x08garbage")
    server = make_server(run, 0, b"<html>page</html>")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert get(base + "/") == (200, b"<html>page</html>")
        assert get(base + "/metrics.jsonl") == (200, (run / "metrics.jsonl").read_bytes())
        code, body = get(base + "/step/000002.json")
        rows = [json.loads(r) for r in gzip.open(run / "rollouts" / "step_000002.jsonl.gz", "rt")]
        assert code == 200 and json.loads(body) == {"step": 2, "total": 8, "trajectories": rows}
        code, body = get(base + "/step/000009.json")
        assert code == 404 and json.loads(body)["error"].startswith("step 9: no rollouts file")
        code, body = get(base + "/step/000003.json")                # a damaged file: one line naming it
        error = json.loads(body)["error"]
        assert code == 500 and "step_000003.jsonl.gz: not a readable gzip file" in error and "\n" not in error
        for method in ("POST", "PUT", "DELETE"):
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(urllib.request.Request(base + "/metrics.jsonl", data=b"x", method=method))
            assert e.value.code == 501
        assert get(base + "/../../etc/passwd")[0] == 404
    finally:
        server.shutdown()
        server.server_close()
    assert (run / "metrics.jsonl").read_text().startswith('{"step": 1')


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rstar2_cli.cli", "inspect", *args], capture_output=True, text=True,
                          timeout=60)


def test_a_busy_port_is_one_line_before_anything_is_written(tmp_path):
    run = write_rl_run(tmp_path / "run", steps=1)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = run_cli(str(run), "--serve", str(port))
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0
    assert done.stderr.startswith(f"error: --serve {port} on 127.0.0.1: ") and not (run / "inspect.html").exists()


def test_serve_prints_the_address_serves_steps_on_demand_writes_nothing_and_stops_on_ctrl_c(tmp_path):
    run = write_rl_run(tmp_path / "run", steps=2)
    with serving(run) as (address, _):
        code, page = get(address)
        data = embedded(page.decode())
        assert code == 200 and data["on_demand"] and data["shown"] == 0
        assert [(s["url"], s["trajectories"]) for s in data["sections"]] == [("step/000001.json", []),
                                                                           ("step/000002.json", [])]
        assert len(json.loads(get(address + data["sections"][1]["url"])[1])["trajectories"]) == 8
    assert not (run / "inspect.html").exists()


def test_out_with_serve_is_one_line_and_exit_2(tmp_path):
    done = run_cli(str(write_rl_run(tmp_path / "run", steps=1)), "--serve", "0", "--out", str(tmp_path / "p.html"))
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0 and "with --serve" in done.stderr
