"""`rstar2 inspect`: read an RL run's or an eval's trajectories (reader.py, eval_rows.py) and write one
self-contained HTML page to browse them (page.py, with page.html.jinja, page.css, page.js); serve.py
serves it with the folder read-only. Reads files only: imports neither rl/ nor rollout/."""
