"""make test's runner shares the suite out: a short file whole, a long one by test function (every function its
source defines, timed or not), the shards balanced by the last run's times, which it records per file and per
function from the shards' JUnit reports."""

from __future__ import annotations

from pathlib import Path

import parallel


def _file(folder: Path, name: str, functions: list[str]) -> Path:
    path = folder / name
    path.write_text("import pytest\n\n" + "".join(f"def {f}():\n    pass\n\n\n" for f in functions) +
                    "def helper():\n    pass\n")
    return path


def test_a_long_file_is_shared_out_by_function_and_none_is_missed(tmp_path):
    """A file longer than SPLIT goes by function, every function its source defines; a shorter one whole."""
    long = _file(tmp_path, "test_long.py", ["test_a", "test_b", "test_c"])
    short = _file(tmp_path, "test_short.py", ["test_x", "test_y"])
    spent = parallel.SPLIT + 30
    times = {"test_long.py": spent, "test_long.py::test_a": spent - 100, "test_long.py::test_b": 40.0,
             "test_short.py": 50.0}
    units = dict(parallel.units([long, short], times))
    # test_c was never timed: it counts its share of its file's time
    assert units == {f"{long}::test_a": spent - 100, f"{long}::test_b": 40.0, f"{long}::test_c": spent / 3,
                     str(short): 50.0}
    shards = parallel.shards([long, short], times, 2)
    assert sorted(map(len, shards)) == [1, 3] and [f"{long}::test_a"] in shards


def test_a_file_whose_fixture_boots_a_machine_stays_whole(tmp_path):
    """One of WHOLE goes to one shard however long it took: shared out, each shard would boot its machine."""
    name = parallel.WHOLE[0]
    whole = _file(tmp_path, name, ["test_a", "test_b"])
    spent = parallel.SPLIT * 3
    assert parallel.units([whole], {name: spent, f"{name}::test_a": spent / 2}) == [(str(whole), spent)]


def test_the_emulated_machines_go_to_shards_of_their_own(tmp_path):
    """The files of tests/vm are placed first, each into the shard with least so far: two machines never run one
    after the other in a shard while the other shard runs none, whatever the other files' times."""
    (tmp_path / "vm").mkdir()
    arm = _file(tmp_path / "vm", "test_arm.py", ["test_a"])
    x86 = _file(tmp_path / "vm", "test_x86.py", ["test_a"])
    big = _file(tmp_path, "test_big.py", ["test_a"])
    times = {"test_arm.py": 400.0, "test_x86.py": 150.0, "test_big.py": 500.0}
    shards = parallel.shards([arm, x86, big], times, 2)
    assert sorted(shards) == sorted([[str(arm)], [str(big), str(x86)]])


def test_the_times_are_kept_per_file_and_per_function(tmp_path):
    """A report's times, per file and per function (its parameters together)."""
    report = tmp_path / "report.xml"
    report.write_text('<testsuites><testsuite tests="3">'
                      '<testcase classname="tests.test_long" name="test_a[one]" time="1.5"/>'
                      '<testcase classname="tests.test_long" name="test_a[two]" time="2.0"/>'
                      '<testcase classname="tests.test_long" name="test_b" time="0.5"/>'
                      '</testsuite></testsuites>')
    assert parallel.file_times(report) == {"test_long.py": 4.0, "test_long.py::test_a": 3.5,
                                           "test_long.py::test_b": 0.5}


def test_every_test_file_has_a_name_of_its_own():
    """The runner keeps times by file name, and pytest imports test files by their names (no package
    folders): two test files of one name in two folders would collide."""
    names = [p.name for p in (parallel.ROOT / "tests").rglob("test_*.py")]
    assert sorted(names) == sorted(set(names))
