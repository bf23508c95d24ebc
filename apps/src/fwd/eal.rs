//! DPDK's EAL flags as `ntb-fwd` meets them: `ntb_fwd` is started as
//! `dpdk-ntb_fwd -l 1-3 -a 0000:af:00.0 -- --fwd-mode txonly`; `ntb-fwd`
//! has no EAL, so each EAL flag gets the option that does its job here (or
//! why there is none) instead of a bare "unexpected argument".

/// An EAL flag: its spellings, what it does in DPDK, and what to do instead.
struct Eal {
    short: Option<&'static str>,
    long: Option<&'static str>,
    what: &'static str,
    instead: &'static str,
}

/// DPDK EAL flags, and `ntb-fwd`'s nearest option. (`-n`, the memory
/// channels, is not here: it is `ntb-fwd`'s packet count, as testpmd's
/// `--nb-pkts`-like flags are.)
const EAL: &[Eal] = &[
    Eal {
        short: Some("-l"),
        long: Some("--lcores"),
        what: "the lcores' cores",
        instead: "--lcore N picks the first lcore's core (an index into the cores this process \
                  may use; run under taskset to choose those); the others follow it",
    },
    Eal {
        short: Some("-c"),
        long: None,
        what: "a core mask",
        instead: "--lcore N picks the first lcore's core (an index into the cores this process \
                  may use); the others follow it",
    },
    Eal {
        short: Some("-a"),
        long: Some("--allow"),
        what: "the PCI device to probe",
        instead: "--device vfio:BDF (the device bound to vfio-pci), or --fabric NAME",
    },
    Eal {
        short: Some("-w"),
        long: Some("--pci-whitelist"),
        what: "the PCI device to probe",
        instead: "--device vfio:BDF (the device bound to vfio-pci), or --fabric NAME",
    },
    Eal {
        short: None,
        long: Some("--vdev"),
        what: "a virtual device",
        instead: "the emulated fabric is the virtual device: --fabric NAME (or --device emu:NAME)",
    },
    Eal {
        short: Some("-m"),
        long: Some("--socket-mem"),
        what: "the hugepage memory to reserve",
        instead: "nothing to reserve: the window holds the buffers (--nb-desc, --buf-size size \
                  it), in hugepages when enough are free",
    },
    Eal {
        short: None,
        long: Some("--file-prefix"),
        what: "the name of the shared runtime files",
        instead: "processes meet on a fabric by name: --fabric NAME",
    },
    Eal {
        short: None,
        long: Some("--proc-type"),
        what: "primary or secondary process",
        instead: "every ntb-fwd is a host of its own on the fabric; nothing to choose",
    },
    Eal {
        short: None,
        long: Some("--in-memory"),
        what: "running without shared runtime files",
        instead: "nothing to choose",
    },
    Eal {
        short: None,
        long: Some("--huge-dir"),
        what: "the hugetlbfs mount",
        instead: "the window takes 2 MiB hugepages from the kernel's pool when enough are free \
                  (scripts/setup-hugepages.sh reserves them)",
    },
    Eal {
        short: None,
        long: Some("--log-level"),
        what: "the log level",
        instead: "set RUST_LOG (e.g. RUST_LOG=debug)",
    },
];

/// A hint for the first DPDK EAL flag in `args` (the command line without
/// the program name, up to a `--`), or `None`.
///
/// ```
/// use ntbdk_apps::fwd::eal_hint;
/// let h = eal_hint(&["-l".into(), "2".into()]).unwrap();
/// assert!(h.contains("--lcore"), "{h}");
/// let h = eal_hint(&["-a0000:af:00.0".into()]).unwrap();
/// assert!(h.contains("--device vfio:BDF"), "{h}");
/// let h = eal_hint(&["--socket-mem=1024".into()]).unwrap();
/// assert!(h.contains("window"), "{h}");
/// assert!(eal_hint(&["-n".into(), "5".into(), "--fwd-mode".into()]).is_none());
/// ```
pub fn eal_hint(args: &[String]) -> Option<String> {
    args.iter()
        .take_while(|a| *a != "--")
        .filter(|a| a.starts_with('-'))
        .find_map(|a| {
            let long = a.split('=').next().unwrap_or(a);
            // A short flag may carry its value: `-l2`, `-a0000:af:00.0`.
            let short = a.get(..2).filter(|_| !a.starts_with("--"));
            let e = EAL
                .iter()
                .find(|e| e.long == Some(long) || (short.is_some() && e.short == short))?;
            let spelled = [e.short, e.long].into_iter().flatten().collect::<Vec<_>>();
            Some(format!(
                "{}: DPDK's EAL {} ({}) is not an ntb-fwd option (ntb-fwd has no EAL, and no \
                 `--` before its own options): {}",
                short.unwrap_or(long),
                spelled.join("/"),
                e.what,
                e.instead
            ))
        })
}
