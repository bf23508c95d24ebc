//! The fuzz targets' seed corpus, kept in the repository under
//! `pmd/fuzz/corpus/<target>/` (scripts/fuzz.sh runs every file as a
//! regression input, then fuzzes from them for a bounded time). The seeds
//! are built here from valid encoded messages: this test fails when a seed
//! is missing or no longer what the wire format encodes (rewrite them with
//! `NTBDK_WRITE_FUZZ_CORPUS=1 cargo test -p ntbdk-pmd --test fuzz_corpus`),
//! and checks that every seed message decodes and validates on its queue.
//! Other files in those directories (inputs a fuzzer found) are left alone.

use std::path::{Path, PathBuf};

use ntbdk_pmd::transport::Geometry;
use ntbdk_pmd::transport::wire::{
    self, BODY, INLINE_MAX, Limits, Msg, Ring, SGES_PER_MSG, WireSge, WireStatus,
};

/// The selector byte the targets read before each body (`byte % 4`).
fn selector(r: Ring) -> u8 {
    match r {
        Ring::Rx => 0,
        Ring::Tx => 1,
        Ring::Cq => 2,
        Ring::PostQ => 3,
    }
}

fn sges(entries: &[(u64, u32)]) -> (u8, [WireSge; SGES_PER_MSG]) {
    let mut s = [WireSge::default(); SGES_PER_MSG];
    for (i, &(offset, len)) in entries.iter().enumerate() {
        s[i] = WireSge { offset, len };
    }
    (entries.len() as u8, s)
}

fn inline(text: &[u8]) -> Msg {
    let mut data = [0u8; INLINE_MAX];
    data[..text.len()].copy_from_slice(text);
    Msg::SendInline {
        len: text.len() as u8,
        data,
    }
}

/// One message of every kind, on its queue, with SGL entries at `base`
/// (the first byte of a region area) and eager buffer indexes below
/// `eager`.
fn every_message(base: u64, eager: u32) -> Vec<(&'static str, Ring, Msg)> {
    let (n, s) = sges(&[(base, 4096), (base + 8192, 100)]);
    let (n1, s1) = sges(&[(base + 4096, 64)]);
    vec![
        (
            "write_req",
            Ring::Rx,
            Msg::WriteReq {
                op: 1,
                rkey: 0x1234_5678,
                roff: 0,
                len: 4196,
            },
        ),
        ("rts", Ring::Rx, Msg::Rts { op: 2, len: 4096 }),
        (
            "chain_rts",
            Ring::Rx,
            Msg::ChainRts {
                op: 3,
                len: 4096,
                prev: 0,
                next: Some(1),
            },
        ),
        (
            "read_size",
            Ring::Rx,
            Msg::ReadSize {
                op: 4,
                status: WireStatus::Ok,
                len: 300,
            },
        ),
        (
            "sgl",
            Ring::Tx,
            Msg::Sgl {
                op: 1,
                start: 0,
                n,
                sges: s,
            },
        ),
        (
            "read_req",
            Ring::Tx,
            Msg::ReadReq {
                op: 5,
                rkey: 0x1234_5678,
                roff: 16,
                len: 64,
            },
        ),
        (
            "read_sgl",
            Ring::Tx,
            Msg::ReadSgl {
                op: 5,
                start: 0,
                n: n1,
                sges: s1,
            },
        ),
        (
            "read_intent",
            Ring::Tx,
            Msg::ReadIntent {
                op: 6,
                rkey: 0x1234_5678,
                roff: 0,
            },
        ),
        (
            "chain_sgl",
            Ring::Tx,
            Msg::ChainSgl {
                op: 3,
                origin: 0,
                start: 0,
                n: n1,
                sges: s1,
            },
        ),
        ("done", Ring::Cq, Msg::Done { op: 1, len: 4196 }),
        (
            "ack",
            Ring::Cq,
            Msg::Ack {
                op: 5,
                status: WireStatus::Access,
                len: 0,
            },
        ),
        (
            "chain_done",
            Ring::Cq,
            Msg::ChainDone {
                op: 3,
                origin: 0,
                len: 4096,
            },
        ),
        ("cancel", Ring::Rx, Msg::Cancel { op: 3 }),
        (
            "chain_release",
            Ring::Cq,
            Msg::ChainRelease { op: 3, origin: 0 },
        ),
        ("send_inline", Ring::PostQ, inline(b"hello, fuzzer")),
        (
            "send_buf",
            Ring::PostQ,
            Msg::SendBuf {
                buf: eager - 1,
                len: 200,
            },
        ),
    ]
}

/// What `wire_decode` sees: one selector byte and one body.
fn wire_decode_limits() -> Limits {
    // The fuzz target's own limits.
    Limits {
        max_len: 1 << 26,
        region_start: 1 << 16,
        window_len: 1 << 24,
        eager_count: 16,
        eager_size: 1024,
    }
}

/// What `transport_inject`'s victim accepts (Geometry::small(3), 1 MiB).
fn transport_inject_limits() -> Limits {
    let g = Geometry::small(3);
    Limits {
        max_len: u32::MAX,
        region_start: g.layout().unwrap().region_area_start() as u64,
        window_len: 1 << 20,
        eager_count: g.eager_count,
        eager_size: g.eager_size,
    }
}

fn frame(ring: Ring, m: &Msg) -> Vec<u8> {
    let mut v = vec![selector(ring)];
    v.extend_from_slice(&wire::encode(m));
    v
}

/// The seeds of each target: (target, file name, bytes).
fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut out = Vec::new();
    let l = wire_decode_limits();
    for (name, ring, m) in every_message(l.region_start, l.eager_count) {
        out.push(("wire_decode", format!("seed-{name}"), frame(ring, &m)));
    }
    let l = transport_inject_limits();
    let all = every_message(l.region_start, l.eager_count);
    let pick = |names: &[&str]| -> Vec<u8> {
        names
            .iter()
            .flat_map(|n| {
                let (_, r, m) = all.iter().find(|(k, ..)| k == n).unwrap();
                frame(*r, m)
            })
            .collect()
    };
    let sets: [(&str, &[&str]); 4] = [
        (
            "requests",
            &["write_req", "read_req", "read_intent", "rts", "done"],
        ),
        (
            "answers",
            &["sgl", "ack", "read_size", "chain_sgl", "chain_done"],
        ),
        ("sends", &["send_inline", "send_buf", "send_inline"]),
        ("chain", &["chain_rts", "chain_sgl", "chain_done"]),
    ];
    for (name, names) in sets {
        out.push(("transport_inject", format!("seed-{name}"), pick(names)));
    }
    out.push((
        "transport_inject",
        "seed-every-message".into(),
        all.iter().flat_map(|(_, r, m)| frame(*r, m)).collect(),
    ));
    out
}

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target)
}

#[test]
fn every_seed_is_a_valid_message_on_its_queue() {
    for (target, name, bytes) in seeds() {
        let limits = match target {
            "wire_decode" => wire_decode_limits(),
            _ => transport_inject_limits(),
        };
        assert_eq!(bytes.len() % (BODY + 1), 0, "{target}/{name}");
        for chunk in bytes.chunks_exact(BODY + 1) {
            let ring = [Ring::Rx, Ring::Tx, Ring::Cq, Ring::PostQ][(chunk[0] % 4) as usize];
            let body: &[u8; BODY] = chunk[1..].try_into().unwrap();
            let m = wire::decode_validated(body, ring, &limits);
            assert!(m.is_ok(), "{target}/{name}: {m:?} on {ring:?}");
            assert_eq!(&wire::encode(&m.unwrap()), body, "{target}/{name}");
        }
    }
}

#[test]
fn the_checked_in_seed_corpus_is_what_the_wire_format_encodes() {
    let write = std::env::var_os("NTBDK_WRITE_FUZZ_CORPUS").is_some();
    let mut stale = Vec::new();
    for (target, name, bytes) in seeds() {
        let path = corpus_dir(target).join(&name);
        if write {
            std::fs::create_dir_all(corpus_dir(target)).unwrap();
            std::fs::write(&path, &bytes).unwrap();
        }
        if std::fs::read(&path).ok().as_deref() != Some(&bytes[..]) {
            stale.push(format!("{target}/{name}"));
        }
    }
    assert!(
        stale.is_empty(),
        "seed files missing or stale: {stale:?}; rewrite them with \
         NTBDK_WRITE_FUZZ_CORPUS=1 cargo test -p ntbdk-pmd --test fuzz_corpus"
    );
}
