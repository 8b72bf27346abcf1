"""`auditor run [options] (SCRIPT | -m MODULE | -c CODE) [ARGS...]`: run a program as python
would (`python SCRIPT ARGS`, `python -m MODULE ARGS`, `python -c CODE ARGS`: sys.argv and
sys.path[0] as python sets them, auditor.capture.staging.main_script), under audit, and write DIR/run.json
(default DIR: a new folder under runs/).

Everything the user typed is checked before anything is created: the program (the script a
file, the module found), the output folder, each --stage target and the --label function
(resolved with python's sys.path[0] for the program, as the program itself would import them).
The command exits with the program's own status; the audit never changes it (a record that
cannot be written is a warning). SIGTERM or SIGHUP while the program runs ends it as Ctrl-C
does, through an exception (unless the program installed its own handler, or the command was
started ignoring it), so its stages close and the record says "interrupted"; the command then
ends by that signal itself, as python does (a shell shows 143 or 129, 128 + the signal).
"""
from __future__ import annotations

import atexit
import contextlib
import os
import shlex
import signal
import sys
import traceback
import warnings
from pathlib import Path

from architectures.options import add_size_arguments, size_overrides
from auditor.capture.exit_status import shell_code
from auditor.capture.staging.main_script import Main
from auditor.cli import (
    BAD_INPUT,
    UsageError,
    add_model_from_argument,
    add_program_arguments,
    add_run_dir_argument,
    add_stage_argument,
    epilog,
)
from auditor.record.schema import RunRecord, RunRecordError


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "run", help="run a Python script, module (-m) or code (-c) under audit",
        usage="auditor run [options] (SCRIPT | -m MODULE | -c CODE) [ARGS...]",
        description="Run a program as python would (`python SCRIPT ARGS`, `python -m MODULE ARGS`, "
                    "`python -c CODE ARGS`), under audit; write DIR/run.json. "
                    "Under torchrun each rank writes DIR/rank-N/; workers the program starts with "
                    "torch.multiprocessing.spawn audit themselves there too (`auditor report DIR` merges them).",
        epilog=epilog(["auditor run --live-tensors --stage mylib.prune:prune_layer prune.py --sparsity 0.5",
                       "auditor run --memray --run-dir runs/prune-1 -m mylib.prune --sparsity 0.5",
                       "auditor run --stage __main__:step -c 'import torch; ...' ARG",
                       "auditor run --target llama-2-7b --model-from mylib.models:get_llm "
                       "--stage mylib.prune:prune_layer prune.py"],
                      [("N", "the program's own exit status (a record that cannot be written is a warning)"),
                       BAD_INPUT,
                       (130, "Ctrl-C or the program's KeyboardInterrupt, with its traceback and a record saying "
                             "'interrupted' (ended by SIGINT, as python is)"),
                       (143, "SIGTERM (128 + the signal, as a shell shows a process it ended), "
                             "with a record saying 'interrupted'")]))
    add_run_dir_argument(parser, "run folder (default: a new folder under runs/)", old=("--out",))
    add_stage_argument(parser)
    parser.add_argument("--label", metavar="MODULE:FUNCTION",
                        help="name each staged call with FUNCTION(target_name, args, kwargs) -> "
                             "str | None (None: the default label, the module the call worked on)")
    parser.add_argument("--memray", action="store_true",
                        help="trace native allocations with memray: top sites and a flamegraph")
    parser.add_argument("--tracemalloc", action="store_true", help="Python heap per stage")
    parser.add_argument("--census", action="store_true", help="tensor census at each stage end")
    parser.add_argument("--live-tensors", action="store_true",
                        help="exact live tensor bytes and their peak per stage (torch dispatch mode; started "
                             "once the program imports torch, never for a program without it)")
    parser.add_argument("--cuda-history", action="store_true",
                        help="record CUDA allocator history (pytorch.org/memory_viz snapshot)")
    parser.add_argument("--torch-profiler", action="store_true",
                        help="record a torch.profiler trace with memory, stages as ranges, in "
                             "DIR/profiler (tensorboard --logdir DIR/profiler)")
    parser.add_argument("--name", help="run name (default: the script's stem, the module's name, or "
                                       "'code' for -c)")
    projection = parser.add_argument_group(
        "projection to a target model (traced: the program again, on fake tensors)")
    projection.add_argument("--target", metavar="ARCH",
                            help="project the run to this architecture (a name, or a checkpoint "
                                 "folder's config); needs --model-from; turns on --census and "
                                 "--live-tensors")
    add_size_arguments(projection, prefix="target-", scale="target: ")
    projection.add_argument("--target-dtype", choices=("float32", "bfloat16", "float16"),
                            help="the target model's dtype (default: the dtype the program built)")
    add_model_from_argument(projection, "the traced runs")
    program = parser.add_argument_group("the program (exactly one; what follows it is its own arguments)")
    add_program_arguments(parser, program, "the Python script to run", modules=True)
    parser.set_defaults(handler=main)


def main(args) -> int:
    from auditor.capture.audit import Audit
    from auditor.capture.staging.call_labels import resolve_hook
    from auditor.capture.staging.spawned_ranks import carry_into_spawn
    from auditor.capture.tracing.model_from import ModelFrom
    from auditor.jobs.script_projection import Program
    from auditor.renderers import terminal
    from auditor.report_models.terminal import stage_end
    program, program_args = _program(args)
    the_command = _is_the_command()  # before the program takes __main__'s place
    if args.run_dir is not None and not args.run_dir.strip():  # Path("") is the current folder
        raise UsageError("--run-dir is empty; give a folder for the run record, or leave --run-dir out")
    name = args.name or program.name()
    target = _target_model(args)
    console = terminal.console()  # rich is imported with it, before the audit, not inside a stage
    lines = terminal.StageLines(console)  # a line per distinct stage, calls folded
    saved_path, saved_argv = list(sys.path), list(sys.argv)
    path_entry = program.path_entry()
    sys.path[0:1] = [path_entry]  # what python puts first for it
    try:
        try:
            program.check()  # a module is looked for as python -m looks, with that sys.path
            filename = program.filename()
            program.declare()  # targets may name its own functions (SCRIPT_STEM:fn, MODULE:fn, __main__:fn)
            stage_label = resolve_hook(args.label) if args.label is not None else None
            model_from = ModelFrom(args.model_from) if args.model_from else contextlib.nullcontext()
            audit = Audit(args.run_dir, name, memray=args.memray, tracemalloc=args.tracemalloc,
                          census=args.census or target is not None,
                          live_tensors=args.live_tensors or target is not None,
                          cuda_history=args.cuda_history, torch_profiler=args.torch_profiler,
                          stage_targets=args.stages, command=shlex.join(args.command_line),
                          on_stage_end=lambda entry: lines.stage_ended(stage_end(entry)),
                          stage_label=stage_label, record_sizes=target is not None)
        except ValueError as error:
            raise UsageError(str(error)) from None
        worker_options = {key: audit.options[key] for key in ("memray", "tracemalloc", "census", "live_tensors",
                                                              "cuda_history", "torch_profiler")}
        # the model's builder patched before the stages wrap it
        with _one_line_warnings(console), model_from, carry_into_spawn(audit, worker_options, args.label) as spawns:
            status, ending_signal = _run_script(audit, program, program_args, filename, lines.close)
    finally:
        sys.path[:], sys.argv = saved_path, saved_argv
    record = _typed_record(console, audit)
    try:
        _summary(console, audit, record)
        _spawned_summary(console, audit, spawns.spawned)
    except (OSError, ValueError):  # the script closed stderr: nowhere left to print
        pass
    if target is not None:
        again = Program(script=str(Path(program.script).resolve()) if program.script is not None else None,
                        module=program.module, code=program.code, args=program_args, cwd=os.getcwd(),
                        path=[path_entry])
        _project(console, audit, record, status, target, again, args)
    if ending_signal is not None and the_command:  # python ends by the signal itself
        _end_by_signal_at_exit(ending_signal)
    return status


def _program(args) -> tuple[Main, list[str]]:
    """The program to run and its own arguments; UsageError unless exactly one is given."""
    given = [what for what, value in (("SCRIPT", args.script), ("-m", args.module), ("-c", args.code))
             if value is not None]
    if not given:
        raise UsageError("run needs a script, -m MODULE or -c CODE: auditor run [options] SCRIPT [ARGS...]")
    if len(given) > 1:  # split_program gives what follows the program to it: a safeguard
        raise UsageError(f"give one program, not {' and '.join(given)}: SCRIPT, -m MODULE or -c CODE")
    if args.module is not None:
        if not args.module or not args.module[0].strip():
            raise UsageError("-m needs a module name: auditor run [options] -m MODULE [ARGS...]")
        return Main(module=args.module[0]), args.module[1:]
    if args.code is not None:
        if not args.code:
            raise UsageError("-c needs the code to run: auditor run [options] -c CODE [ARGS...]")
        return Main(code=args.code[0]), args.code[1:]
    return Main(script=args.script), list(args.args)


def _typed_record(console, audit) -> RunRecord | None:
    """The audit's record (the JSON of run.json) typed, for the summary and the projection; None
    without one. One that does not read as a run record is a warning: never the exit status."""
    if audit.record is None:
        return None
    try:
        return RunRecord.from_json(audit.record, str(audit.run_json))
    except RunRecordError as error:
        with contextlib.suppress(OSError, ValueError):  # the script closed stderr
            console.print(f"auditor: warning: {error}", markup=False, soft_wrap=True)
        return None


def _target_model(args):
    """The projection's target (None without --target); UsageError for options that cannot be."""
    from auditor.capture.tracing.model_from import TargetModel
    overrides = size_overrides(args, "target-")
    if args.target is None:
        if overrides or args.target_dtype:
            raise UsageError("--target-* options need --target ARCH, the model to project to")
        return None
    if not args.model_from:
        raise UsageError("--target needs --model-from MODULE:NAME, what builds the script's model (a "
                         "function, a class, or the object the script binds), run there at the target's sizes")
    import architectures
    try:
        architectures.config_fields(args.target, **overrides)
    except ValueError as error:  # an unknown name, an unreadable folder, a wrong size
        raise UsageError(f"--target: {error}") from None
    return TargetModel(args.target, overrides, args.target_dtype)


def _project(console, audit, record: RunRecord | None, status: int, target, program, args) -> None:
    """The traced projection after the real run; a failure is a warning, never the exit status."""
    from auditor.cli.progress import ChildProgress, stage_reader
    from auditor.jobs.script_projection import NO_STAGES, plan_for, project_program, traced_folder
    from auditor.record.run_folder import write_derived
    from auditor.renderers import terminal
    from auditor.report_models.terminal import projection_summary
    what = f"projection to {target.describe()}"
    if record is None or status != 0:
        console.print(f"auditor: {what} skipped: the script did not finish (exit status {status})",
                      markup=False)
        return
    if audit.workers_audited:  # the stages ran in the workers, which this process cannot trace
        console.print(f"auditor: {what} skipped: the script's work ran in the workers it spawned "
                      "(torch.multiprocessing); per-rank projection traces ranks started by torchrun "
                      "(torchrun ... -m auditor run --target ...)", markup=False, soft_wrap=True)
        return
    if not record.stages:  # checked before the tracing, which would find nothing to pair
        console.print(f"auditor: {what} skipped: {NO_STAGES}", markup=False, soft_wrap=True)
        return
    plan = plan_for(record, program, args.model_from, target, args.stages, args.label)
    folder = traced_folder(audit.folder, target)
    console.print(f"auditor: {what}: tracing the program on fake tensors", markup=False, soft_wrap=True)
    # the traced run repeats the real run's stages; those inside may be more (a model with more
    # layers), its top-level ones are as many: counted when there are a few, else all, roughly
    top = sum(stage.parent is None for stage in record.stages)
    by_top = top >= 3
    tracing = ChildProgress(console, "tracing", stage_reader(folder, top_level=by_top),
                            expected=top if by_top else len(record.stages), about=not by_top,
                            unit="top-level stages" if by_top else "stages")
    try:
        with tracing:
            projection = project_program(record, plan, folder)
        write_derived(audit.folder, "projections", [projection])
    except (RuntimeError, OSError, ValueError) as error:
        console.print(f"auditor: warning: {what} failed: {error}", markup=False, soft_wrap=True)
        with contextlib.suppress(OSError):  # the report says it failed, where its figure would be
            write_derived(audit.folder, "projections", [{
                "method": "traced", "target": target.describe(), "target_dtype": target.dtype,
                "model_from": args.model_from, "stages": [], "incomplete": str(error)}])
        return
    terminal.projection_summary(console, projection_summary(projection, audit.folder))


def _run_script(audit, program: Main, program_args: list[str], filename: str,
                lines_done=lambda: None) -> tuple[int, int | None]:
    """The program's exit status, as the interpreter would give it, and the signal that ended
    it (SIGINT for a KeyboardInterrupt, SIGTERM; None: none did); `filename`: its code's file
    name, where its traceback starts. `lines_done`: once the audit has ended, before the
    script's traceback is printed (the stage lines end first)."""
    # SIGTERM and SIGHUP end the program as Ctrl-C does; Ctrl-C waits for the record too
    endings = [_EndingSignal(signal.SIGTERM, holds=(signal.SIGINT,)), _EndingSignal(signal.SIGHUP)]
    created = not os.path.lexists(audit.folder)
    try:
        with _standard_streams_kept_free(), contextlib.ExitStack() as starting:
            for ending in endings:
                starting.enter_context(ending.starting())
            audit.__enter__()
    except KeyboardInterrupt:  # Ctrl-C as it starts (--census imports torch there): no empty log left
        _undo_start(Path(audit.folder), created)
        raise
    except FileExistsError:
        raise UsageError(f"output folder {str(audit.folder)!r} was taken by another run as this "
                         "one started; choose a new --run-dir") from None
    except ValueError as error:  # a stage target that cannot be patched after all: nothing written yet
        raise UsageError(str(error)) from None
    except OSError as error:  # the folder broke between the checks and now
        raise UsageError(f"cannot write the run record in {str(audit.folder)!r}: "
                         f"{error.strerror or error}") from None
    ended: BaseException | None = None
    cwd = os.getcwd()
    try:
        with contextlib.ExitStack() as interrupting:
            for ending in endings:
                interrupting.enter_context(ending.interrupting())
            program.run(program_args)
    except BaseException as raised:  # the script's own ending: the record says how it ended
        ended = raised
    finally:
        with contextlib.ExitStack() as deferred:
            for ending in endings:
                ending.ended_by_ctrl_c = isinstance(ended, KeyboardInterrupt)
                deferred.enter_context(ending.deferred())
            os.chdir(cwd)  # a script that changed folder: the paths the user gave mean what they did
            audit.__exit__(type(ended) if ended else None, ended, ended.__traceback__ if ended else None)
            _quietly(lines_done)
    return _status(ended, filename), _ending_signal(ended)


def _undo_start(folder: Path, created: bool) -> None:
    """A start stopped before the log's first line: its empty log, and the folder if this run
    made it, go (report and rebuild refuse a log without its run_started line)."""
    log = folder / "events.jsonl"
    with contextlib.suppress(OSError):
        if log.is_file() and not log.is_symlink() and log.stat().st_size == 0:
            log.unlink()
        if created:
            folder.rmdir()  # only when empty: anything else written there stays


def _ending_signal(error: BaseException | None) -> int | None:
    from auditor.capture.audit import Interrupted
    if isinstance(error, Interrupted):
        return error.signum
    return signal.SIGINT if isinstance(error, KeyboardInterrupt) else None


@contextlib.contextmanager
def _standard_streams_kept_free():
    """The audit's files (its event log, the RSS probe's clear_refs) kept off descriptors 0-2
    that the program was started without (`<&-`, `>&-`): they would take the lowest free ones,
    and a child the program starts would get the event log as its stdin and clear_refs as its
    stdout. Each closed one is held by /dev/null while the audit opens them, closed again after."""
    held = []
    for fd in range(3):
        try:
            os.fstat(fd)
        except OSError:
            held.append(os.open(os.devnull, os.O_RDWR))  # the lowest free: this one
    try:
        yield
    finally:
        for fd in held:
            os.close(fd)


def _status(error: BaseException | None, filename: str) -> int:
    from auditor.capture.audit import Interrupted
    if error is None:
        return 0
    if isinstance(error, SystemExit):
        if error.code is not None and not isinstance(error.code, int):
            print(error.code, file=sys.stderr)
        return shell_code(error.code)  # sys.exit(263) exits 7, as the OS cuts it
    if isinstance(error, Interrupted):  # ended by the signal at exit (a shell says "Terminated")
        return 128 + error.signum
    _print_script_traceback(error, filename)  # the program's own failure: show it as python would
    return 130 if isinstance(error, KeyboardInterrupt) else 1


def _is_the_command() -> bool:
    """Whether this process is the `auditor` command (`python -m auditor`, the console script),
    not a caller of auditor.cli.main in its own process (a test), which must never be ended."""
    from auditor import cli
    main_module = sys.modules.get("__main__")
    spec = getattr(main_module, "__spec__", None)
    return getattr(spec, "name", None) == "auditor.__main__" or getattr(main_module, "main", None) is cli.main


def _end_by_signal_at_exit(signum: int) -> None:
    """End as python ends a program a KeyboardInterrupt left, or one SIGTERM ended: after the
    exit handlers (the program's, logging's) have run and the output is flushed, killed by the
    signal, so the parent sees a process the signal ended (a shell: 130, 143; a shell loop
    stops; subprocess: -2, -15), not an exit status."""
    def end() -> None:
        atexit.unregister(end)
        atexit._run_exitfuncs()  # the others, in their order (this one was registered last: it runs first)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    atexit.register(end)


class _EndingSignal:
    """SIGTERM (or SIGHUP: the terminal closed) under `auditor run`. While the script runs it
    raises Interrupted in it, as Ctrl-C raises KeyboardInterrupt (a handler the script installs
    replaces ours). While the audit writes its record it waits until the record is written, then
    acts as it would have: torchrun sends one to every rank as soon as one fails, and a rank
    that had just finished must keep its record. `holds`: other signals that wait for the
    record then too (Ctrl-C). Outside the main thread, or ignored from the start, signals stay
    as they are."""

    def __init__(self, signum: int, holds: tuple[int, ...] = ()) -> None:
        self.signum, self.holds = signum, holds
        self.installed = False  # False outside the main thread: nothing to swap
        self.before = None      # the handler before the audit
        self.at_end = None      # the one in effect when the script ended: ours or the script's
        self.received = False   # a SIGTERM came while the record was being written
        self.held: list[int] = []  # signals of `holds` that came then
        self.ended_by_ctrl_c = False  # the program ended by KeyboardInterrupt: a held SIGINT is that one
        self.stopped_at_start = False  # a SIGTERM came while the audit started
        self.ignored = False    # the command was started ignoring SIGTERM: it stays ignored
        self._original = None   # the handler before `starting`

    @contextlib.contextmanager
    def interrupting(self):
        from auditor.capture.audit import Interrupted

        audited = os.getpid()

        def interrupt(signum, frame):
            if os.getpid() != audited:  # a child the script forked inherited it: act as without us
                return self._as_before(signum, frame)
            raise Interrupted(signum)
        try:
            if not self.ignored:  # ignored from the start: left so
                before = signal.signal(self.signum, interrupt)
                if before == self._stop_at_start:
                    before = self._original
                self.before = signal.SIG_DFL if before is None else before  # None: set outside Python
                self.installed = True
        except ValueError:  # not the main thread
            pass
        try:
            if self.stopped_at_start:  # before the program's first line: it ends there
                raise Interrupted(self.signum)
            yield
        finally:  # straight from one handler to the other: no moment without either
            if self.installed:
                at_end = signal.signal(self.signum, self._defer)
                self.at_end = None if at_end is interrupt else at_end

    @contextlib.contextmanager
    def starting(self):
        """While the audit starts (its folder, its log): a SIGTERM waits for it, then ends the
        program before its first line, so the record says so (it left an empty event log)."""
        self.ignored = signal.getsignal(self.signum) is signal.SIG_IGN
        if self.ignored:  # started ignoring it (nohup, trap '' TERM): python alone would go on ignoring it
            yield
            return
        try:
            original = signal.signal(self.signum, self._stop_at_start)
            self._original = signal.SIG_DFL if original is None else original  # None: set outside Python
        except ValueError:  # not the main thread
            yield
            return
        try:
            yield
        except BaseException:  # no audit: as before it
            signal.signal(self.signum, self._original)
            raise

    def _stop_at_start(self, signum, frame):
        self.stopped_at_start = True

    @contextlib.contextmanager
    def deferred(self):
        # the signals it holds wait for the record too (the run is over: it is all that is left)
        held = {}
        if self.installed:
            for signum in self.holds:
                if signal.getsignal(signum) is not signal.SIG_IGN:
                    held[signum] = signal.signal(signum, self._hold)
        try:
            yield
        finally:
            for signum, handler in held.items():
                signal.signal(signum, handler)
            if self.installed:
                signal.signal(self.signum, self.before)
                if self.received:  # the record is written: end as the signal would have
                    if self.at_end is not None:
                        signal.signal(self.signum, self.at_end)  # the script's own handler
                    signal.raise_signal(self.signum)
            for signum in self.held:
                if signum != signal.SIGINT or not self.ended_by_ctrl_c:  # not twice
                    signal.raise_signal(signum)

    def _defer(self, signum, frame):
        self.received = True

    def _hold(self, signum, frame):
        if signum not in self.held:
            self.held.append(signum)

    def _as_before(self, signum, frame):
        """The signal in a forked child, as the handler before the audit takes it: a DataLoader
        worker that its parent terminates ends by the signal, with no traceback of ours."""
        before = self.before
        signal.signal(signum, before)
        if callable(before):
            return before(signum, frame)
        if before != signal.SIG_IGN:
            signal.raise_signal(signum)  # the default: ended by it
        return None


def _print_script_traceback(error: BaseException, filename: str) -> None:
    """The traceback from the program's first frame on (its code's `filename`), without the
    auditor's frames, printed by sys.excepthook as python prints it (torch.distributed's, for
    one, prefixes `[rankN]:`). An error before its first line ran (a SyntaxError) has no frame
    of it: python shows none of its own either."""
    target = os.path.abspath(filename)
    tb = error.__traceback__
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != target:
        tb = tb.tb_next
    if tb is None:  # no frame of the program: a SyntaxError, shown without frames; else all of it
        error.with_traceback(None if isinstance(error, SyntaxError) else error.__traceback__)
    else:
        error.with_traceback(_without_auditor_frames(tb) or error.__traceback__)  # the hook prints its own
    try:
        sys.excepthook(type(error), error, error.__traceback__)
    except Exception:  # a hook that fails itself: python then prints the error plainly
        traceback.print_exception(type(error), error, error.__traceback__)


def _without_auditor_frames(tb):
    """The traceback `tb` without the auditor's frames between the script's (the wrappers of
    staged functions and of torch.multiprocessing's start_processes): as python shows it."""
    from auditor.facts.allocation_sites import is_auditor_code
    kept = []
    while tb is not None:
        if not is_auditor_code(os.path.abspath(tb.tb_frame.f_code.co_filename)):
            kept.append(tb)
        tb = tb.tb_next
    for outer, inner in zip(kept, kept[1:] + [None], strict=False):
        outer.tb_next = inner
    return kept[0] if kept else None


# -- what the user sees ------------------------------------------------------------------

def _quietly(show) -> None:
    with contextlib.suppress(OSError, ValueError):  # the script closed stderr: nowhere left to print
        show()


@contextlib.contextmanager
def _one_line_warnings(console):
    from auditor.capture.audit import AuditorWarning
    original = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, AuditorWarning):
            console.print(f"auditor: warning: {message}", markup=False, soft_wrap=True)
        else:
            original(message, category, filename, lineno, file, line)
    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = original


def _spawned_summary(console, audit, spawned: list[dict]) -> None:
    """Where the workers the script spawned wrote their records (auditor.capture.staging.spawned_ranks)."""
    for entry in spawned:
        if entry["audited"]:
            folder = Path(audit.folder) / entry["folder"]
            console.print(f"auditor: {entry['nprocs']} spawned worker(s) audited as ranks in {folder}/rank-N; "
                          f"merged report: auditor report {folder}", markup=False, soft_wrap=True)
        else:
            console.print(f"auditor: warning: {entry['nprocs']} worker(s) started with "
                          f"start_method={entry['start_method']!r} are not audited (a forked copy of "
                          "the audited process); use 'spawn' or 'forkserver'", markup=False, soft_wrap=True)


def _summary(console, audit, record: RunRecord | None) -> None:
    from auditor.renderers import terminal
    from auditor.report_models.terminal import run_summary
    if record is None:
        return
    terminal.run_summary(console, run_summary(record, audit.folder,
                                              audit.run_json if audit.record_written else None))
