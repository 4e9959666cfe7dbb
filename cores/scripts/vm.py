"""A virtual machine that runs one command under Debian's own kernel (qemu, by software emulation: the same
everywhere, where a host's /dev/kvm may be a nested hypervisor's that boots no stock kernel), for what the host's kernel cannot show: the capture's pre-copy needs the soft-dirty
bits (CONFIG_MEM_SOFT_DIRTY), which Debian's, Ubuntu's and RHEL's kernels have and a machine may lack.

The guest boots bookworm's linux-image (downloaded once with apt, cached beside the sysroots) with a small
initramfs of busybox and the virtio and 9p modules, mounts the host's / read-only over 9p (the same programs,
libraries, virtualenv and sources, at the same paths), a folder of the host's writable at /run, a tmpfs at
/dev/shm and, when asked, a disk of its own at /var/tmp (ext4: its page cache can be given back, as a
real machine's, where a tmpfs's cannot), runs the command as root, and powers off.  Usage: vm.py --prepare (the kernel and initramfs, made
once), or vm.py [--memory MiB] OUT_DIR COMMAND (prints the console).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sysroots  # noqa: E402

SUITE = "bookworm"
#: the modules the guest loads, in order, to reach the host's files over virtio's 9p transport
MODULES = ("virtio_ring", "virtio", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio_pci", "9pnet",
           "9pnet_virtio", "netfs", "fscache", "9p", "virtio_blk", "crc16", "mbcache", "jbd2", "crc32c_generic", "ext4")
#: what the guest's init does: mount the host, run the command in it (chroot), say its status, power off
INIT = """#!/bin/busybox sh
B=/bin/busybox
$B mount -t proc proc /proc
$B mount -t devtmpfs dev /dev
for n in {modules}; do $B insmod /modules/$n.ko || echo "heapwalk-vm: cannot load $n"; done
$B mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=1048576,cache=loose host /mnt || echo "heapwalk-vm: no host"
$B mount -t proc proc /mnt/proc
$B mount -t sysfs sys /mnt/sys
$B mount -t devtmpfs dev /mnt/dev
$B mount -t 9p -o trans=virtio,version=9p2000.L,msize=1048576 out /mnt/run || echo "heapwalk-vm: no /run"
$B mkdir -p /mnt/dev/shm && $B mount -t tmpfs shm /mnt/dev/shm
if [ -e /dev/vda ]; then $B mount -t ext4 /dev/vda /mnt/var/tmp || echo "heapwalk-vm: no disk"; fi
echo "heapwalk-vm: up, kernel $($B uname -r)"
$B chroot /mnt /bin/sh /run/command
echo "heapwalk-vm: status $?"
$B poweroff -f
"""


class VmError(Exception):
    """The machine cannot be made or run here."""


def folder() -> Path:
    return sysroots.cache_dir().parent / "vm"


def _cpio(files: dict[str, tuple[int, bytes]]) -> bytes:
    """A newc cpio archive of FILES (name -> (mode, bytes); mode 0o040755 for a folder)."""
    out = io.BytesIO()
    for ino, (name, (mode, data)) in enumerate([*files.items(), ("TRAILER!!!", (0, b""))], start=1):
        encoded = name.encode() + b"\0"
        fields = (ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(encoded), 0)
        out.write(b"070701" + b"".join(b"%08X" % f for f in fields) + encoded)
        out.write(b"\0" * (-(110 + len(encoded)) % 4) + data + b"\0" * (-len(data) % 4))
    return out.getvalue()


def _deb_files(deb: Path, wanted) -> dict[str, bytes]:
    """The files of DEB's data archive whose names WANTED(name) accepts."""
    listing = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True).stdout
    out = {}
    with tarfile.open(fileobj=io.BytesIO(listing)) as tar:
        for member in tar:
            if member.isfile() and wanted(member.name):
                out[member.name] = tar.extractfile(member).read()
    return out


def prepare() -> tuple[Path, Path]:
    """The guest's kernel and initramfs: made once (cached; the initramfs again when its init or modules
    change), from bookworm's linux-image-amd64 and busybox-static."""
    here = folder()
    made = hashlib.sha256((INIT + " ".join(MODULES)).encode()).hexdigest()[:12]
    kernel, initrd = here / "vmlinuz", here / f"initrd-{made}.gz"
    if kernel.exists() and initrd.exists():
        return kernel, initrd
    cache = here / "apt"        # lists of its own: make test fetches the sysroots' packages meanwhile
    meta = sysroots.fetch_deb(cache, "linux-image-amd64", SUITE)
    depends = subprocess.run(["dpkg-deb", "-f", str(meta), "Depends"], capture_output=True, text=True,
                             check=True).stdout
    package = depends.split()[0].strip(",")
    image = sysroots.fetch_deb(cache, package, SUITE)
    busybox = _deb_files(sysroots.fetch_deb(cache, "busybox-static", SUITE), lambda n: n.endswith("/bin/busybox"))
    names = {f"{m}.ko" for m in MODULES}
    found = _deb_files(image, lambda n: n.endswith(".ko") and n.rsplit("/", 1)[-1] in names or "/boot/vmlinuz-" in n)
    modules = {n.rsplit("/", 1)[-1]: data for n, data in found.items() if n.endswith(".ko")}
    missing = names - set(modules)
    if missing or not busybox:
        raise VmError(f"{package} or busybox-static lacks {sorted(missing) or 'busybox'}")
    files: dict[str, tuple[int, bytes]] = {d: (0o040755, b"") for d in ("bin", "modules", "proc", "dev", "mnt")}
    files["bin/busybox"] = (0o100755, next(iter(busybox.values())))
    files["init"] = (0o100755, INIT.format(modules=" ".join(MODULES)).encode())
    files.update({f"modules/{n}": (0o100644, data) for n, data in modules.items()})
    here.mkdir(parents=True, exist_ok=True)
    (here / "initrd.part").write_bytes(gzip.compress(_cpio(files), 1))
    (here / "vmlinuz.part").write_bytes(next(d for n, d in found.items() if "/boot/vmlinuz-" in n))
    os.replace(here / "initrd.part", initrd)
    os.replace(here / "vmlinuz.part", kernel)
    return kernel, initrd


def run(out: Path, command: str, memory_mib: int = 4096, cpus: int = 2, timeout: float = 900,
        disk_gib: int = 0) -> str:
    """COMMAND (a shell script's text) run as root in the machine, OUT (a host folder) its /run, with a disk of
    DISK_GIB GiB at /var/tmp (a sparse file in OUT, removed after); the console's text.  VmError when qemu is
    missing, the machine does not come up, or it does not end in TIMEOUT seconds."""
    qemu = shutil.which("qemu-system-x86_64")
    if qemu is None:
        raise VmError("qemu-system-x86_64 is not installed (Debian's qemu-system-x86)")
    kernel, initrd = prepare()
    out.mkdir(parents=True, exist_ok=True)
    (out / "command").write_text(command)
    args = [qemu, "-accel", "tcg", "-cpu", "max", "-m", str(memory_mib), "-smp", str(cpus), "-nographic", "-no-reboot",
            "-kernel", str(kernel), "-initrd", str(initrd), "-append", "console=ttyS0 quiet panic=-1",
            "-virtfs", "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap",
            "-virtfs", f"local,path={out},mount_tag=out,security_model=none"]
    disk = out / "disk.img"
    if disk_gib:
        with open(disk, "wb") as f:
            f.truncate(disk_gib << 30)
        subprocess.run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=1,lazy_journal_init=1", str(disk)],
                       check=True, capture_output=True)
        args += ["-drive", f"file={disk},if=virtio,format=raw,cache=unsafe"]
    try:
        return boot(args, timeout)
    finally:
        disk.unlink(missing_ok=True)


def boot(args: list[str], timeout: float, name: str = "the machine") -> str:
    """Runs qemu with ARGS to the machine's end; its console's text (VmError, naming NAME, when it does not
    come up or does not end in TIMEOUT seconds)."""
    try:
        result = subprocess.run(args, capture_output=True, text=True, errors="replace", timeout=timeout,
                                stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise VmError(f"{name} did not end within {timeout:.0f} s") from exc
    console = result.stdout + result.stderr
    if "heapwalk-vm: up" not in console:
        raise VmError(f"{name} did not come up: {console[-2000:]}")
    return console


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memory", type=int, default=4096, metavar="MiB")
    parser.add_argument("--prepare", action="store_true")
    parser.add_argument("out", type=Path, nargs="?")
    parser.add_argument("command", nargs="?")
    args = parser.parse_args(argv)
    try:
        if args.prepare or args.command is None:
            print(" ".join(str(p) for p in prepare()))
            return 0
        print(run(args.out, args.command, args.memory), end="")
    except (VmError, sysroots.SysrootError) as exc:
        print(f"vm: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
