//! heapwalk's reproducer: a Rust service on tikv-jemallocator (jemalloc 5.3.0 linked into the program under
//! the `_rjem_` prefix, built without statistics by default) that holds what it allocated.
//!
//! Four workers each take an arena of their own (arenas.create, thread.arena, then a flush of their thread
//! cache, so that nothing the runtime allocated for them before is reused), allocate 8,000 blocks of mixed
//! sizes as cores/jemalloc/je_hold.c does, free about 60% of them in an order of their own and keep the rest.  The
//! main thread keeps 400 in an arena of its own too, then goes back to arena 0, where the runtime's own
//! allocations go.  Each notes what it holds by the usable size jemalloc gives (nallocx), its list of blocks
//! included, and the main thread writes held.json ({"held": [[arena, usable size, blocks], ...]}) from a
//! buffer it reserved before, then stops itself with SIGSTOP for the core.

use std::ffi::CStr;
use std::fs::File;
use std::io::Write;
use std::os::raw::{c_char, c_void};
use std::sync::{Arc, Barrier, Mutex};

use tikv_jemalloc_sys as je;

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const WORKERS: usize = 4;
const OBJECTS: usize = 8000;
const CLASSES: usize = 256;

/// (arena, usable size, blocks) of every thread, in a static array: noting them allocates nothing.
static HELD: Mutex<([(u32, usize, u64); CLASSES * (WORKERS + 1)], usize)> =
    Mutex::new(([(0, 0, 0); CLASSES * (WORKERS + 1)], 0));

fn ctl_write(name: &CStr, value: u32) {
    let mut v = value;
    let rc = unsafe {
        je::mallctl(name.as_ptr() as *const c_char, std::ptr::null_mut(), std::ptr::null_mut(),
                    &mut v as *mut u32 as *mut c_void, std::mem::size_of::<u32>())
    };
    assert_eq!(rc, 0, "mallctl {:?} failed", name);
}

fn ctl_read(name: &CStr) -> u32 {
    let mut v: u32 = 0;
    let mut len = std::mem::size_of::<u32>();
    let rc = unsafe {
        je::mallctl(name.as_ptr() as *const c_char, &mut v as *mut u32 as *mut c_void, &mut len,
                    std::ptr::null_mut(), 0)
    };
    assert_eq!(rc, 0, "mallctl {:?} failed", name);
    v
}

/// Moves the calling thread to an arena of its own, its thread cache emptied; returns the arena.
fn own_arena() -> u32 {
    let arena = ctl_read(c"arenas.create");
    ctl_write(c"thread.arena", arena);
    flush();
    arena
}

fn flush() {
    let rc = unsafe {
        je::mallctl(c"thread.tcache.flush".as_ptr(), std::ptr::null_mut(), std::ptr::null_mut(),
                    std::ptr::null_mut(), 0)
    };
    assert_eq!(rc, 0, "thread.tcache.flush failed");
}

fn next(state: &mut u32) -> u32 {
    *state = state.wrapping_mul(1103515245).wrapping_add(12345);
    *state >> 8
}

/// A request size: 80% 8-512 bytes, 15% up to 8 KiB, 4.7% up to 32 KiB, 0.3% 64-512 KiB.
fn request(state: &mut u32) -> usize {
    let pick = next(state) % 1000;
    (if pick < 800 {
        8 + next(state) % 505
    } else if pick < 950 {
        513 + next(state) % (8192 - 512)
    } else if pick < 997 {
        8193 + next(state) % (32768 - 8192)
    } else {
        65536 + next(state) % 458752
    }) as usize
}

fn note(arena: u32, size: usize) {
    let usize_ = unsafe { je::nallocx(size, 0) };
    let mut held = HELD.lock().unwrap();
    let (entries, n) = &mut *held;
    if let Some(e) = entries[..*n].iter_mut().find(|e| e.0 == arena && e.1 == usize_) {
        e.2 += 1;
        return;
    }
    assert!(*n < entries.len(), "too many size classes held");
    entries[*n] = (arena, usize_, 1);
    *n += 1;
}

/// Allocates N blocks, frees those the seed picks (about 60%) and keeps the rest, noting what it holds.
fn hold(seed: u32, n: usize, arena: u32) -> Vec<Option<Box<[u8]>>> {
    let mut state = seed;
    let mut blocks: Vec<Option<Box<[u8]>>> = Vec::with_capacity(n);
    for _ in 0..n {
        let size = request(&mut state);
        let mut block = vec![0u8; size].into_boxed_slice();
        block[0] = 0x33;
        blocks.push(Some(block));
    }
    for k in 0..n {
        let i = (k as u64 * 7919 % n as u64) as usize;
        if next(&mut state) % 10 < 6 {
            blocks[i] = None;
        }
    }
    note(arena, n * std::mem::size_of::<Option<Box<[u8]>>>());
    for block in blocks.iter().flatten() {
        note(arena, block.len());
    }
    blocks
}

fn main() {
    let outdir = std::env::args().nth(1).expect("usage: rust_hold OUTDIR");
    let mut text = String::with_capacity(1 << 16);
    let path = format!("{outdir}/held.json");
    let parked = Arc::new(Barrier::new(WORKERS + 1));
    let mut workers = Vec::with_capacity(WORKERS);
    for id in 0..WORKERS {
        let parked = Arc::clone(&parked);
        workers.push(std::thread::spawn(move || {
            let arena = own_arena();
            let blocks = hold((id as u32 + 1).wrapping_mul(2654435761), OBJECTS, arena);
            parked.wait();
            loop {
                std::thread::park();
                std::hint::black_box(&blocks);
            }
        }));
    }
    parked.wait();
    let arena = own_arena();
    let mine = hold(7, 400, arena);
    flush();
    ctl_write(c"thread.arena", 0);
    let held = HELD.lock().unwrap();
    text.push_str("{\"held\": [");
    for (i, (arena, size, count)) in held.0[..held.1].iter().enumerate() {
        use std::fmt::Write as _;
        write!(text, "{}[{arena}, {size}, {count}]", if i > 0 { ",\n  " } else { "" }).unwrap();
    }
    text.push_str("]}\n");
    drop(held);
    File::create(&path).and_then(|mut f| f.write_all(text.as_bytes())).expect("cannot write held.json");
    unsafe { libc::raise(libc::SIGSTOP) };
    std::hint::black_box(&mine);
    std::hint::black_box(&workers);
}
