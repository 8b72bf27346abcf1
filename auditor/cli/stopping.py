"""Job commands (compare, gradprobe, train-step, validate-projection) stop alike on Ctrl-C,
SIGTERM and SIGHUP: each running child's process group gets the signal, the command reports
what finished as it does on Ctrl-C, and exits 128 + the signal (143 for SIGTERM), as a shell
shows a process the signal ended.

    @job_command
    def main(args) -> int: ...
        except KeyboardInterrupt as stop:          # Ctrl-C, or process_group.Stopped
            ...partial report...
            return exit_status(stop)

Before the command's own handling (its checks, torch's import) a stop is one line on stderr.
"""
from __future__ import annotations

import functools
import sys
from collections.abc import Callable

from auditor.capture.process_group import ending_signals, exit_status, interruption


def job_command(main: Callable[..., int]) -> Callable[..., int]:
    @functools.wraps(main)
    def stoppable(args) -> int:
        with ending_signals():
            try:
                return main(args)
            except KeyboardInterrupt as stop:  # not handled by the command: nothing had started
                print(f"auditor: {interruption(stop)}", file=sys.stderr)
                return exit_status(stop)
    return stoppable
