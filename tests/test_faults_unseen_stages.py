"""Issue 32's fault suite, second round: stages where nobody had tried them.

Each case runs a small program alone and under `auditor run` (test_faults.Injected): stages in
asyncio tasks and decorated `async def`s, generators closed half-way, stages opened in a signal
handler, in `__del__` and a weakref finalizer, in a thread pool and in threads that die, across
`os.fork`, staged methods, classmethods and staticmethods recursing, a staged function raising
600 calls deep and caught higher up, a program that lowers and raises the recursion limit, a
nested Audit whose block ends in sys.exit while another thread opens stages, `auditor run -m
package`. For each: the same exit status, stdout and traceback as alone, no traceback of the
auditor's, a record `auditor report` reads, no finished stage lost, and what the auditor cannot
follow said in a warning.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from test_faults import Injected, audited, plain, run, shell_status, write_script
from test_faults_stages import ran_as_alone

import auditor
from auditor.renderers.markdown import render as render_markdown
from auditor.report_models.run import run_report


def _both(tmp_path: Path, text: str, *options: str, finished: list[tuple[str, str]] | None = None,
          module: str | None = None) -> Injected:
    """`text` (job.py, or run as `-m module` when given) alone, then under `auditor run OPTIONS`; each
    in a folder of its own, so what either writes is seen apart."""
    alone_dir, audited_dir = tmp_path / "alone", tmp_path / "audited"
    for folder in (alone_dir, audited_dir):
        folder.mkdir()
        for name, source in _FILES.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            write_script(folder, source, name)
        write_script(folder, text, "job.py")
    program = ["-m", module] if module else ["job.py"]
    alone = run([sys.executable, *program] if module else plain(alone_dir / "job.py"), alone_dir)
    result = run(audited("--out", tmp_path / "run", *options, *program), audited_dir)
    injected = Injected(shell_status(alone.returncode), shell_status(result.returncode), result, tmp_path / "run",
                        finished or [], alone.stderr)
    injected.alone_stdout = alone.stdout  # type: ignore[attr-defined]  # the program's own output, to compare
    return injected


_FILES = {
    "shapes.py": """
        class Tree:
            def __init__(self, n):
                self.n = n
            def depth(self, k):
                return 0 if k == 0 else 1 + self.depth(k - 1)
            @classmethod
            def build(cls, k):
                return cls(k) if k == 0 else cls.build(k - 1)
            @staticmethod
            def count(k):
                return 0 if k == 0 else 1 + Tree.count(k - 1)
        def boom(k):
            if k == 0:
                raise ValueError("bottom")
            return boom(k - 1)
    """,
    "mypkg/__init__.py": "",
    "mypkg/__main__.py": """
        import sys
        import auditor
        from mypkg import work
        with auditor.stage("main"):
            work.run()
            print("as", __name__, __spec__.name)
            sys.exit(4)
    """,
    "mypkg/work.py": """
        import auditor
        def run():
            with auditor.stage("work"):
                return bytearray(100)
    """,
}

ASYNC = """
    import asyncio, gc
    import auditor

    @auditor.stage("fetch")
    async def fetch(i):
        await asyncio.sleep(0.01)
        with auditor.stage("parse"):
            await asyncio.sleep(0.005 * i)
            return bytearray(10_000 * i)

    @auditor.stage("walk")
    async def walk(n):
        return 0 if n == 0 else 1 + await walk(n - 1)

    @auditor.stage("numbers")
    def numbers(n):
        for i in range(n):
            yield bytearray(1000 * i)

    def lines():
        with auditor.stage("lines"):
            yield "a"
            yield "b"

    async def main():
        sizes = await asyncio.gather(*(fetch(i) for i in range(4)))
        print([len(s) for s in sizes], asyncio.iscoroutinefunction(fetch), fetch.__name__)
        print(await walk(150))
        deepest = 0
        for n in range(150, 1000, 7):  # as deep as it goes alone: the same under the auditor
            try:
                await walk(n)
                deepest = n
            except RecursionError:
                break
        print("deepest", deepest)
        task = asyncio.create_task(fetch(50))
        await asyncio.sleep(0.02)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            print("cancelled")
        with auditor.stage("bad"):
            raise KeyError("k")

    async def stuck():
        with auditor.stage("stuck"):
            await asyncio.Future()
    loop = asyncio.new_event_loop()
    pending = loop.create_task(stuck())
    loop.run_until_complete(asyncio.sleep(0.01))
    loop.close()
    del pending  # python says "Task was destroyed but it is pending!" now, with the task as it is
    gc.collect()
    numbers_left = numbers(10)
    print(len(next(numbers_left)), len(next(numbers_left)))  # abandoned half-way
    reader = lines()
    print(next(reader))
    reader.close()  # GeneratorExit inside its stage: the generator ends, nothing failed
    with auditor.stage("serve"):
        asyncio.run(main())
"""

HANDLERS = """
    import concurrent.futures, gc, os, signal, sys, threading, weakref
    import auditor

    def handler(signum, frame):
        with auditor.stage("in handler"):
            print("handled", signum)
    signal.signal(signal.SIGUSR1, handler)

    class Holder:
        def __del__(self):
            with auditor.stage("in __del__"):
                print("deleted")

    def finalized():
        with auditor.stage("finalizer"):
            print("finalized")

    def work(i):
        with auditor.stage("task"):
            if i == 3:
                raise ValueError("task 3")
            return len(bytearray(100_000 * i))

    def dies():
        with auditor.stage("dying thread"):
            raise RuntimeError("in a thread")

    with auditor.stage("signals"):
        os.kill(os.getpid(), signal.SIGUSR1)
        total = sum(range(100_000))
    with auditor.stage("objects"):
        holder, other = Holder(), Holder()
        weakref.finalize(other, finalized)
        del holder, other
        gc.collect()
    with auditor.stage("pool"):
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            for future in [pool.submit(work, i) for i in range(8)]:
                try:
                    print(future.result())
                except ValueError as error:
                    print("error", error)
    threading.excepthook = lambda args: print("hook:", args.exc_type.__name__, args.exc_value)
    thread = threading.Thread(target=dies)
    thread.start(); thread.join()
    threading.excepthook = threading.__excepthook__
    thread = threading.Thread(target=dies, name="T2")  # python's own hook: its traceback on stderr
    thread.start(); thread.join()
    with auditor.stage("forks"):
        sys.stdout.flush()
        for ending in ("os._exit(3)", "sys.exit(4)"):
            pid = os.fork()
            if pid == 0:
                with auditor.stage("in the child"):
                    print("child", ending, flush=True)
                    exec(ending)
            _, status = os.waitpid(pid, 0)
            print("child ended", os.waitstatus_to_exitcode(status))
    kept = Holder()  # deleted as python exits
    print("end")
"""

NESTED = """
    import sys, threading
    import auditor
    from auditor import Audit
    with auditor.stage("before"):
        pass
    def other():
        with auditor.stage("from a thread"):
            with auditor.stage("child"):
                bytearray(10_000)
    with Audit(out="inner", tracemalloc=True):
        with auditor.stage("inside"):
            thread = threading.Thread(target=other)
            thread.start(); thread.join()
            print("nested", flush=True)
            sys.exit(9)
"""

RECURSION = """
    import sys
    import auditor
    from shapes import Tree, boom
    print("limit", sys.getrecursionlimit())  # the program's own, not what the auditor lends on top
    tree = Tree(3)
    print(tree.depth(400), Tree.build(300).n, Tree.count(350))
    try:
        boom(600)
    except ValueError as error:
        print("caught", error)
    @auditor.stage("walk")
    def walk(n):
        return 0 if n == 0 else 1 + walk(n - 1)
    def deepest(start, step):
        reached = 0
        for n in range(start, 20_000, step):
            try:
                walk(n)
                reached = n
            except RecursionError:
                return reached
    sys.setrecursionlimit(200)
    with auditor.stage("low limit"):
        print("low", deepest(20, 1))
    sys.setrecursionlimit(10_000)
    with auditor.stage("high limit"):
        print("high", deepest(4_000, 50))
    print(sys.getrecursionlimit())
    def numbers(n):  # staged by --stage job:numbers: a generator, said, not staged
        yield from range(n)
    print(sum(numbers(5)))
"""

TIMER = """
    import signal, time
    import auditor
    ticks = 0
    def tick(signum, frame):
        global ticks
        ticks += 1
        with auditor.stage("tick"):
            auditor.mark("in tick")
    signal.signal(signal.SIGALRM, tick)
    signal.setitimer(signal.ITIMER_REAL, 0.005, 0.005)  # lands inside the stages' bookkeeping too
    end, rounds = time.time() + 0.6, 0
    while time.time() < end:
        with auditor.stage("work"):
            rounds += 1
    signal.setitimer(signal.ITIMER_REAL, 0)
    with auditor.stage("quiet"):
        time.sleep(0.02)
    print("ticked", ticks > 10, rounds > 10)
"""

TRACKED = """
    import auditor
    class Unhashable:
        __hash__ = None
        def __getattr__(self, name):
            raise RuntimeError("no attributes")
        def __repr__(self):
            raise RuntimeError("no repr")
    class Unnamed:
        def __str__(self):
            raise ValueError("no str")
        __repr__ = __str__
    with auditor.stage("tracked"):
        for name, obj in [("int", 5), (None, None), (b"bytes", [1]), (Unhashable(), Unhashable()),
                          ("class", Unhashable), ("module", auditor), ("", object())]:
            auditor.track(name, obj)
        for name in (Unnamed(), b"\\xff", "", 0):
            auditor.mark(name)
        auditor.track("weights", [bytearray(10)], categories={"a": 1})
        auditor.track("other", [1], categories=5)
    print("tracked")
"""

STAGED = [f"--stage=shapes:{name}" for name in ("Tree.depth", "Tree.build", "Tree.count", "boom")] + [
    "--stage=job:numbers"]

FAULTS = {
    "asyncio tasks' stages, @auditor.stage on async def and generators": lambda tmp_path: [
        _both(tmp_path, ASYNC, finished=[("serve/fetch", "ok"), ("serve/fetch/parse", "ok"), ("lines", "ok")])],
    "stages in a signal handler, __del__, a finalizer, a thread pool, dying threads, forked children":
        lambda tmp_path: [_both(tmp_path, HANDLERS, finished=[
            ("signals", "ok"), ("signals/in handler", "ok"), ("objects/in __del__", "ok"), ("objects/finalizer", "ok"),
            ("task", "ok"), ("dying thread", "failed"), ("forks", "ok")])],
    "a nested Audit ended by sys.exit while a thread opens stages": lambda tmp_path: [
        _both(tmp_path, NESTED, finished=[("before", "ok"), ("from a thread/child", "ok")])],
    "staged method, classmethod, staticmethod recursing; recursion limit 200 then 10,000": lambda tmp_path: [
        _both(tmp_path, RECURSION, *STAGED,
              finished=[("Tree.depth", "ok"), ("Tree.build", "ok"), ("Tree.count", "ok"), ("low limit", "ok")])],
    "auditor run -m package, sys.exit inside a stage": lambda tmp_path: [
        _both(tmp_path, "", module="mypkg", finished=[("main/work", "ok")])],
    "a timer's signal handler opening a stage every 5 ms": lambda tmp_path: [
        _both(tmp_path, TIMER, finished=[("work", "ok"), ("quiet", "ok")])],
    "auditor.track of an unhashable name, odd objects and categories=5, under --census": lambda tmp_path: [
        _both(tmp_path, TRACKED, "--census", finished=[("tracked", "ok")])],
}


def _traceback(stderr: str) -> str:
    """The program's last traceback in `stderr`, from its first line to the exception's."""
    found = re.findall(r"^Traceback \(most recent call last\):\n(?:[ \[].*\n)*\S.*$", stderr, re.M)
    return found[-1] if found else ""


def _async(fault: Injected, record) -> None:
    stages = [(s.path, s.status) for s in record.stages]
    assert stages.count(("serve/fetch/parse", "ok")) == 4, stages  # four tasks' siblings, not nested in each other
    assert not any("out of order" in w or "closed on thread" in w for w in record.warnings), record.warnings
    walk = next(s for s in record.stages if s.path == "serve/walk")
    assert walk.call is not None and walk.call.recursed == 151, walk.to_json()  # one stage, as a function's
    assert walk.end_s > walk.start_s
    cancelled = [s for s in record.stages if s.path == "serve/fetch" and s.status == "failed"]
    assert len(cancelled) == 1 and "CancelledError" in (cancelled[0].error or "")
    said = [w for w in record.warnings if "'numbers' decorates a generator function" in w]
    assert said and said[0] in fault.result.stderr
    assert ("lines", "ok") in stages  # ended by GeneratorExit: closed, not failed
    assert ("stuck", "ok") in stages and any("outside the asyncio task that opened it" in w for w in record.warnings)
    destroyed = [line for line in fault.result.stderr.splitlines() if line.startswith("task: <Task pending")]
    assert len(destroyed) == 1 and "auditor" not in destroyed[0], destroyed  # the task as alone, when alone
    assert _traceback(fault.alone_stderr) == _traceback(fault.result.stderr).replace("/audited/", "/alone/")


def _handlers(fault: Injected, record) -> None:
    paths = [s.path for s in record.stages]
    assert paths.count("task") == 8, paths  # a pool thread's stages open at its top level
    assert "in the child" not in " ".join(paths)  # a forked child is not the audited process
    assert record.exit.status == "ok"


def _nested(fault: Injected, record) -> None:
    inner = auditor.load(fault.folder.parent / "audited" / "inner")
    alone = auditor.load(fault.folder.parent / "alone" / "inner")
    seen = [(s.path, s.parent, s.status) for s in inner.stages]
    assert seen == [(s.path, s.parent, s.status) for s in alone.stages], seen
    assert ("from a thread/child", "from a thread", "ok") in seen
    assert inner.exit.code == alone.exit.code == 9
    assert record.exit.code == 9


def _recursion(fault: Injected, record) -> None:
    calls = {s.path: s.call.recursed for s in record.stages if s.call is not None and s.parent is None}
    assert calls == {"Tree.depth": 401, "Tree.build": 301, "Tree.count": 351, "boom": 601}, calls
    assert [s.status for s in record.stages if s.path == "boom"] == ["failed"]
    said = [w for w in record.warnings if "'job:numbers' is a generator" in w]
    assert said and said[0] in fault.result.stderr, record.warnings


def _module(fault: Injected, record) -> None:
    assert [(s.path, s.status) for s in record.stages] == [("main", "failed"), ("main/work", "ok")]
    assert record.exit.code == 4 and fault.alone_stdout == "as __main__ mypkg.__main__\n"  # type: ignore[attr-defined]


def _tracked(fault: Injected, record) -> None:
    assert len(record.marks) == 4 and record.marks[1].name == "\\xff"
    said = [w for w in record.warnings if "categories should map attribute names" in w]
    assert len(said) == 2 and all(w in fault.result.stderr for w in said), record.warnings
    assert not any("census failed" in w for w in record.warnings), record.warnings  # the census stayed on
    assert record.stages[0].components is not None


def _timer(fault: Injected, record) -> None:
    said = [w for w in record.warnings if "opened while the auditor was measuring" in w]
    assert said and said[0] in fault.result.stderr, record.warnings  # those not recorded, counted
    assert fault.status == 0  # the handlers nested inside the bookkeeping without end: a segfault (139)


CHECKS = {
    "a timer's signal handler opening a stage every 5 ms": _timer,
    "auditor.track of an unhashable name, odd objects and categories=5, under --census": _tracked,
    "asyncio tasks' stages, @auditor.stage on async def and generators": _async,
    "stages in a signal handler, __del__, a finalizer, a thread pool, dying threads, forked children": _handlers,
    "a nested Audit ended by sys.exit while a thread opens stages": _nested,
    "staged method, classmethod, staticmethod recursing; recursion limit 200 then 10,000": _recursion,
    "auditor run -m package, sys.exit inside a stage": _module,
}


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_the_program_runs_as_alone(tmp_path, name):
    (fault,) = FAULTS[name](tmp_path)
    record = ran_as_alone(fault)
    assert render_markdown(run_report(record)).startswith("# Memory report")
    CHECKS[name](fault, record)
