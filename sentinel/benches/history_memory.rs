//! The history's memory bound: 200 workers, every tier full (14 days of samples every 10 s)
//! and every decision log at its 1000 entries, measured as live heap bytes by a counting
//! allocator. Also the size of the history file that state saves to, and how long encoding
//! and decoding take.
//!
//! `cargo bench -p astro-sentinel --bench history_memory` (target: at most 64 MiB).

use astro_sentinel::history::decisions::DecisionSource;
use astro_sentinel::history::persist::{decode, encode};
use astro_sentinel::history::sample::Sample;
use astro_sentinel::history::store::HistoryData;
use astro_sentinel::history::worker_history::WorkerHistory;
use astro_sentinel::pool::ClusterView;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Instant;

/// Counts live heap bytes.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const WORKERS: usize = 200;
const STEP_MS: u64 = 10_000;
const DAYS: u64 = 14;
const TARGET_MIB: f64 = 64.0;

/// A sample whose desired count and pods move every time (so decision logs fill up).
fn sample(i: u64, w: usize) -> Sample {
    let backlog = ((i * 7 + w as u64 * 13) % 90) as u32;
    let wanted = backlog.div_ceil(4);
    let workers = (i % 11) as u32;
    Sample {
        wanted,
        desired_replicas: wanted.clamp(1, 20),
        cluster: ClusterView {
            workers: Some(workers),
            running: Some(workers.saturating_sub(1)),
            waiting: Some((i % 5) as u32 / 4), // 1 one refresh in five
            terminating: Some((i % 7) as u32 / 6), // 1 one refresh in seven
            paused: Some(i.is_multiple_of(13)),
        },
        backlog,
        queued: backlog / 2,
        running_tasks: backlog - backlog / 2,
        running_slots: backlog - backlog / 2,
        drained: Some((i % 4) as u32),
        held_tasks: (i % 3) as u32,
        min_replicas: 1,
        max_replicas: 20,
        sync_slots: 4,
        paused: i.is_multiple_of(13),
        slot_drift: i.is_multiple_of(17).then_some(8),
    }
}

fn mib(bytes: isize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn main() {
    let before = LIVE.load(Ordering::Relaxed);
    let mut data = HistoryData::default();
    let names: Vec<String> = (0..WORKERS)
        .map(|w| format!("astro-worker-{w:03}"))
        .collect();
    for name in &names {
        data.workers.insert(name.clone(), WorkerHistory::default());
    }
    let now_ms: u64 = 1_800_000_000_000;
    let first_ms = now_ms - DAYS * 86_400_000;
    let filling = Instant::now();
    let mut at = first_ms;
    let mut i = 0u64;
    while at <= now_ms {
        for (w, history) in data.workers.values_mut().enumerate() {
            history.record(
                at,
                &sample(i, w),
                STEP_MS as u32,
                DecisionSource::AirflowApi,
            );
        }
        at += STEP_MS;
        i += 1;
    }
    let fill_time = filling.elapsed();
    let live = LIVE.load(Ordering::Relaxed) - before;

    let encoding = Instant::now();
    let bytes = encode(&data);
    let encode_time = encoding.elapsed();
    let decoding = Instant::now();
    let decoded = decode(&bytes).expect("what was just encoded decodes");
    let decode_time = decoding.elapsed();
    assert_eq!(decoded.workers.len(), WORKERS);

    println!(
        "history memory, {WORKERS} workers, {DAYS} days of samples every {} s:",
        STEP_MS / 1000
    );
    println!(
        "  samples recorded         {} per worker ({fill_time:.1?} for all)",
        i
    );
    println!(
        "  live heap                {:.1} MiB ({:.0} KiB per worker)",
        mib(live),
        live as f64 / 1024.0 / WORKERS as f64
    );
    println!(
        "  target                   <= {TARGET_MIB:.0} MiB: {}",
        if mib(live) <= TARGET_MIB {
            "met"
        } else {
            "MISSED"
        }
    );
    println!(
        "  history file             {:.1} MiB (encode {encode_time:.1?}, decode {decode_time:.1?})",
        mib(bytes.len() as isize)
    );
}
