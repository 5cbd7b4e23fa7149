"""Redis mode: HTTP front ends queue calls in Redis and worker hosts on any machine run them
(`rstar2 serve-sandbox --redis ... [--worker]`). Named `redis_mode`, not `redis`, so it can never
be mistaken for redis-py."""
