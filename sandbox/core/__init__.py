"""The embedded pool (`Sandbox`) and what it is made of: the host-side handle of each zygote,
the hand-off between event loops, tier routing, sessions, limits, results and the registry of
executor-template preludes."""
