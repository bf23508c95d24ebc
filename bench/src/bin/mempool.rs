//! Mempool benchmark: bulk-32 get+put through the per-thread cache, the same
//! with the cache disabled (the shared MPMC ring only), and `Box` alloc/free
//! of an object of the same size, side by side in one pinned run.
//!
//! ```text
//! cargo run --release -p ntbdk-bench --bin mempool [-- --elt-size 2048 --objects 8388608 --runs 5]
//! ```
//!
//! Floors (issue 3): cached bulk-32 at least 5x faster per object than `Box`
//! alloc/free, and at least 2x faster than the uncached path.

use std::hint::black_box;
use std::mem::MaybeUninit;
use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use ntbdk_bench::{
    Row, check_floor, command_line, describe_machine, median, pin, print_floor_header, print_table,
};
use ntbdk_mempool::{ObjIdx, Pool, PoolOptions, ZoneOptions};

/// Objects per bulk operation.
const BULK: usize = 32;
/// Object size the `Box` case allocates (the pool's is `--elt-size`).
const BOX_ELT: usize = 2048;

#[derive(Parser, Debug)]
#[command(about = "ntbdk-mempool: cached vs uncached bulk get/put vs Box alloc/free")]
struct Args {
    /// Object size in bytes (the Box case always uses 2048).
    #[arg(long, default_value_t = BOX_ELT)]
    elt_size: usize,
    /// Objects in each pool.
    #[arg(long, default_value_t = 8192)]
    count: u32,
    /// Per-thread cache size of the cached pool.
    #[arg(long, default_value_t = 256)]
    cache: usize,
    /// Objects moved (got and put back) per run of each pool case.
    #[arg(long, default_value_t = 1 << 23)]
    objects: u64,
    /// Runs per case; the median is reported.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// 4 KiB pages instead of 2 MiB hugepages (which fall back to 4 KiB
    /// pages anyway when none are reserved).
    #[arg(long)]
    no_huge: bool,
}

/// `objects` objects taken and returned in bulks of 32.
fn pool_run(name: &str, pool: &Pool, objects: u64) -> Row {
    let mut hs = [ObjIdx::default(); BULK];
    let iters = objects / BULK as u64;
    let t = Instant::now();
    for _ in 0..iters {
        pool.get_bulk(black_box(&mut hs)).expect("pool exhausted");
        // SAFETY: the 32 handles just taken, returned once.
        unsafe { pool.put_bulk(black_box(&hs)) };
    }
    Row {
        name: name.into(),
        ops: iters * BULK as u64,
        elapsed: t.elapsed(),
    }
}

/// `objects` 2 KiB boxes allocated and freed, 32 alive at a time (as a bulk
/// get holds them). `new_uninit`: the allocation is measured, not a memset
/// the pool does not do either.
fn box_run(objects: u64) -> Row {
    let iters = objects / BULK as u64;
    let t = Instant::now();
    for _ in 0..iters {
        let boxes: [Box<MaybeUninit<[u8; BOX_ELT]>>; BULK] =
            std::array::from_fn(|_| Box::new_uninit());
        drop(black_box(boxes));
    }
    Row {
        name: format!("Box<[u8; {BOX_ELT}]> alloc+free"),
        ops: iters * BULK as u64,
        elapsed: t.elapsed(),
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let machine = describe_machine();
    let pinned = pin(0);
    let zone_opts = if args.no_huge {
        ZoneOptions::no_huge()
    } else {
        ZoneOptions::huge_or_fallback()
    };
    let make = |name: &str, cache: usize, track_state: bool| {
        let opts = PoolOptions {
            cache_size: cache,
            track_state,
            ..PoolOptions::new(args.elt_size, args.count)
        };
        Pool::create(name, &opts, &zone_opts).with_context(|| format!("creating pool {name}"))
    };
    // The lean data-path configuration, and the default one that keeps a
    // state byte per object to catch misuse.
    let cached = make("bench-cached", args.cache, false)?;
    let uncached = make("bench-uncached", 0, false)?;
    let cached_t = make("bench-cached-tracked", args.cache, true)?;
    let uncached_t = make("bench-uncached-tracked", 0, true)?;

    println!("## ntbdk-mempool benchmark\n");
    println!("- machine: {machine}");
    println!("- command: `{}`", command_line("mempool"));
    println!(
        "- pinned to core 0: {pinned}; pools of {} x {} B objects on {} pages; bulk {BULK}; \
         cache {} (cached pool); {} objects per run, median of {} runs",
        args.count,
        args.elt_size,
        cached.zone().page_size(),
        args.cache,
        args.objects,
        args.runs
    );

    let cases = [
        (
            format!("ntbdk cached bulk-{BULK} (cache {})", args.cache),
            &cached,
        ),
        (format!("ntbdk uncached bulk-{BULK} (ring only)"), &uncached),
        (
            format!(
                "ntbdk cached bulk-{BULK} (cache {}), state tracked",
                args.cache
            ),
            &cached_t,
        ),
        (
            format!("ntbdk uncached bulk-{BULK} (ring only), state tracked"),
            &uncached_t,
        ),
    ];
    // Warm up: fault in the caches, the rings, the allocator.
    for (name, pool) in &cases {
        pool_run(name, pool, 1 << 16);
    }
    box_run(1 << 16);
    // The cache's counts from here on (the warm-up filled it).
    let warm = cached.stats();

    let mut runs: Vec<Vec<Row>> = vec![Vec::new(); cases.len() + 1];
    for run in 0..args.runs {
        // Interleaved, so a slow moment of the machine hits every case alike,
        // and forwards and backwards in turn, so that no case always runs
        // after the same one (Box last, then first).
        let mut order: Vec<usize> = (0..=cases.len()).collect();
        if run % 2 == 1 {
            order.reverse();
        }
        for i in order {
            if let Some((name, pool)) = cases.get(i) {
                runs[i].push(pool_run(name, pool, args.objects));
            } else {
                runs[i].push(box_run(args.objects / 4));
            }
        }
    }
    let rows: Vec<Row> = runs.into_iter().map(median).collect();
    let (c, u, ct, ut, b) = (&rows[0], &rows[1], &rows[2], &rows[3], &rows[4]);
    print_table(
        "Per object: one get + one put (or one alloc + one free)",
        &rows,
    );
    let s = cached.stats();
    let (hits, misses) = (
        s.cache_hits - warm.cache_hits,
        s.cache_misses - warm.cache_misses,
    );
    println!(
        "\ncached pool, the measured runs: {hits} cache hits, {misses} misses ({:.4}% misses)",
        100.0 * misses as f64 / (hits + misses).max(1) as f64
    );
    print_floor_header();
    let ok_box = check_floor("cached >= 5x Box", c, b, 5.0);
    let ok_ring = check_floor("cached >= 2x uncached", c, u, 2.0);
    // The same floors with per-object state tracking (informative).
    check_floor("tracked: cached >= 5x Box", ct, b, 5.0);
    check_floor("tracked: cached >= 2x uncached", ct, ut, 2.0);
    if !(ok_box && ok_ring) {
        println!("\nfloor MISSED: see the table above");
    }
    Ok(())
}
