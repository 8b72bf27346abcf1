"""Start one command, wait for it, and write its own peak RSS, CPU and wall time as JSON.

    python -I -S launcher.py REPORT.json COMMAND [ARGS...]

Why a launcher between the auditor and the command: on Linux a process's `ru_maxrss` starts
from the high-water mark of the memory it was forked from (fork copies the parent's pages into
the child's count, and vfork + exec carries the parent's high-water mark over), so a command
started straight from a large parent (an auditor with torch imported, a test runner) reports
at least the parent's size. This interpreter, started without site packages, is ~10 MiB; the
command forked from it reports its own peak, read exactly by `os.wait4` for that one pid (not
`RUSAGE_CHILDREN`, a maximum over every child ever waited for).

Standard library only, and nothing imported that the command would pay for.

Signals: the auditor starts this launcher as the leader of a process group of its own and,
when stopped, signals that whole group, so the command gets SIGTERM, SIGHUP or Ctrl-C itself,
once; the launcher stays to report how it ended. Its parent's death (even by SIGKILL) comes as
PARENT_DIED (set by the auditor with PR_SET_PDEATHSIG): the group then gets SIGTERM, and SIGKILL
after GRACE_S.
"""
import json
import os
import signal
import sys
import time

PARENT_DIED = signal.SIGUSR2  # a signal the auditor never sends the group
GRACE_S = 10


def main() -> int:
    report, command = sys.argv[1], sys.argv[2:]
    parent = os.getppid()
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):  # the command got it too; reset at exec
        signal.signal(signum, lambda *_: None)
    signal.signal(PARENT_DIED, _end_group)
    signal.signal(signal.SIGALRM, lambda *_: os.killpg(0, signal.SIGKILL))
    started = time.perf_counter()
    try:
        pid = os.posix_spawnp(command[0], command, os.environ)
    except OSError as error:
        _write(report, {"error": f"cannot start {command[0]!r}: {error.strerror or error}"})
        return 127
    if os.getppid() != parent:  # the auditor died while the command started
        _end_group()
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - started
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    _write(report, {"exit_status": os.waitstatus_to_exitcode(status), "peak_rss": usage.ru_maxrss * scale,
                    "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime})
    return 0


def _end_group(*_) -> None:
    os.killpg(0, signal.SIGTERM)  # this launcher included: it ignores it
    signal.alarm(GRACE_S)


def _write(path: str, data: dict) -> None:
    with open(path, "w") as file:
        json.dump(data, file)


if __name__ == "__main__":
    sys.exit(main())
