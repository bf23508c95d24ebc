//! perftest's command line as `ntb-perf` meets it: the flags of `ib_*_bw`
//! and `ib_*_lat` that have no meaning on an NTB fabric, each with the
//! nearest option `ntb-perf` has (or why there is none), and the server
//! address perftest's client takes.
//!
//! The flags that do have a meaning (`-s -a -n -D -q -t -l -Q -b -I -F -N
//! -H -U --report_gbits --run_infinitely --out_json --out_json_file
//! --use_hugepages`) are `ntb-perf`'s own options, with perftest's
//! spellings.

/// Which app asks (the hints name its options).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invocation {
    /// `ntb-perf`.
    Perf,
}

/// A perftest flag `ntb-perf` does not take: its short and long
/// spellings, what it is in perftest, and what to do instead.
struct Foreign {
    short: Option<&'static str>,
    long: &'static str,
    what: &'static str,
    instead: &'static str,
}

const fn foreign(
    short: Option<&'static str>,
    long: &'static str,
    what: &'static str,
    instead: &'static str,
) -> Foreign {
    Foreign {
        short,
        long,
        what,
        instead,
    }
}

/// perftest flags without an NTB meaning, and the nearest supported option.
const FOREIGN: &[Foreign] = &[
    foreign(
        Some("-d"),
        "--ib-dev",
        "the RDMA device",
        "name the NTB device with --device SPEC (emu:NAME or vfio:BDF), or a fabric with --fabric NAME",
    ),
    foreign(
        Some("-i"),
        "--ib-port",
        "the RDMA port",
        "pick our slot with --slot N (and the peer's with --peer-slot N)",
    ),
    foreign(
        Some("-p"),
        "--port",
        "the TCP port of the control connection",
        "there is no TCP: the two sides talk through scratchpad registers; choose the fabric with --fabric NAME or --device SPEC",
    ),
    foreign(
        Some("-x"),
        "--gid-index",
        "the GID index",
        "there are no GIDs: the peer is a slot (--peer-slot N)",
    ),
    foreign(
        Some("-R"),
        "--rdma_cm",
        "connecting through rdma_cm",
        "the transport connects by its own handshake over the fabric; nothing to choose",
    ),
    foreign(
        Some("-c"),
        "--connection",
        "the connection type (RC, UC, UD...)",
        "the transport is reliable and connected, always",
    ),
    foreign(
        Some("-m"),
        "--mtu",
        "the path MTU",
        "there is no MTU: a message crosses as posted writes of any size up to -s 8M",
    ),
    foreign(
        Some("-r"),
        "--rx-depth",
        "the receive queue depth",
        "256 receives stay posted per peer; the sender's depth is -t/--tx-depth",
    ),
    foreign(
        Some("-o"),
        "--outs",
        "outstanding reads",
        "use -t/--tx-depth (most operations outstanding, reads included)",
    ),
    foreign(
        Some("-e"),
        "--events",
        "waiting for completions with events",
        "ntbdk is polled-mode only: the client spins on completions",
    ),
    foreign(
        Some("-u"),
        "--qp-timeout",
        "the QP timeout",
        "use --timeout SECS",
    ),
    foreign(
        Some("-S"),
        "--sl",
        "the service level",
        "there are no service levels on the fabric",
    ),
    foreign(
        Some("-w"),
        "--limit_bw",
        "a bandwidth limit to check against",
        "compare the BW average column yourself (or parse --out_json)",
    ),
    foreign(
        None,
        "--rate_limit",
        "rate limiting",
        "not supported: the client sends as fast as -t/--tx-depth allows",
    ),
    foreign(
        Some("-O"),
        "--dualport",
        "using both ports of the RDMA device",
        "use -q/--qp N for more servers (one queue pair each)",
    ),
    foreign(
        None,
        "--use_cuda",
        "GPU memory",
        "the data region is host memory in the NTB window",
    ),
    foreign(
        None,
        "--use_rocm",
        "GPU memory",
        "the data region is host memory in the NTB window",
    ),
    foreign(
        None,
        "--odp",
        "on-demand paging",
        "the data region is registered memory in the NTB window",
    ),
    foreign(
        None,
        "--mr_per_qp",
        "a memory region per QP",
        "each side registers one data region, shared by its queue pairs",
    ),
    foreign(
        None,
        "--cpu_util",
        "CPU utilisation",
        "a polled-mode side uses 100% of its core (--lcore picks it)",
    ),
    foreign(
        None,
        "--output",
        "printing one figure only (bandwidth, message_rate or latency)",
        "parse the figure you want from --out_json (or --out_json_file FILE)",
    ),
    foreign(
        Some("-C"),
        "--report-cycles",
        "times in CPU cycles",
        "times are nanoseconds of the monotonic clock, always",
    ),
    foreign(
        None,
        "--report-both",
        "each direction of a bidirectional run reported apart",
        "-b prints each direction after the row that sums both",
    ),
    foreign(
        None,
        "--reversed",
        "the server sending to the client",
        "use -b (both directions at once); the server never sends alone",
    ),
    foreign(
        None,
        "--perform_warm_up",
        "untimed iterations before measuring",
        "ntb-perf always runs untimed warm-up operations before each timed size",
    ),
    foreign(
        None,
        "--latency_gap",
        "a pause between latency iterations",
        "not supported: latency iterations run back to back",
    ),
    foreign(
        Some("-T"),
        "--tos",
        "the type of service",
        "there is no type of service on the fabric",
    ),
    foreign(
        Some("-g"),
        "--mcg",
        "sending to multicast groups",
        "ntb-perf runs point to point; multicast puts are an API (Transport::post_multicast_put)",
    ),
    foreign(
        None,
        "--flows",
        "several flows per queue pair",
        "use -q/--qp N (one queue pair per server)",
    ),
    foreign(
        Some("-z"),
        "--com_rdma_cm",
        "exchanging parameters through rdma_cm",
        "parameters go through scratchpad registers; nothing to choose",
    ),
];

/// A hint for the command-line word `arg` (as clap reported it unknown):
/// a perftest flag without an NTB meaning gets what it was and the nearest
/// supported option, a word without a dash (perftest's server address)
/// gets how the two sides meet. `None`: no hint (clap's own error stands).
///
/// ```
/// use ntbdk_apps::perf::perftest::{Invocation, hint};
/// let h = hint("-d", Invocation::Perf).unwrap();
/// assert!(h.contains("--device"), "{h}");
/// let h = hint("--ib-dev=mlx5_0", Invocation::Perf).unwrap();
/// assert!(h.contains("--device"), "{h}");
/// let h = hint("192.168.1.2", Invocation::Perf).unwrap();
/// assert!(h.contains("no server address"), "{h}");
/// assert!(hint("--frobnicate", Invocation::Perf).is_none());
/// ```
pub fn hint(arg: &str, inv: Invocation) -> Option<String> {
    let Invocation::Perf = inv;
    let name = arg.split('=').next().unwrap_or(arg);
    if !name.starts_with('-') {
        return Some(format!(
            "unexpected argument {arg:?}: ntb-perf takes no server address (perftest's client \
             does): the two sides meet on the fabric — run one side with --server and both \
             with the same --fabric NAME or --device SPEC"
        ));
    }
    FOREIGN
        .iter()
        .find(|f| f.long == name || f.short == Some(name))
        .map(|f| {
            let spelled = match f.short {
                Some(s) => format!("{s}/{}", f.long),
                None => f.long.to_string(),
            };
            format!(
                "{name}: perftest's {spelled} ({}) has no meaning on an NTB fabric: {}",
                f.what, f.instead
            )
        })
}

/// Looks through the command line `args` (without the program name) for
/// perftest flags that [`hint`] explains, and returns the first
/// explanation. Only words that start with a dash are looked at (a server
/// address is left to the parser, which knows which words are values).
pub fn refuse(args: &[String], inv: Invocation) -> Option<String> {
    args.iter()
        .take_while(|a| *a != "--")
        .filter(|a| a.starts_with('-'))
        .find_map(|a| hint(a, inv))
}
