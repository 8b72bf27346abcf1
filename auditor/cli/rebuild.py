"""`auditor rebuild DIR [--force]`: write DIR/run.json from DIR/events.jsonl.

For a run folder whose run.json is missing: the process was killed (SIGKILL, out of memory),
or the disk filled before run.json could be written. Every finished stage is in the event
log; stages still open when it stops are listed with status "open", and a log that ends
before the run finished gives exit status "unfinished". `auditor report DIR` renders such a
folder without this step; rebuild makes the record a file others can load.

An existing run.json is kept unless --force (it is then replaced atomically, and a link planted
at its name is replaced, never written through). A damaged line in the middle of the log is
skipped: a warning on stderr and in run.json's warnings names its line. A folder
without an event log, an unreadable log and a folder that cannot be written are usage
errors: one line, exit status 2, nothing written.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from auditor.cli import BAD_INPUT, UsageError, epilog
from auditor.cli.stopping import job_command


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "rebuild", help="write a run folder's run.json from its event log (killed runs, full disks)",
        description="Write DIR/run.json from DIR/events.jsonl: for a run that was killed, or whose "
                    "run.json could not be written. Stages never finished are listed as open.",
        epilog=epilog(["auditor rebuild runs/20250101-120000-prune && auditor report runs/20250101-120000-prune"],
                      [(0, "run.json is written"), BAD_INPUT]))
    parser.add_argument("folder", metavar="DIR", help="the run folder (holding events.jsonl)")
    parser.add_argument("--force", action="store_true",
                        help="replace an existing run.json (default: keep it and stop)")
    parser.set_defaults(handler=main)


@job_command  # SIGTERM/SIGHUP end it as Ctrl-C does: no temporary output left behind
def main(args) -> int:
    from auditor.record.event_log import being_written, damaged_lines
    from auditor.record.run_folder import (
        EVENTS_FILE,
        RUN_FILE,
        RunRecordError,
        assembled,
        log_of,
        validate,
        write_json_atomically,
    )
    folder = Path(args.folder)
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise UsageError(f"run folder {args.folder!r} {what}; give the folder holding {EVENTS_FILE}")
    if not (folder / EVENTS_FILE).is_file():
        raise UsageError(f"{args.folder!r} has no {EVENTS_FILE}; give a run folder written by the auditor")
    out = folder / RUN_FILE
    if being_written(folder):  # its own run.json comes when it ends; one written now would be replaced
        raise UsageError(f"{args.folder!r} is the folder of a run still going (a running audit is writing its "
                         f"{EVENTS_FILE}); its {RUN_FILE} is written when it ends. `auditor report` shows it so far")
    if out.exists() and not args.force:
        raise UsageError(f"{str(out)!r} exists already; add --force to replace it with one "
                         f"rebuilt from {EVENTS_FILE}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write {str(out)!r}: folder {args.folder!r} is not writable")
    try:
        written = assembled(folder)  # the JSON run.json holds
        record = validate(written, log_of(folder))
    except RunRecordError as error:
        raise UsageError(str(error)) from None
    for warning in damaged_lines(folder):  # skipped; run.json's warnings say so too
        print(f"auditor: warning: {str(folder)!r}: {warning}", file=sys.stderr)
    try:
        write_json_atomically(out, written)
    except OSError as error:
        raise UsageError(f"cannot write {str(out)!r}: {error.strerror or error}") from None
    still_open = sum(1 for s in record.stages if not s.finished)
    print(f"{out}: {len(record.stages) - still_open} finished stages, {still_open} open; "
          f"exit {record.exit.status if record.exit else 'unknown'}")
    return 0
