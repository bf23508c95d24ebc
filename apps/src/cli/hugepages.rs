//! What backs each side's windows, said truthfully: hugepages, or 4 KiB
//! pages and what the kernel's pools hold.

use ntbdk_mempool::{HugepageCounts, PageSize};
use ntbdk_pmd::hw::Port;
use ntbdk_pmd::hw::emu::EmuDevice;

/// The kernel's hugepage pools, read now (through the same counters the
/// zones use): see [`describe_pools`].
pub fn hugepage_pools() -> String {
    let pools: Vec<(PageSize, HugepageCounts)> = [PageSize::Huge2M, PageSize::Huge1G]
        .into_iter()
        .filter_map(|s| HugepageCounts::read(s).map(|c| (s, c)))
        .collect();
    describe_pools(&pools)
}

/// `no hugepages reserved` only when no pool has a page; otherwise each
/// pool's free and total pages (`2 MiB: 0 of 8 free`); and when the kernel
/// offers no pool at all, that.
pub fn describe_pools(pools: &[(PageSize, HugepageCounts)]) -> String {
    if pools.is_empty() {
        return "this kernel offers no hugepages".into();
    }
    if pools.iter().all(|(_, c)| c.total == 0) {
        return "no hugepages reserved".into();
    }
    let held: Vec<String> = pools
        .iter()
        .filter(|(_, c)| c.total > 0)
        .map(|(s, c)| format!("{s}: {} of {} free", c.available(), c.total))
        .collect();
    format!("hugepages {}", held.join(", "))
}

/// What backs the windows of `ports` on `dev`'s fabric, each as its owner
/// published it (`port 1 on 2 MiB pages`, `port 0 on 4 KiB pages`), then
/// the pools when any is on 4 KiB pages: a side that fell back is named,
/// not hidden behind another's hugepages.
pub fn windows_by_side(dev: &EmuDevice, ports: &[Port]) -> String {
    let status = dev.fabric().status();
    let mut small = false;
    let sides: Vec<String> = ports
        .iter()
        .map(|&p| {
            let page = status
                .slots
                .get(usize::from(p))
                .and_then(|s| s.window_page_size);
            match page {
                Some(b) if b > 4096 => format!("port {p} on {} pages", page_label(b)),
                Some(_) => {
                    small = true;
                    format!("port {p} on 4 KiB pages")
                }
                None => format!("port {p} not published"),
            }
        })
        .collect();
    let mut out = sides.join(", ");
    if small {
        out.push_str(&format!(" ({})", hugepage_pools()));
    }
    out
}

fn page_label(bytes: usize) -> String {
    match bytes {
        b if b == PageSize::Huge1G.bytes() => PageSize::Huge1G.to_string(),
        b if b == PageSize::Huge2M.bytes() => PageSize::Huge2M.to_string(),
        b => crate::cli::units::size_label(b as u64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(total: usize, free: usize) -> HugepageCounts {
        HugepageCounts {
            total,
            free,
            reserved: 0,
            surplus: 0,
        }
    }

    #[test]
    fn none_reserved_is_said_only_when_no_pool_has_a_page() {
        assert_eq!(describe_pools(&[]), "this kernel offers no hugepages");
        let empty = [
            (PageSize::Huge2M, pool(0, 0)),
            (PageSize::Huge1G, pool(0, 0)),
        ];
        assert_eq!(describe_pools(&empty), "no hugepages reserved");
        let some = [
            (PageSize::Huge2M, pool(0, 0)),
            (PageSize::Huge1G, pool(2, 1)),
        ];
        assert_eq!(describe_pools(&some), "hugepages 1 GiB: 1 of 2 free");
        let both = [
            (PageSize::Huge2M, pool(8, 0)),
            (PageSize::Huge1G, pool(2, 2)),
        ];
        assert_eq!(
            describe_pools(&both),
            "hugepages 2 MiB: 0 of 8 free, 1 GiB: 2 of 2 free"
        );
    }
}
