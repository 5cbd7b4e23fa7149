"""Write the trajectory browser: one self-contained HTML file (no network, opens from file://).

The page is `page.html.jinja` with `page.css` and `page.js` inlined and the reader's dict
(reader.py `read_folder`) embedded as JSON in a `<script type="application/json">` block; the
script draws everything from it with DOM calls that set text, never markup. In the embedded JSON
every `<` is written `\\u003c`, so no text in it (`</script>` in a model's output) can end the
block; the title and path are HTML-escaped by Jinja's autoescape.
"""
from __future__ import annotations

import json
import math
from importlib import resources
from pathlib import Path
from typing import Any

from jinja2 import Environment
from markupsafe import Markup

from rstar2_cli.protocol.parser import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

PAGE_FILE = "inspect.html"


def asset(name: str) -> str:
    return resources.files("rstar2_cli.inspector").joinpath(name).read_text(encoding="utf-8")


def embedded_json(data: Any) -> str:
    """`data` as JSON that is safe inside a <script> element: no `<` in it at all."""
    return json.dumps(data, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")


def render_page(data: dict[str, Any]) -> str:
    """The HTML of the page for the reader's dict."""
    title = f"rstar2 inspect: {'RL run' if data['kind'] == 'rl' else 'eval'} {Path(data['source']).name}"
    payload = {**data, "tags": {"call_open": TOOL_CALL_OPEN, "call_close": TOOL_CALL_CLOSE}}
    env = Environment(autoescape=True, keep_trailing_newline=True)
    template = env.from_string(asset("page.html.jinja"))
    # css and js are ours; the JSON has no `<` (embedded_json)
    return template.render(title=title, source=data["source"], css=Markup(asset("page.css")),
                           js=Markup(asset("page.js")), data_json=Markup(embedded_json(clean(payload))))


def clean(value: Any) -> Any:
    """`value` with NaN and infinities as null (JSON has neither; metrics.jsonl may)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean(v) for v in value]
    return value


def write_page(data: dict[str, Any], out: str | Path) -> Path:
    """Write the page to `out` (folders made as needed); returns its path."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_page(data), encoding="utf-8")
    return path
