"""`rstar2 bench-tools`: the sandbox's throughput benchmarks, measured against a baseline in the
same run. Part of the CLI (the sandbox imports nothing from here): `plain` is the embedded pool or
a server against `subprocess.run`; `codejudge` the rStar release's client over HTTP; `redis_hosts`
Redis mode with 1 and 2 worker hosts against local mode."""
