"""The zygote's slot scratch directories: removing one without importing shutil."""
from __future__ import annotations

import os


def remove_tree(path: str) -> None:
    """Delete `path` like shutil.rmtree(ignore_errors=True): bottom-up over directory fds, never
    following a symlink. Not shutil itself: importing it maps zlib, bz2 and lzma (30 of the
    zygote's ~115 memory mappings), which every fork copies and every call's exit unmaps."""
    try:
        for _, dirs, files, fd in os.fwalk(path, topdown=False):
            for name in files:
                try:
                    os.unlink(name, dir_fd=fd)
                except OSError:
                    pass
            for name in dirs:  # fwalk lists symlinks to directories here, without entering them
                try:
                    os.rmdir(name, dir_fd=fd)
                except NotADirectoryError:
                    try:
                        os.unlink(name, dir_fd=fd)
                    except OSError:
                        pass
                except OSError:
                    pass
        os.rmdir(path)
    except OSError:
        pass
