"""The capture's pause with and without pre-copy, in the benchmark (tests/tools/bench.py): cores/glibc/scribble.c holding
MIB mebibytes, idle and busy, in Debian's kernel under qemu (cores/scripts/vm.py: soft-dirty bits, whatever this
machine's kernel is), each capture onto a disk of the machine's own (ext4, whose page cache it can give back
as a real machine does).  Software emulation runs the machine
some tens of times slower than this one: the pauses are compared with each other and with the machine's own
speed of reading (printed), not with the host's figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "cores" / "scripts"))
import vm  # noqa: E402

#: MiB a second the busy process writes, in the machine
BUSY_RATE = 1


def measure_precopy(mib: int, out: Path) -> dict:
    """The driver's figures (tests/tools/precopy_driver.py --alone --no-compare) for an idle and a busy process of
    MIB MiB, in a machine with room for the process, a core and the copies."""
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-O2", "-pthread", str(ROOT / "cores" / "glibc" / "scribble.c"), "-o", str(out / "scribble")],
                   check=True)
    runs = {"idle": 0, "busy": BUSY_RATE}
    script = f"cd {ROOT}\nexport PYTHONDONTWRITEBYTECODE=1\n" + "".join(
        f"{sys.executable} tests/tools/precopy_driver.py /var/tmp/{name} /run/scribble {mib} 8 {rate} --alone "
        f"--no-compare > /run/{name}.log 2>&1\ncp /var/tmp/{name}/result.json /run/{name}.json\n"
        f"rm -rf /var/tmp/{name}\n" for name, rate in runs.items())
    vm.run(out, script, memory_mib=mib * 3 // 2 + 2048, timeout=3 * 3600, disk_gib=mib * 3 // 1024 + 4)
    return {name: json.loads((out / f"{name}.json").read_text()) for name in runs}


def precopy_lines(result: dict) -> str:
    """The figures as lines of text."""
    lines = []
    for name, r in result.items():
        first = r["rounds"][0]
        speed = first["read"] / first["seconds"] / (1 << 20) if first["seconds"] else 0
        rate = f", writing {r['rate']} MiB/s" if r["rate"] else ""
        lines.append(f"pre-copy, {r['mib']:,} MiB process {name}{rate} (kernel {r['kernel']} in qemu, reading "
                     f"{speed:,.0f} MiB/s): pause {r['pause']:.2f} s, without pre-copy "
                     f"{r['stop_the_world_pause']:.2f} s; {r['from_copies'] / (1 << 20):,.0f} of "
                     f"{r['written'] / (1 << 20):,.0f} MiB from the copies, {len(r['rounds'])} reads while it ran "
                     f"({sum(x['seconds'] for x in r['rounds']):.1f} s), the core finished in "
                     f"{r['finish_seconds']:.1f} s after")
    return "\n".join(lines)
