//! heapwalk's reproducer: a Rust service on the `mimalloc` crate (mimalloc 3.3.2 compiled into the program by
//! its build script; 2.3.2 with the `v2` feature), stripped, that holds what it allocated.  It does what
//! cores/mimalloc/mi_hold.c does, in Rust and with Rust's own allocations (boxed slices through the global allocator),
//! and writes the same files, so that tests/cores/mimalloc/test_mimalloc.py checks it the same way:
//!
//! four threads allocate blocks of many sizes (small, medium, large and one huge), drop two thirds of them in a
//! scattered order and park; one more does the same alone and exits, its pages abandoned with the blocks it kept,
//! which it forgets (leaked).  Each writes ledger-N.txt: "parks"/"exits" and its default heap (mimalloc 3: its
//! theap), an "a" line per area and a "b" line per block in use from mimalloc's walk of its heap, its huge
//! block ("k"), the blocks it drops after the walk ("f"), and every block it keeps ("l").  The main thread walks
//! its own heap into ledger-main.txt, drops some of thread 0's blocks ("f"), walks every live thread's heap again
//! into snapshot-N.txt (mimalloc 3), writes stats.json (mi_version, mi_process_info, mi_stats_print_out's
//! text) and stops itself with SIGSTOP for the capture.  Continued, it runs mi_collect(true) and writes what that
//! gave back into collect.json.  Everything after the walks is written with write(2) from static buffers, in hex
//! text, which no scan takes for a pointer.

use std::cell::UnsafeCell;
use std::fmt::{self, Write as _};
use std::os::raw::{c_char, c_int, c_void};
use std::sync::{Condvar, Mutex};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const THREADS: usize = 5;
const MAIN: usize = THREADS;
const BLOCKS: usize = 20_000;
/// blocks each parked thread drops after its walk (its pages' local free lists)
const LATE: usize = 40;
/// blocks of thread 0 the main thread drops (their pages' thread-free lists)
const CROSS: usize = 60;
/// the index of the one huge block each thread keeps
const HUGE: usize = 4320;

/// The first fields of mimalloc's `mi_heap_area_t`, as its walk hands them to the visitor.
#[repr(C)]
struct Area {
    blocks: *mut c_void,
    reserved: usize,
    committed: usize,
    used: usize,
    block_size: usize,
}

type Visitor = extern "C" fn(*const c_void, *const Area, *mut c_void, usize, *mut c_void) -> bool;
type Output = extern "C" fn(*const c_char, *mut c_void);

extern "C" {
    #[cfg_attr(not(feature = "v2"), link_name = "mi_theap_visit_blocks")]
    fn mi_heap_visit_blocks(heap: *const c_void, all: bool, visitor: Visitor, arg: *mut c_void) -> bool;
    #[cfg_attr(not(feature = "v2"), link_name = "mi_theap_get_default")]
    fn mi_heap_get_default() -> *mut c_void;
    fn mi_usable_size(p: *const c_void) -> usize;
    fn mi_collect(force: bool);
    fn mi_version() -> c_int;
    fn mi_stats_print_out(out: Output, arg: *mut c_void);
    fn mi_process_info(elapsed: *mut usize, user: *mut usize, system: *mut usize, rss: *mut usize,
                       peak_rss: *mut usize, commit: *mut usize, peak_commit: *mut usize, faults: *mut usize);
}

#[cfg(feature = "v2")]
extern "C" {
    fn mi_stats_merge();
    fn mi_heap_collect(heap: *mut c_void, force: bool);
}

/// From mimalloc 3.2 each thread's statistics are the process's: nothing to merge.
#[cfg(not(feature = "v2"))]
unsafe fn mi_stats_merge() {}

/// A static each thread touches only its own part of (or the main thread once the others are parked).
struct Shared<T>(UnsafeCell<T>);
unsafe impl<T> Sync for Shared<T> {}

/// Text in a fixed buffer: formatting into it allocates nothing.
struct Text<const N: usize = { 1 << 20 }> {
    bytes: [u8; N],
    at: usize,
}

impl<const N: usize> Text<N> {
    const fn new() -> Self {
        Text { bytes: [0; N], at: 0 }
    }
}

impl<const N: usize> fmt::Write for Text<N> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.at + s.len();
        if end > self.bytes.len() {
            return Err(fmt::Error);
        }
        self.bytes[self.at..end].copy_from_slice(s.as_bytes());
        self.at = end;
        Ok(())
    }
}

const EMPTY: Text = Text::new();
static LEDGERS: Shared<[Text; THREADS + 1]> = Shared(UnsafeCell::new([EMPTY; THREADS + 1]));
static OUT: Shared<Text> = Shared(UnsafeCell::new(EMPTY));
static KEPT: Shared<[[Option<Box<[u8]>>; BLOCKS]; THREADS]> =
    Shared(UnsafeCell::new([const { [const { None }; BLOCKS] }; THREADS]));
static FOLDER: Shared<([u8; 3072], usize)> = Shared(UnsafeCell::new(([0; 3072], 0)));
static PARKED: Mutex<usize> = Mutex::new(0);
static PARKED_COND: Condvar = Condvar::new();

fn ledger(t: usize) -> &'static mut Text {
    unsafe { &mut (*LEDGERS.0.get())[t] }
}

fn kept(t: usize) -> &'static mut [Option<Box<[u8]>>; BLOCKS] {
    unsafe { &mut (*KEPT.0.get())[t] }
}

fn size_of(i: usize) -> usize {
    const SIZES: [usize; 21] = [8, 16, 24, 32, 48, 64, 96, 128, 200, 256, 400, 512, 1000, 1024, 2048, 4096, 7000,
                                8192, 20000, 65536, 100000];
    if i == HUGE {
        return 40 << 20;
    }
    if i % 97 == 0 { (300 + i % 5) << 10 } else { SIZES[i * 7919 % SIZES.len()] }
}

/// Block I, filled (but the huge block's tail: only its first 64 bytes are written).
fn allocate(i: usize) -> Box<[u8]> {
    let size = size_of(i);
    if size <= 512 << 10 {
        return vec![(i % 255 + 1) as u8; size].into_boxed_slice();
    }
    let layout = std::alloc::Layout::array::<u8>(size).unwrap();
    unsafe {
        let p = std::alloc::alloc(layout);
        assert!(!p.is_null());
        std::ptr::write_bytes(p, 1, 64);
        Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, size))
    }
}

extern "C" fn visitor(_heap: *const c_void, area: *const Area, block: *mut c_void, size: usize,
                      arg: *mut c_void) -> bool {
    let out = ledger(arg as usize);
    let a = unsafe { &*area };
    if block.is_null() {
        writeln!(out, "a {:x} {:x} {:x} {:x} {:x}", a.blocks as usize, a.reserved, a.committed, a.used,
                 a.block_size).unwrap();
    } else {
        writeln!(out, "b {:x} {:x}", block as usize, size).unwrap();
    }
    true
}

fn walk(heap: *mut c_void, t: usize) {
    unsafe { mi_heap_visit_blocks(heap, true, visitor, t as *mut c_void) };
}

/// NAME in the output folder, written from BYTES with write(2).
fn write_file(name: &str, bytes: &[u8]) {
    let mut path = [0u8; 4096];
    let (folder, n) = unsafe { &*FOLDER.0.get() };
    path[..*n].copy_from_slice(&folder[..*n]);
    path[*n] = b'/';
    path[*n + 1..*n + 1 + name.len()].copy_from_slice(name.as_bytes());
    unsafe {
        let fd = libc::open(path.as_ptr() as *const c_char, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, 0o644);
        assert!(fd >= 0, "cannot open {name}");
        assert_eq!(libc::write(fd, bytes.as_ptr() as *const c_void, bytes.len()), bytes.len() as isize);
        libc::close(fd);
    }
}

/// Thread T's ledger into KIND-T.txt (KIND-main.txt for the main thread).
fn write_ledger(t: usize, kind: &str) {
    let mut name = Text::<64>::new();
    if t == MAIN {
        write!(name, "{kind}-main.txt").unwrap();
    } else {
        write!(name, "{kind}-{t}.txt").unwrap();
    }
    let out = ledger(t);
    write_file(std::str::from_utf8(&name.bytes[..name.at]).unwrap(), &out.bytes[..out.at]);
}

/// Zeroes the stack below the caller's frame, where the calls it made left copies of block addresses: an
/// exiting thread's stack is kept for the next thread, and the leak scan reads it.
#[inline(never)]
fn scrub_stack() {
    let mut below = [0u8; 1 << 18];
    for byte in below.iter_mut() {
        unsafe { std::ptr::write_volatile(byte, 0) };
    }
    std::hint::black_box(&below);
}

fn worker(t: usize) {
    let exits = t == THREADS - 1;
    let blocks = kept(t);
    for (i, slot) in blocks.iter_mut().enumerate() {
        *slot = Some(allocate(i));
    }
    for i in 0..BLOCKS {
        let j = i * 7 % BLOCKS;
        if j % 3 != 0 {
            blocks[j] = None;
        }
    }
    let heap = unsafe { mi_heap_get_default() };
    writeln!(ledger(t), "{} {:x}", if exits { "exits" } else { "parks" }, heap as usize).unwrap();
    walk(heap, t);
    let huge = blocks[HUGE].as_ref().unwrap().as_ptr();
    writeln!(ledger(t), "k {:x} {:x}", huge as usize, unsafe { mi_usable_size(huge as *const c_void) }).unwrap();
    if !exits {
        for n in 0..LATE {
            let j = (3 + n * 3 * 37) % BLOCKS;
            writeln!(ledger(t), "f {:x}", blocks[j].as_ref().unwrap().as_ptr() as usize).unwrap();
            blocks[j] = None;
        }
    }
    for block in blocks.iter().flatten() {
        let p = block.as_ptr() as *const c_void;
        writeln!(ledger(t), "l {:x} {:x}", p as usize, unsafe { mi_usable_size(p) }).unwrap();
    }
    write_ledger(t, "ledger");
    unsafe { mi_stats_merge() };
    *PARKED.lock().unwrap() += 1;
    PARKED_COND.notify_one();
    if exits {
        for slot in blocks.iter_mut() {
            std::mem::forget(slot.take());
        }
        unsafe { std::ptr::write_bytes(blocks.as_mut_ptr(), 0, BLOCKS) };
        scrub_stack();
        return;
    }
    loop {
        unsafe { libc::pause() };
    }
}

extern "C" fn append_escaped(text: *const c_char, _arg: *mut c_void) {
    let out = unsafe { &mut *OUT.0.get() };
    for &c in unsafe { std::ffi::CStr::from_ptr(text) }.to_bytes() {
        let _ = match c {
            b'"' | b'\\' => write!(out, "\\{}", c as char),
            0..=0x1f => write!(out, "\\u{c:04x}"),
            _ => write!(out, "{}", c as char),
        };
    }
}

fn process_info() -> [usize; 8] {
    let mut v = [0usize; 8];
    let [a, b, c, d, e, f, g, h] = &mut v;
    unsafe { mi_process_info(a, b, c, d, e, f, g, h) };
    v
}

/// mimalloc's statistics and process figures at this instant, into stats.json.
fn write_stats() {
    let out = unsafe { &mut *OUT.0.get() };
    let v = process_info();
    write!(out, "{{\"version\": {}, \"process\": {{\"elapsed_msecs\": {}, \"user_msecs\": {}, \
                 \"system_msecs\": {}, \"current_rss\": {}, \"peak_rss\": {}, \"current_commit\": {}, \
                 \"peak_commit\": {}, \"page_faults\": {}}}, \"stats\": \"",
           unsafe { mi_version() }, v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]).unwrap();
    unsafe { mi_stats_print_out(append_escaped, std::ptr::null_mut()) };
    out.write_str("\"}\n").unwrap();
    write_file("stats.json", &out.bytes[..out.at]);
}

/// The process's anonymous resident bytes (RssAnon of /proc/self/status).
fn rss_anon() -> i64 {
    let mut buf = [0u8; 8192];
    let n = unsafe {
        let fd = libc::open(c"/proc/self/status".as_ptr(), libc::O_RDONLY);
        let n = libc::read(fd, buf.as_mut_ptr() as *mut c_void, buf.len());
        libc::close(fd);
        n
    };
    let status = std::str::from_utf8(&buf[..n.max(0) as usize]).unwrap_or("");
    status.lines().find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i64>().ok()).map_or(-1, |kb| kb * 1024)
}

/// The heap the first line of thread T's ledger names (kept as text only).
fn heap_of(t: usize) -> usize {
    let text = &ledger(t).bytes[..ledger(t).at];
    let line = text.split(|&c| c == b'\n').next().unwrap();
    let word = line.split(|&c| c == b' ').nth(1).unwrap();
    usize::from_str_radix(std::str::from_utf8(word).unwrap(), 16).unwrap()
}

fn main() {
    {
        let folder = std::env::args_os().nth(1).expect("usage: rust_mi FOLDER");
        let bytes = std::os::unix::ffi::OsStrExt::as_bytes(folder.as_os_str());
        let (buf, n) = unsafe { &mut *FOLDER.0.get() };
        buf[..bytes.len()].copy_from_slice(bytes);
        *n = bytes.len();
    }
    let parked: Vec<_> = (0..THREADS - 1).map(|t| std::thread::spawn(move || worker(t))).collect();
    {
        let mut count = PARKED.lock().unwrap();
        while *count < THREADS - 1 {
            count = PARKED_COND.wait(count).unwrap();
        }
    }
    // the exiting thread last, alone: none allocates after it (which would reclaim its abandoned pages)
    std::thread::spawn(|| worker(THREADS - 1)).join().unwrap();

    let heap = unsafe { mi_heap_get_default() };
    // 2.x's walk counts in use the blocks on its heap's delayed-free list (freed by other threads into its full
    // pages: each thread frees the closure std boxed for it here); a collect frees them first
    #[cfg(feature = "v2")]
    unsafe { mi_heap_collect(heap, false) };
    writeln!(ledger(MAIN), "main {:x}", heap as usize).unwrap();
    walk(heap, MAIN);
    let (mut j, mut n) = (1, 0);
    while n < CROSS {
        if let Some(block) = kept(0)[j % BLOCKS].take() {
            writeln!(ledger(MAIN), "f {:x}", block.as_ptr() as usize).unwrap();
            n += 1;
        }
        j += 3 * 53;
    }
    write_ledger(MAIN, "ledger");
    // mimalloc 3: a thread that frees a block of a page another gave up takes the page: walk again now
    if cfg!(not(feature = "v2")) {
        for t in (0..=MAIN).filter(|&t| t != THREADS - 1) {
            let heap = heap_of(t);
            ledger(t).at = 0;
            writeln!(ledger(t), "now {heap:x}").unwrap();
            walk(heap as *mut c_void, t);
            write_ledger(t, "snapshot");
        }
    }
    unsafe { mi_stats_merge() };
    write_stats();
    unsafe { libc::raise(libc::SIGSTOP) };

    let commit_before = process_info()[5];
    let before = rss_anon();
    unsafe { mi_collect(true) };
    let after = rss_anon();
    let commit_after = process_info()[5];
    let mut line = Text::<512>::new();
    writeln!(line, "{{\"rss_anon_before\": {before}, \"rss_anon_after\": {after}, \"commit_before\": {commit_before}, \
                    \"commit_after\": {commit_after}}}").unwrap();
    write_file("collect.json", &line.bytes[..line.at]);
    std::hint::black_box(&parked);
}
