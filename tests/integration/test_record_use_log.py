"""The recorder-use log that lets .ci/run rerun only the backend-dependent test files with the other backend."""
import subprocess
import sys

from memlens.recording import recorder


def test_choosing_a_backend_logs_the_running_test(tmp_path, monkeypatch):
    log = tmp_path / "use.log"
    monkeypatch.setenv("MEMLENS_RECORDER_USE_LOG", str(log))
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/test_a.py::test_b[x] (call)")
    assert recorder.choose_backend("python")[0] == "python"
    assert recorder.choose_backend("python")[0] == "python"
    assert log.read_text() == "tests/test_a.py::test_b[x] (call)\n" * 2


def test_a_subprocess_inherits_the_test_id(tmp_path, monkeypatch):
    log = tmp_path / "use.log"
    monkeypatch.setenv("MEMLENS_RECORDER_USE_LOG", str(log))
    code = "from memlens.recording import recorder; recorder.choose_backend('python')"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    assert log.read_text().startswith("tests/integration/test_record_use_log.py::test_a_subprocess_inherits_the_test_id")


def test_nothing_is_written_without_both_variables(tmp_path, monkeypatch):
    log = tmp_path / "use.log"
    monkeypatch.delenv("MEMLENS_RECORDER_USE_LOG", raising=False)
    recorder.choose_backend("python")
    monkeypatch.setenv("MEMLENS_RECORDER_USE_LOG", str(log))
    monkeypatch.delenv("PYTEST_CURRENT_TEST", raising=False)
    recorder.choose_backend("python")
    assert not log.exists()


def test_an_unwritable_log_never_fails_the_choice(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMLENS_RECORDER_USE_LOG", str(tmp_path / "no" / "such" / "dir" / "use.log"))
    assert recorder.choose_backend("python") == ("python", None, None)
