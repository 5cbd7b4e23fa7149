"""What runs inside the jail: the zygote, its forked children and their wire format.

The jailed interpreter imports these modules (and the empty `sandbox/__init__.py` above them)
from the package directory the jail binds at /opt/rstar2/sandbox, so they import only the
standard library and each other: every module a zygote imports makes each fork and exit dearer.
"""
