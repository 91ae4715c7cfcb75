"""The benchmarks' worker protocol, parent and child: answers, errors with the child's log,
a child that dies, a child asked to set up while the parent works."""

import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import workers  # noqa: E402

CHILD = textwrap.dedent("""
    import sys
    import workers

    def square(payload):
        return {"square": payload["x"] ** 2}

    def fail(payload):
        print("the child's own log line", file=sys.stderr)
        raise ValueError("no such sentence")

    print("a library's chatter on stdout")
    workers.serve({"square": square, "fail": fail, "die": lambda _: sys.exit(3)},
                  ready={"pid_ready": True})
""")


@pytest.fixture
def child(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    return [sys.executable, str(script)]


def test_a_worker_answers_its_commands_and_reports_a_failure_with_its_log(child, tmp_path):
    worker = workers.Worker(child, log=tmp_path / "child.log")
    assert worker.ready == {"pid_ready": True}
    assert worker.ask("square", {"x": 7}) == {"square": 49}
    with pytest.raises(workers.WorkerError) as error:
        worker.ask("fail")
    assert "ValueError: no such sentence" in str(error.value)
    assert "the child's own log line" in str(error.value)
    assert worker.ask("square", {"x": -3}) == {"square": 9}  # it still serves
    with pytest.raises(workers.WorkerError, match="unknown command 'cube'"):
        worker.ask("cube", {"x": 2})
    worker.close()
    assert worker.proc.returncode == 0


def test_a_dead_worker_is_an_error_not_a_hang(child, tmp_path):
    with workers.Worker(child, log=tmp_path / "child.log", wait=False) as worker:
        assert worker.ready is None
        assert worker.wait_ready() == {"pid_ready": True}
        with pytest.raises(workers.WorkerError, match="ended without an answer"):
            worker.ask("die")
    assert worker.proc.returncode == 3


def test_run_once_returns_the_one_result_or_raises(tmp_path):
    script = tmp_path / "once.py"
    script.write_text("import sys, workers\nworkers.emit({'n': 2})\nsys.exit(int(sys.argv[1]))\n")
    assert workers.run_once([sys.executable, str(script), "0"]) == {"n": 2}
    with pytest.raises(workers.WorkerError, match="exited with 5"):
        workers.run_once([sys.executable, str(script), "5"])
