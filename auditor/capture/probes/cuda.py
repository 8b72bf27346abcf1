"""CUDA memory through torch's caching allocator: allocated and reserved at stage end, peak
allocated inside the stage; optionally the allocator's history as a snapshot pickle that
pytorch.org/memory_viz opens.

The probe never imports torch nor initializes CUDA itself (a CUDA context alone costs
hundreds of MiB of host RSS): it switches on at the first stage boundary after the audited
code has initialized CUDA. Before that moment no GPU memory can exist, so stages already open
start from zero, exactly.
"""
from __future__ import annotations

import contextlib
import sys

from auditor.record.run_folder import HISTORY_FILE
from auditor.record.schema import CudaReadings

HISTORY_MAX_ENTRIES = 100_000


def initialized_cuda():
    """torch.cuda if torch is imported and CUDA is initialized, else None (never imports)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return torch.cuda if torch.cuda.is_initialized() else None
    except Exception:  # half-imported torch, bad fork: treat as absent
        return None


def absence_reason() -> str:
    torch = sys.modules.get("torch")
    if torch is None:
        return "torch was not imported by the audited code"
    try:
        if not torch.cuda.is_available():
            return "torch.cuda.is_available() is False"
    except Exception as error:
        return f"torch.cuda.is_available() failed: {error}"
    return "the audited code never initialized CUDA"


class CudaProbe:
    key = "cuda"
    ZERO = {"allocated": 0, "reserved": 0}

    def __init__(self, cuda):
        self._cuda = cuda
        self.device = f"cuda:{cuda.current_device()} ({cuda.get_device_name()})"

    def read(self) -> tuple[dict, int, int]:
        allocated = self._cuda.memory_allocated()
        values = {"allocated": allocated, "reserved": self._cuda.memory_reserved()}
        return values, allocated, self._cuda.max_memory_allocated()

    def reset(self) -> None:
        self._cuda.reset_peak_memory_stats()

    @staticmethod
    def entry(start: dict, end: dict, peak: int) -> CudaReadings:
        return CudaReadings(allocated_start=start["allocated"], allocated_end=end["allocated"],
                            reserved_end=end["reserved"], peak_allocated=peak)

    def describe(self) -> dict:
        return {"state": "on", "method": "torch.cuda memory stats", "device": self.device}

    def close(self) -> None:
        pass


class CudaHistory:
    """torch.cuda.memory._record_memory_history for the whole run (private API: gated)."""

    def __init__(self):
        self.state = {"state": "absent"}
        self._memory = None
        self._labels = False
        try:
            import torch  # asked for explicitly, so importing torch is fine here
        except ImportError:
            self.state["reason"] = "torch is not installed"
            return
        if not torch.cuda.is_available():
            self.state["reason"] = "torch.cuda.is_available() is False"
            return
        if torch.__version__ < "2.1":
            self.state["reason"] = (f"torch {torch.__version__} predates the memory-history "
                                    "API (2.1)")
            return
        try:
            torch.cuda.memory._record_memory_history(max_entries=HISTORY_MAX_ENTRIES)
        except (AttributeError, TypeError, RuntimeError) as error:
            self.state["reason"] = f"_record_memory_history failed: {error}"
            return
        self._memory = torch.cuda.memory
        self._labels = hasattr(torch.cuda.memory, "_set_memory_metadata")
        self.state = {"state": "on", "stage_labels": self._labels}

    @property
    def on(self) -> bool:
        return self._memory is not None

    def label(self, path: str | None) -> None:
        """Tag the allocations that follow with the stage path (shown in memory_viz)."""
        if self._labels:
            try:
                self._memory._set_memory_metadata(path or "")
            except (AttributeError, RuntimeError):
                self._labels = False

    def finish(self, folder) -> str | None:
        """Dump the snapshot into the run folder and stop recording; the file name or None."""
        if self._memory is None:
            return None
        memory, self._memory = self._memory, None
        try:
            memory._dump_snapshot(str(folder / HISTORY_FILE))
            return HISTORY_FILE
        except (AttributeError, RuntimeError, OSError) as error:
            self.state = {"state": "failed", "reason": f"_dump_snapshot failed: {error}"}
            return None
        finally:
            with contextlib.suppress(AttributeError, TypeError, RuntimeError):
                memory._record_memory_history(enabled=None)
