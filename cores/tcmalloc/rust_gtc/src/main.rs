//! heapwalk's reproducer: a Rust program on Google's tcmalloc (the tcmalloc-better crate builds it from its own
//! copy of Google's sources and links it into the program).  Its one argument: the folder it writes into.  Four
//! threads allocate blocks of mixed sizes (small objects, spans of a few pages, allocations of megabytes) and keep
//! half of them; three park, holding their caches, and the fourth frees what it kept and exits.  Before them, a
//! thread alone leaks 40 blocks (small, of pages, of megabytes): it writes their addresses and sizes into
//! FOLDER/leaks.txt (hex text, which no scan takes for a pointer), clears the one array that held them, and exits;
//! nothing else ever held their addresses.  The main thread
//! then opens FOLDER/stats.json, reads tcmalloc's numeric properties (MallocExtension's) into buffers it allocated
//! before, writes them, and stops itself with SIGSTOP for the core: nothing is allocated between the reading and
//! the stop.
//!
//! The crate's static library leaves out the object whose constructor turns tcmalloc's per-CPU caches on, so the
//! program asks for them as that constructor would (TCMalloc_Internal_ForceCpuCacheActivation).  They come on
//! only where tcmalloc can register its own rseq area: with glibc 2.35 or later, under
//! GLIBC_TUNABLES=glibc.pthread.rseq=0; otherwise each thread runs on a thread cache, as the crate's users get.

use std::fs::File;
use std::hint::black_box;
use std::io::Write;
use std::sync::{Arc, Barrier};
use std::thread;

#[global_allocator]
static GLOBAL: tcmalloc_better::TCMalloc = tcmalloc_better::TCMalloc;

unsafe extern "C" {
    fn MallocExtension_Internal_GetNumericProperty(name: *const u8, len: usize, value: *mut usize) -> bool;
    fn TCMalloc_Internal_ForceCpuCacheActivation();
}

/// Every numeric property MallocExtension_Internal_GetProperties fills, in its order.
const PROPERTIES: [&str; 37] = [
    "generic.virtual_memory_used",
    "generic.physical_memory_used",
    "generic.current_allocated_bytes",
    "generic.bytes_in_use_by_app",
    "generic.heap_size",
    "generic.peak_memory_usage",
    "generic.realized_fragmentation",
    "tcmalloc.page_heap_free",
    "tcmalloc.pageheap_free_bytes",
    "tcmalloc.metadata_bytes",
    "tcmalloc.thread_cache_count",
    "tcmalloc.central_cache_free",
    "tcmalloc.transfer_cache_free",
    "tcmalloc.cpu_free",
    "tcmalloc.sharded_transfer_cache_free",
    "tcmalloc.per_cpu_caches_active",
    "tcmalloc.current_total_thread_cache_bytes",
    "tcmalloc.thread_cache_free",
    "tcmalloc.local_bytes",
    "tcmalloc.max_total_thread_cache_bytes",
    "tcmalloc.pageheap_unmapped_bytes",
    "tcmalloc.page_heap_unmapped",
    "tcmalloc.sampled_internal_fragmentation",
    "tcmalloc.external_fragmentation_bytes",
    "tcmalloc.required_bytes",
    "tcmalloc.slack_bytes",
    "tcmalloc.hard_usage_limit_bytes",
    "tcmalloc.desired_usage_limit_bytes",
    "tcmalloc.soft_limit_hits",
    "tcmalloc.hard_limit_hits",
    "tcmalloc.successful_shrinks_after_soft_limit_hit",
    "tcmalloc.successful_shrinks_after_hard_limit_hit",
    "tcmalloc.num_released_total_bytes",
    "tcmalloc.num_released_release_memory_to_system_bytes",
    "tcmalloc.num_released_process_background_actions_bytes",
    "tcmalloc.num_released_soft_limit_exceeded_bytes",
    "tcmalloc.num_released_hard_limit_exceeded_bytes",
];

/// The size of a thread's I-th block: mostly small objects, every 16th a span of pages, every 997th megabytes.
fn size_of(i: usize, seed: usize) -> usize {
    let mix = i.wrapping_mul(7919).wrapping_add(seed * 104_729);
    if i % 997 == 0 {
        (1 + mix % 3) << 20
    } else if i % 16 == 0 {
        8192 + mix % (120 * 1024)
    } else {
        16 + mix % 4000
    }
}

/// The sizes of the blocks `leak` leaks: a small object, a larger one, a span of pages, more than the largest
/// size class (a span of its own).
const LEAKED: [usize; 5] = [24, 200, 3000, 20_000, 300_000];

fn leak(folder: &str) {
    let mut held: Vec<*mut u8> = Vec::with_capacity(64);
    let mut text = String::new();
    for i in 0..40usize {
        let size = LEAKED[i % LEAKED.len()] + i;
        let block = Box::into_raw(vec![0x5au8; size].into_boxed_slice()) as *mut u8;
        held.push(block);
        text.push_str(&format!("{:x} {:x}\n", block as usize, size));
    }
    std::fs::write(std::path::Path::new(folder).join("leaks.txt"), text).unwrap();
    for slot in held.iter_mut() {
        unsafe { std::ptr::write_volatile(slot, std::ptr::null_mut()) };
    }
}

fn work(seed: usize, count: usize) -> Vec<Vec<u8>> {
    let mut kept = Vec::new();
    for i in 0..count {
        let block = vec![(i % 251) as u8; size_of(i, seed)];
        if i % 2 == 0 {
            kept.push(block);
        }
    }
    kept
}

fn main() {
    unsafe { TCMalloc_Internal_ForceCpuCacheActivation() };
    let folder = std::env::args().nth(1).unwrap_or_else(|| ".".to_string());
    let leaking = folder.clone();
    thread::spawn(move || leak(&leaking)).join().unwrap();
    let parked = Arc::new(Barrier::new(4));
    let done = Arc::new(Barrier::new(4));
    let workers: Vec<_> = (0..3)
        .map(|t| {
            let (parked, done) = (parked.clone(), done.clone());
            thread::spawn(move || {
                let kept = work(t, 20_000);
                parked.wait();
                done.wait();
                black_box(kept);
            })
        })
        .collect();
    thread::spawn(|| drop(black_box(work(7, 30_000)))).join().unwrap();
    parked.wait();

    let mut out = File::create(std::path::Path::new(&folder).join("stats.json")).unwrap();
    let mut values = [0usize; PROPERTIES.len()];
    let mut text = String::with_capacity(1 << 16);
    for (name, value) in PROPERTIES.iter().zip(values.iter_mut()) {
        unsafe { MallocExtension_Internal_GetNumericProperty(name.as_ptr(), name.len(), value) };
    }
    text.push_str("{\"properties\": {");
    for (i, (name, value)) in PROPERTIES.iter().zip(values.iter()).enumerate() {
        use std::fmt::Write as _;
        let _ = write!(text, "{}\"{}\": {}", if i > 0 { ", " } else { "" }, name, value);
    }
    text.push_str("}}\n");
    out.write_all(text.as_bytes()).unwrap();
    unsafe { libc::raise(libc::SIGSTOP) };
    done.wait();
    for w in workers {
        w.join().unwrap();
    }
}
