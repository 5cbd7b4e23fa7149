"""The sandbox as a code-judge compatible HTTP service (`rstar2 serve-sandbox`): the FastAPI app,
the code-judge wire models, the `RemoteSandbox` client, the release's executor template and its
client, and the entry points that build a pool for the service."""
