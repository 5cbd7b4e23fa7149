"""What a step measures: its wall-clock sections (`timer.py`) and the additive tallies its metric
columns come from (`tally.py`), merged across rollout hosts."""
