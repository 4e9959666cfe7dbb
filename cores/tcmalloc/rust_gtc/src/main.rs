//! heapwalk's reproducer: a Rust program on Google's tcmalloc (the tcmalloc-better crate builds it from its own
//! copy of Google's sources and links it into the program, per-CPU caches and all).  Two threads allocate
//! blocks of mixed sizes and keep half of them; then the main thread stops itself with SIGSTOP for the core.
//! heapwalk must name the allocator and say it does not decode it, never report glibc's arenas as the heap.

use std::hint::black_box;
use std::thread;

#[global_allocator]
static GLOBAL: tcmalloc_better::TCMalloc = tcmalloc_better::TCMalloc;

fn work(seed: usize) -> Vec<Vec<u8>> {
    let mut kept = Vec::new();
    for i in 0..20_000usize {
        let block = vec![(i % 251) as u8; 16 + (i * 7919 + seed) % 4000];
        if i % 2 == 0 {
            kept.push(block);
        }
    }
    kept
}

fn main() {
    let workers: Vec<_> = (0..2).map(|t| thread::spawn(move || work(t))).collect();
    let held: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    black_box(&held);
    unsafe {
        libc::raise(libc::SIGSTOP);
    }
    black_box(&held);
}
