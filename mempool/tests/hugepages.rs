//! Hugepage-backed zones, the shortage error and the 4 KiB fallback.
//!
//! Every test here reads or changes the system's hugepage pool, so they are
//! serialized by one lock. When too few 2 MiB pages are free, the tests that
//! need some reserve a few (as root) and give them back afterwards; without
//! root they print why they skip.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use common::is_root;
use ntbdk_mempool::{HugepageCounts, IovaMode, MemError, PageSize, Zone, ZoneOptions};

const MB2: usize = 2 << 20;

/// Serializes the tests of this binary (cargo runs them on parallel threads).
static HUGEPAGES: Mutex<()> = Mutex::new(());

fn serialize() -> MutexGuard<'static, ()> {
    HUGEPAGES.lock().unwrap_or_else(|p| p.into_inner())
}

const NR_HUGEPAGES: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages";

fn counts() -> Option<HugepageCounts> {
    HugepageCounts::read(PageSize::Huge2M)
}

/// At least `n` free 2 MiB pages for the duration of a test; whatever it
/// added to the pool is removed again on drop.
struct Reservation {
    added: usize,
}

impl Reservation {
    /// Makes `n` pages available, or says why it cannot.
    fn at_least(n: usize) -> Result<Reservation, String> {
        let c = counts().ok_or("this system has no 2 MiB hugepages")?;
        if c.available() >= n {
            return Ok(Reservation { added: 0 });
        }
        if !is_root() {
            return Err(format!(
                "{} free 2 MiB hugepages, {n} needed, and reserving more needs root",
                c.available()
            ));
        }
        let want = n - c.available();
        std::fs::write(NR_HUGEPAGES, (c.total + want).to_string())
            .map_err(|e| format!("cannot write {NR_HUGEPAGES}: {e}"))?;
        let after = counts().map_or(0, |c| c.total);
        let r = Reservation {
            added: after.saturating_sub(c.total),
        };
        if r.added < want {
            return Err(format!(
                "the kernel reserved {} of {want} hugepages",
                r.added
            ));
        }
        Ok(r)
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.added > 0 {
            let total = counts().map_or(0, |c| c.total);
            let _ = std::fs::write(NR_HUGEPAGES, total.saturating_sub(self.added).to_string());
        }
    }
}

/// Counts the warnings that announce a fallback while `f` runs.
fn fallback_warnings<R>(f: impl FnOnce() -> R) -> (R, Vec<String>) {
    use tracing::field::{Field, Visit};
    use tracing::{Event, Level, Metadata, Subscriber, span};

    #[derive(Default)]
    struct Collect(Mutex<Vec<String>>, AtomicUsize);
    struct Sub(Arc<Collect>);
    struct Msg(String);
    impl Visit for Msg {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            if field.name() == "message" {
                self.0 = format!("{value:?}");
            }
        }
    }
    impl Subscriber for Sub {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
            span::Id::from_u64(1 + self.0.1.fetch_add(1, Ordering::Relaxed) as u64)
        }
        fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
        fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
        fn event(&self, e: &Event<'_>) {
            if *e.metadata().level() == Level::WARN {
                let mut m = Msg(String::new());
                e.record(&mut m);
                if m.0.contains("falling back") {
                    self.0.0.lock().unwrap().push(m.0);
                }
            }
        }
        fn enter(&self, _: &span::Id) {}
        fn exit(&self, _: &span::Id) {}
    }
    let c = Arc::new(Collect::default());
    let r = tracing::subscriber::with_default(Sub(c.clone()), f);
    let v = c.0.lock().unwrap().clone();
    (r, v)
}

#[test]
fn hugepage_zone_is_reserved_up_front() {
    let _g = serialize();
    let _r = match Reservation::at_least(4) {
        Ok(r) => r,
        Err(why) => return common::skip("hugepage_zone_is_reserved_up_front", why),
    };
    let before = counts().unwrap();
    // 3 MiB + the 4 KiB header: two 2 MiB pages.
    let z = Zone::create("huge", 3 << 20, &ZoneOptions::default()).unwrap();
    assert_eq!(z.page_size(), PageSize::Huge2M);
    assert!(z.is_huge());
    assert!(z.len() >= 3 << 20);
    assert!(
        z.len() + 4096 <= 2 * MB2,
        "at most one extra hugepage: {}",
        z.len()
    );
    assert_eq!(
        z.as_ptr() as usize % MB2,
        0,
        "hugepage zones start on a hugepage"
    );
    let after = counts().unwrap();
    assert!(
        after.free + 2 <= before.free,
        "the pages were allocated by create(): free {} -> {}",
        before.free,
        after.free
    );
    // SAFETY: the zone is ours; the slice covers its usable bytes.
    let b = unsafe { std::slice::from_raw_parts_mut(z.as_ptr(), z.len()) };
    assert!(b.iter().step_by(4096).all(|&x| x == 0), "zero-filled");
    for (i, x) in b.iter_mut().enumerate().step_by(511) {
        *x = i as u8 | 1;
    }
    let a = Zone::attach(z.as_fd().try_clone_to_owned().unwrap()).unwrap();
    assert_eq!(
        a.page_size(),
        PageSize::Huge2M,
        "attach sees the hugepage size"
    );
    assert_eq!(a.len(), z.len());
    // SAFETY: same pages, read only.
    let ab = unsafe { std::slice::from_raw_parts(a.as_ptr(), a.len()) };
    for i in (0..ab.len()).step_by(511) {
        assert_eq!(ab[i], i as u8 | 1);
    }
    drop((a, z));
    assert_eq!(counts().unwrap().free, before.free, "pages return on drop");
}

#[test]
fn hugepage_iova_pa_is_contiguous_within_a_page() {
    let _g = serialize();
    if !is_root() {
        return common::skip("hugepage_iova_pa_is_contiguous_within_a_page", "needs root");
    }
    let _r = match Reservation::at_least(2) {
        Ok(r) => r,
        Err(why) => return common::skip("hugepage_iova_pa_is_contiguous_within_a_page", why),
    };
    let z = Zone::create("huge-pa", MB2, &ZoneOptions::default()).unwrap();
    let pa0 = z.iova(0, IovaMode::Pa).unwrap();
    assert_eq!(
        pa0 % MB2 as u64,
        0,
        "a 2 MiB page is 2 MiB-aligned physically"
    );
    for off in [1, 4096, 12345, MB2 - 1] {
        assert_eq!(z.iova(off, IovaMode::Pa).unwrap(), pa0 + off as u64);
    }
    // The next hugepage starts on its own 2 MiB boundary.
    let pa1 = z.iova(MB2, IovaMode::Pa).unwrap();
    assert_eq!(pa1 % MB2 as u64, 0);
}

#[test]
fn shortage_is_a_clear_error() {
    let _g = serialize();
    let Some(c) = counts() else {
        return common::skip(
            "shortage_is_a_clear_error",
            "no 2 MiB hugepages on this system",
        );
    };
    let free = c.available();
    // One byte more than the free pages hold (with the header): free + 1 pages.
    let len = free * MB2 + 1;
    let e = Zone::create("short", len, &ZoneOptions::default()).unwrap_err();
    let MemError::NoHugepages {
        page_size,
        needed_pages,
        free_pages,
        suggested_total,
    } = e
    else {
        panic!("expected NoHugepages, got {e}");
    };
    assert_eq!(page_size, PageSize::Huge2M);
    assert_eq!(needed_pages, free + 1);
    assert!(suggested_total > c.total, "suggest more than reserved now");
    let msg = e.to_string();
    let expected = format!(
        "not enough 2 MiB hugepages: need {needed_pages}, {free_pages} free: \
         run scripts/setup-hugepages.sh --setup {suggested_total}, \
         or allow the 4 KiB fallback (ZoneOptions::huge_or_fallback)"
    );
    assert_eq!(msg, expected);
    assert_eq!(counts().unwrap().available(), free, "nothing leaked");
}

#[test]
fn fallback_to_small_pages_warns_once() {
    let _g = serialize();
    let Some(c) = counts() else {
        return common::skip("fallback_to_small_pages_warns_once", "no 2 MiB hugepages");
    };
    if c.available() > 16 {
        return common::skip(
            "fallback_to_small_pages_warns_once",
            format_args!(
                "{} hugepages free, a shortage would need a {} MiB zone",
                c.available(),
                2 * c.available()
            ),
        );
    }
    let len = c.available() * MB2 + 1;
    let (z, warnings) =
        fallback_warnings(|| Zone::create("fallback", len, &ZoneOptions::huge_or_fallback()));
    let z = z.unwrap();
    assert_eq!(z.page_size(), PageSize::Small4K);
    assert!(z.len() >= len);
    assert_eq!(warnings.len(), 1, "exactly one warning: {warnings:?}");
    assert!(
        warnings[0].contains("not enough 2 MiB hugepages")
            && warnings[0].contains("scripts/setup-hugepages.sh --setup")
            && warnings[0].contains("falling back to 4 KiB pages"),
        "{}",
        warnings[0]
    );
    assert!(
        !warnings[0].contains("allow the 4 KiB fallback") && !warnings[0].contains("--no-huge"),
        "no advice to allow what is happening, nor a flag the apps lack: {}",
        warnings[0]
    );

    // Asking for small pages directly is silent.
    let (z, warnings) = fallback_warnings(|| Zone::create("small", len, &ZoneOptions::no_huge()));
    assert_eq!(z.unwrap().page_size(), PageSize::Small4K);
    assert!(warnings.is_empty(), "{warnings:?}");
}

#[test]
fn hugepages_when_free_need_no_fallback() {
    let _g = serialize();
    let _r = match Reservation::at_least(1) {
        Ok(r) => r,
        Err(why) => return common::skip("hugepages_when_free_need_no_fallback", why),
    };
    let (z, warnings) =
        fallback_warnings(|| Zone::create("no-fallback", 4096, &ZoneOptions::huge_or_fallback()));
    assert_eq!(z.unwrap().page_size(), PageSize::Huge2M);
    assert!(warnings.is_empty(), "{warnings:?}");
}

#[test]
fn gigantic_pages_error_or_fallback() {
    let _g = serialize();
    let opts = ZoneOptions {
        page_size: PageSize::Huge1G,
        ..ZoneOptions::default()
    };
    match HugepageCounts::read(PageSize::Huge1G) {
        None => {
            let e = Zone::create("giant", 4096, &opts).unwrap_err();
            assert!(matches!(e, MemError::HugepagesUnsupported { .. }), "{e}");
            assert!(e.to_string().contains("no 1 GiB hugepages"), "{e}");
        }
        Some(c) if c.available() == 0 => {
            let e = Zone::create("giant", 4096, &opts).unwrap_err();
            let msg = e.to_string();
            assert!(
                msg.starts_with("not enough 1 GiB hugepages: need 1, 0 free")
                    && msg.contains("--size 1G")
                    && msg.contains("ZoneOptions::huge_or_fallback"),
                "{msg}"
            );
        }
        Some(c) => {
            return common::skip(
                "gigantic_pages_error_or_fallback",
                format_args!("{} 1 GiB pages are free", c.available()),
            );
        }
    }
    let (z, warnings) = fallback_warnings(|| {
        Zone::create(
            "giant",
            4096,
            &ZoneOptions {
                allow_fallback: true,
                ..opts
            },
        )
    });
    let z = z.unwrap();
    assert_eq!(z.page_size(), PageSize::Small4K);
    assert_eq!(z.len(), 4096);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
}
