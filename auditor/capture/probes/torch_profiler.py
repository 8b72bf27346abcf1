"""torch.profiler for the length of an audit: every operator and every tensor allocation and
free (profile_memory), CUDA kernels too where CUDA is available. The
stages show as `record_function` ranges (auditor.capture.stage opens them). The trace is written
where TensorBoard's PyTorch Profiler plugin (torch-tb-profiler) looks for one:

    RUN/profiler/HOST_PID.TIMESTAMP.pt.trace.json    tensorboard --logdir RUN/profiler

The profiler's own memory counts in the stages' RSS: on GradProbe with TinyStories-33M the
run's peak went from 2,213 to 2,331 MiB. Input shapes are left out because record_shapes alone
took that peak to about 3.2 GiB, and Python stacks too (with_stack=False): the Memory and
Trace views need neither. Read RSS from a run without the profiler. The trace is written
after the run record (stop, then write), so a full disk costs the trace, not the record.
Only one profiler can record per process: with one already recording, the probe reports
itself absent.
"""
from __future__ import annotations

from pathlib import Path

TRACE_FOLDER = "profiler"
TRACE_SUFFIX = ".pt.trace.json"


class TorchProfilerTrace:
    """Built (torch imported) before the run's peak counts; started as late as possible."""

    def __init__(self, folder: Path):
        self.folder = folder / TRACE_FOLDER
        self.state = {"state": "absent"}
        self._profiler = self._ready = self._stopped = None
        try:
            self._ready = self._build()
        except Exception as error:  # torch missing or broken: the run goes on without it
            self.state["reason"] = (f"torch.profiler is unavailable "
                                    f"({type(error).__name__}: {error})")

    def _build(self):
        import torch
        from torch.profiler import ProfilerActivity, profile, tensorboard_trace_handler
        self._recording = torch.autograd._profiler_enabled
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self._activities = "+".join(activity.name for activity in activities)
        self._export = tensorboard_trace_handler(str(self.folder))  # its file naming, called in write()
        return profile(activities=activities, profile_memory=True, record_shapes=False,
                       with_stack=False)

    def start(self) -> None:
        if self._ready is None:
            return
        if self._recording():
            self.state["reason"] = "another torch profiler is already recording in this process"
            return
        try:
            self._ready.start()
        except Exception as error:
            self.state["reason"] = f"torch.profiler did not start: {type(error).__name__}: {error}"
            return
        self._profiler = self._ready
        self.state = {"state": "on", "method": f"torch.profiler ({self._activities}; memory; "
                                               "stages as record_function ranges)"}

    @property
    def on(self) -> bool:
        return self._profiler is not None

    def stop(self) -> None:
        """Stop recording; the trace is written later (write), after the run record."""
        if self._profiler is not None:
            self._stopped, self._profiler = self._profiler, None
            self._stopped.stop()

    def write(self) -> str | None:
        """Write the trace of a stopped profiler; its path in the run folder (None if none was
        written). A write that fails (disk full) leaves no partial trace behind."""
        stopped, self._stopped = self._stopped, None
        if stopped is None:
            return None
        if self.folder.is_symlink():  # planted in a shared run folder: never written through
            raise OSError(f"{TRACE_FOLDER}/ in the run folder is a link, not the run's own folder")
        before = set(self._traces())
        try:
            self._export(stopped)
        except BaseException:
            for partial in set(self._traces()) - before:
                partial.unlink(missing_ok=True)
            raise
        written = sorted(set(self._traces()) - before, key=lambda p: p.stat().st_mtime)
        return f"{TRACE_FOLDER}/{written[-1].name}" if written else None

    def _traces(self) -> list[Path]:
        return list(self.folder.glob(f"*{TRACE_SUFFIX}*")) if self.folder.is_dir() else []
