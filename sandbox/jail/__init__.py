"""The jail a zygote runs in: the isolation backends, the command that starts a zygote inside
one, and the probe that measures which protections are really in force."""
