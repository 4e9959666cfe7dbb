"""An arm64 machine that runs one command under Debian's arm64 kernel (qemu-system-aarch64, by software
emulation), for what needs an arm64 kernel: the capture's ptrace and page maps, gdb attached to a live process,
heapwalk run by arm64's own gdb and Python.

Its root is a folder of Debian bookworm's arm64 packages unpacked as that system's `/` (gdb, python3 with numpy,
busybox, and what they depend on, resolved by apt for arm64 into a private cache; rich and pygdbmi from PyPI's
wheels), shared read-only over 9p; this machine's `/` is shared read-only at /host in it (the project, the
reproducers built for arm64 and their cores), and a folder of this machine's writable at /run.  The initramfs
holds busybox and the virtio and 9p modules of the kernel's package; the command runs as root, chrooted into
the root, and the machine powers off.  The kernel is bookworm's (4 KiB pages), or trixie's built for 16 KiB
pages (`KERNELS`: the root stays bookworm's).  Usage: armvm.py --prepare [--kernel K], or armvm.py [--kernel K]
OUT_DIR COMMAND.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import lzma
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import foreign  # noqa: E402
import sysroots  # noqa: E402
import vm  # noqa: E402

#: what the root holds (apt resolves what they depend on)
PACKAGES = ("gdb", "python3", "python3-numpy", "busybox-static", "libc6-dbg", "libjemalloc2", "libtcmalloc-minimal4",
            "libmimalloc2.0")
#: what heapwalk needs from PyPI (pure Python wheels)
WHEELS = ("rich", "pygdbmi", "markdown-it-py", "mdurl", "pygments")
#: the kernels the machine boots: name -> (Debian suite, the package that depends on the image)
KERNELS = {"4k": ("bookworm", "linux-image-arm64"), "16k": ("trixie", "linux-image-arm64-16k")}
#: the kernel modules the guest loads, in order (each after those it depends on in 6.1 and 6.12), to reach the
#: shared folders
MODULES = ("virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio_pci", "netfs", "fscache", "9pnet",
           "9pnet_virtio", "9p")
INIT = """#!/bin/busybox sh
B=/bin/busybox
$B mount -t proc proc /proc
$B mount -t devtmpfs dev /dev
for n in {modules}; do $B insmod /modules/$n.ko || echo "heapwalk-vm: cannot load $n"; done
O="trans=virtio,version=9p2000.L,msize=1048576"
$B mount -t 9p -o $O,ro,cache=loose root /mnt || echo "heapwalk-vm: no root"
$B mount -t 9p -o $O,ro,cache=loose host /mnt/host || echo "heapwalk-vm: no host"
$B mount -t proc proc /mnt/proc
$B mount -t sysfs sys /mnt/sys
$B mount -t devtmpfs dev /mnt/dev
$B mount -t tmpfs tmp /mnt/tmp
$B mount -t 9p -o $O out /mnt/run || echo "heapwalk-vm: no /run"
echo "heapwalk-vm: up, kernel $($B uname -r) $($B uname -m)"
$B chroot /mnt /bin/sh /run/command
echo "heapwalk-vm: status $?"
$B poweroff -f
"""


def folder() -> Path:
    return vm.folder() / "arm64"


def _closure(packages: tuple[str, ...], suite: str = "bookworm") -> list[Path]:
    """PACKAGES of arm64 SUITE and everything they depend on, downloaded once into an apt cache of its own."""
    arch = foreign.Foreign("arm64", "aarch64-linux-gnu", suite)
    foreign._fetch(arch, ["libc6"], f"arm64-{suite}" if suite != "bookworm" else "arm64")  # lists, sources
    cache = sysroots.cache_dir() / (arch.arch if suite == "bookworm" else f"arm64-{suite}")
    archives = cache / "closure"
    (archives / "partial").mkdir(parents=True, exist_ok=True)
    options = [*sysroots._apt_options(cache), "-o", f"Dir::Cache::archives={archives}",
               "-o", f"APT::Architecture={arch.arch}", "-o", f"APT::Architectures={arch.arch}"]
    sysroots._run(["apt-get", *options, "-y", "--download-only", "--no-install-recommends", "install", *packages])
    return sorted(archives.glob("*.deb"))


def _image(debs: list[Path], package: str) -> Path:
    """The kernel image package among DEBS that PACKAGE (linux-image-arm64...) depends on."""
    meta = next(d for d in debs if d.name.startswith(package + "_"))
    depends = subprocess.run(["dpkg-deb", "-f", str(meta), "Depends"], capture_output=True, text=True,
                             check=True).stdout
    name = depends.split()[0].strip(",")
    return next(d for d in debs if d.name.startswith(name + "_"))


def prepare_root() -> Path:
    """The machine's root: the packages' closure unpacked (with the links their scripts would make: busybox as
    /bin/sh, the BLAS and LAPACK numpy loads), heapwalk's wheels in Python's dist-packages, and the folders the
    machine mounts on (made once)."""
    root = folder() / "root"
    stamp = root / ".made"
    made = hashlib.sha256((" ".join(PACKAGES + WHEELS) + "blas pyc").encode()).hexdigest()[:12]
    if stamp.exists() and stamp.read_text() == made:
        return root
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    for deb in _closure(PACKAGES):
        if not deb.name.startswith("linux-image"):
            sysroots._run(["dpkg-deb", "-x", str(deb), str(root)])
    libraries = root / "usr" / "lib" / "aarch64-linux-gnu"
    for chosen in (libraries / "blas" / "libblas.so.3", libraries / "lapack" / "liblapack.so.3"):
        if chosen.exists() and not (libraries / chosen.name).exists():   # what update-alternatives would link
            os.symlink(f"{chosen.parent.name}/{chosen.name}", libraries / chosen.name)
    for name in ("proc", "sys", "dev", "tmp", "run", "host"):
        (root / name).mkdir(exist_ok=True)
    (root / "bin").mkdir(exist_ok=True)
    if not (root / "bin" / "sh").exists():
        os.symlink("busybox", root / "bin" / "sh")
    wheels = folder() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    sysroots._run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d",
                   str(wheels), *WHEELS])
    site = root / "usr" / "lib" / "python3" / "dist-packages"
    for wheel in wheels.glob("*.whl"):
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(site)
    _compile(root)
    stamp.write_text(made)
    return root


def _compile(root: Path) -> None:
    """The root's Python modules compiled by the root's own Python (under qemu-user), as the packages' scripts
    would on installing them: each Python the machine starts reads them instead of compiling the standard
    library, numpy and rich again (8 s a start of its emulated time)."""
    arch = foreign.ARCHES["arm64"]
    python = sorted((root / "usr" / "bin").glob("python3.[0-9]*"))[-1]
    folders = [str(p) for p in (root / "usr" / "lib").glob("python3*") if p.is_dir()]
    # the folders named by this machine's paths, which qemu-user's -L does not redirect, so the files are written
    # into the root, each naming its source as the machine sees it; a module that does not compile (none in these
    # packages) is left to be compiled where it is imported
    subprocess.run([arch.qemu, "-L", str(root), str(python), "-m", "compileall", "-q", "-j0", "-s", str(root),
                    "-p", "/", *folders], capture_output=True, timeout=1800)


def prepare(flavour: str = "4k") -> tuple[Path, Path]:
    """The arm64 kernel of FLAVOUR (`KERNELS`) and its initramfs (busybox, the modules, the init), made once."""
    here = folder()
    suite, package = KERNELS[flavour]
    made = hashlib.sha256((INIT + " ".join(MODULES) + flavour).encode()).hexdigest()[:12]
    kernel, initrd = here / f"vmlinuz-{flavour}", here / f"initrd-{made}.gz"
    if kernel.exists() and initrd.exists():
        return kernel, initrd
    debs = _closure((package, "busybox-static"), suite)
    image = _image(debs, package)
    busybox = vm._deb_files(next(d for d in debs if d.name.startswith("busybox-static_")),
                            lambda n: n.endswith("/bin/busybox"))
    names = {f"{m}.ko" for m in MODULES} | {f"{m}.ko.xz" for m in MODULES}
    found = vm._deb_files(image, lambda n: n.rsplit("/", 1)[-1] in names or "/boot/vmlinuz-" in n)
    modules = {n.rsplit("/", 1)[-1].split(".ko")[0] + ".ko": lzma.decompress(data) if n.endswith(".xz") else data
               for n, data in found.items() if ".ko" in n}
    loaded = [m for m in MODULES if f"{m}.ko" in modules]     # the others are built into the kernel
    if not {"9p", "9pnet", "9pnet_virtio"} <= set(loaded) or not busybox:
        raise vm.VmError(f"{image.name} or busybox-static lacks 9p's modules or busybox")
    files: dict[str, tuple[int, bytes]] = {d: (0o040755, b"") for d in ("bin", "modules", "proc", "dev", "mnt")}
    files["bin/busybox"] = (0o100755, next(iter(busybox.values())))
    files["init"] = (0o100755, INIT.format(modules=" ".join(loaded)).encode())
    files.update({f"modules/{n}": (0o100644, data) for n, data in modules.items()})
    here.mkdir(parents=True, exist_ok=True)
    (here / "initrd.part").write_bytes(gzip.compress(vm._cpio(files), 1))
    (here / "vmlinuz.part").write_bytes(next(d for n, d in found.items() if "/boot/vmlinuz-" in n))
    os.replace(here / "initrd.part", initrd)
    os.replace(here / "vmlinuz.part", kernel)
    return kernel, initrd


def run(out: Path, command: str, memory_mib: int = 2048, cpus: int = 2, timeout: float = 1800,
        flavour: str = "4k") -> str:
    """COMMAND (a shell script's text) run as root in the arm64 machine booted with the FLAVOUR kernel, OUT (a
    folder of this machine) its /run; the console's text.  VmError when qemu is missing, the machine does not
    come up, or it does not end in TIMEOUT seconds."""
    qemu = shutil.which("qemu-system-aarch64")
    if qemu is None:
        raise vm.VmError("qemu-system-aarch64 is not installed (Debian's qemu-system-arm)")
    kernel, initrd = prepare(flavour)
    root = prepare_root()
    out.mkdir(parents=True, exist_ok=True)
    (out / "command").write_text(command)
    # every feature (16 KiB pages among them) but pointer authentication, which heapwalk does not meet (return
    # addresses on stacks) and which makes Python in the machine a third slower even by qemu's own cheap hash
    args = [qemu, "-M", "virt", "-cpu", "max,pauth=off", "-accel", "tcg", "-m", str(memory_mib), "-smp", str(cpus),
            "-nographic", "-no-reboot", "-kernel", str(kernel), "-initrd", str(initrd),
            "-append", "console=ttyAMA0 quiet panic=-1",
            "-virtfs", f"local,path={root},mount_tag=root,security_model=none,readonly=on,multidevs=remap",
            "-virtfs", "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap",
            "-virtfs", f"local,path={out},mount_tag=out,security_model=none"]
    return vm.boot(args, timeout, "the arm64 machine")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prepare", action="store_true")
    parser.add_argument("--kernel", choices=sorted(KERNELS), default=None, help="the kernel (default: every one "
                        "for --prepare, 4k to run)")
    parser.add_argument("out", type=Path, nargs="?")
    parser.add_argument("command", nargs="?")
    args = parser.parse_args(argv)
    try:
        if args.prepare or args.command is None:
            kernels = [args.kernel] if args.kernel else sorted(KERNELS)
            print(" ".join(str(p) for k in kernels for p in prepare(k)), prepare_root())
            return 0
        print(run(args.out, args.command, flavour=args.kernel or "4k"), end="")
    except (vm.VmError, sysroots.SysrootError, foreign.ForeignError) as exc:
        print(f"armvm: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
