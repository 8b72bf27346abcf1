"""torch.profiler for the length of an audit: every operator and every tensor allocation and
free (profile_memory), CUDA kernels too where CUDA is available. The
stages show as `record_function` ranges (auditor.stage opens them). The trace is written
where TensorBoard's PyTorch Profiler plugin (torch-tb-profiler) looks for one:

    RUN/profiler/HOST_PID.TIMESTAMP.pt.trace.json    tensorboard --logdir RUN/profiler

The profiler's own memory counts in the stages' RSS: on GradProbe with TinyStories-33M the
run's peak went from 2,213 to 2,331 MiB. Input shapes are left out because record_shapes alone
took that peak to about 3.2 GiB, and Python stacks too (with_stack=False): the Memory and
Trace views need neither. Read RSS from a run without the profiler. Only one profiler can record per
process: with one already recording, the probe reports itself absent.
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
        self._profiler = self._ready = None
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
        return profile(activities=activities, profile_memory=True, record_shapes=False,
                       with_stack=False, on_trace_ready=tensorboard_trace_handler(str(self.folder)))

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

    def stop(self) -> str | None:
        """Stop and write the trace; its path in the run folder (None if none was written)."""
        if self._profiler is None:
            return None
        profiler, self._profiler = self._profiler, None
        profiler.stop()  # calls tensorboard_trace_handler, which writes the file
        traces = sorted(self.folder.glob(f"*{TRACE_SUFFIX}*"), key=lambda p: p.stat().st_mtime)
        return f"{TRACE_FOLDER}/{traces[-1].name}" if traces else None
