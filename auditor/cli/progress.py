"""A status line for long commands: names what runs now; finished steps are printed above it
(auditor.renderers.terminal, on stderr, so stdout keeps only the command's results)."""
from __future__ import annotations


class StatusLine:
    """`with StatusLine() as advance: advance("tracing")` prints and shows each step."""

    def __enter__(self):
        from auditor.renderers.terminal import console
        self._console = console(highlight=True)
        self._status = self._console.status("starting")
        self._status.start()
        return self._advance

    def _advance(self, text: str) -> None:
        from auditor.renderers.terminal import step
        step(self._console, text)
        self._status.update(text)

    def __exit__(self, *exc) -> None:
        self._status.stop()
