"""A secret set in the test process's environment before the pool starts: it must never be
visible inside the sandbox. (A plain module, so its name cannot clash with other conftests.)"""
HOST_SECRET_NAME = "RSTAR2_SANDBOX_TEST_SECRET"
HOST_SECRET_VALUE = "hunter2-do-not-leak"
