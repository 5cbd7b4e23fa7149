"""The report folder: report.json carries the promised keys, the PNG and markdown are written."""
from __future__ import annotations

import json

from rstar2_cli.quickstart.pipeline import RlRun
from rstar2_cli.quickstart.report import write_report


def _run(label: str, ratios: list[float], accs: list[float]) -> RlRun:
    steps = [{"step": float(i + 1), "rollout/reward_mean": 0.1 * i, "rollout/tool_error_ratio_positive": r,
              "rollout/response_length_mean": 80.0} for i, r in enumerate(ratios)]
    held = [(4 * i, {"accuracy": a, "tool_error_ratio_positive": 0.0}) for i, a in enumerate(accs)]
    return RlRun(label, steps=steps, heldout=held, checkpoint=f"/ckpt/{label}", seconds=12.0)


def test_final_tool_error_ratio_is_the_second_half_mean():
    run = _run("roc", [0.4, 0.4, 0.2, 0.0], [0.3, 0.9])
    assert run.final_tool_error_ratio_positive() == 0.1
    s = run.summary()
    assert s["start_accuracy"] == 0.3 and s["final_accuracy"] == 0.9


def test_write_report_with_grpo_comparison(tmp_path):
    roc, grpo = _run("roc", [0.3, 0.1, 0.0, 0.0], [0.4, 0.95]), _run("grpo", [0.3, 0.3, 0.2, 0.1], [0.4, 0.9])
    report = {"seed": 7, "preset": "smoke", "sft_accuracy": 0.4, "final_accuracy": 0.95, "minutes": 3.0,
              "total_minutes": 5.0, "heldout_problems": 10, "heldout_samples": 1, "improvement_points": 55.0,
              "roc": roc.summary(), "grpo": grpo.summary()}
    write_report(tmp_path, report, [roc, grpo])
    saved = json.loads((tmp_path / "report.json").read_text())
    for key in ("sft_accuracy", "final_accuracy", "minutes"):
        assert saved[key] == report[key]
    for label in ("roc", "grpo"):
        assert {"final_accuracy", "tool_error_ratio_positive"} <= set(saved[label])
    assert saved["roc"]["tool_error_ratio_positive"] < saved["grpo"]["tool_error_ratio_positive"]
    assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (tmp_path / "report.md").read_text()
    assert "RoC vs plain GRPO" in md and "+55.0 points" in md


def assert_limits_hold_every_series(axes) -> None:
    """Every point of every line and band lies inside its axes' x- and y-limits."""
    import numpy as np

    for ax in axes:
        (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
        points = [np.column_stack([line.get_xdata(), line.get_ydata()]).astype(float) for line in ax.get_lines()]
        points += [path.vertices for band in ax.collections for path in band.get_paths()]
        assert points, ax.get_title()
        for p in points:
            p = p[np.isfinite(p).all(axis=1)]
            assert (p[:, 0] >= x0).all() and (p[:, 0] <= x1).all(), (ax.get_title(), (x0, x1), p[:, 0].max())
            assert (p[:, 1] >= y0).all() and (p[:, 1] <= y1).all(), (ax.get_title(), (y0, y1), p[:, 1].max())


def test_every_panel_shows_every_run_whole_even_a_higher_one_drawn_second():
    import matplotlib.pyplot as plt

    from rstar2_cli.quickstart.report import curves_figure

    roc = _run("roc", [0.05, 0.01, 0.0, 0.0, 0.0, 0.0], [0.4, 0.8, 1.0])
    grpo = _run("grpo", [0.43, 0.44, 0.45, 0.45, 0.44, 0.43], [0.4, 0.7, 0.9])   # GRPO's 43-45 %, plotted second
    grpo.steps = [dict(m, **{"rollout/response_length_mean": 80.0 + 40 * i}) for i, m in enumerate(grpo.steps)]
    fig, axes = curves_figure([roc, grpo])
    try:
        assert_limits_hold_every_series(axes)
        error_panel = next(ax for ax in axes if ax.get_title().startswith("tool-error"))
        assert error_panel.get_ylim()[0] == 0 and error_panel.get_ylim()[1] >= 45
    finally:
        plt.close(fig)


def test_the_seeds_figure_shows_every_band_whole():
    import matplotlib.pyplot as plt

    from rstar2_cli.quickstart.seeds import seeds_figure

    def method(curve, acc):
        return {"tool_error_ratio_positive_curve": curve, "heldout_accuracy_curve": [[0, 0.3], [3, acc]]}

    reports = [{"roc": method([0.05, 0.0, 0.0], 1.0), "grpo": method([0.40, 0.45, 0.44], 0.9)},
               {"roc": method([0.02, 0.01, 0.0], 0.9), "grpo": method([0.30, 0.38, 0.43], 0.8)}]
    fig, axes = seeds_figure(reports)
    try:
        assert_limits_hold_every_series(axes)
    finally:
        plt.close(fig)
