//! Property tests of the wire decoder and validator: random and mutated
//! bodies never panic, what decodes re-encodes to the same bytes, and what
//! validates stays inside the limits.

use ntbdk_pmd::transport::wire::{
    self, BODY, Body, Hello, INLINE_MAX, Limits, Msg, Ring, SGES_PER_MSG, WireSge, WireStatus,
};
use proptest::prelude::*;

const LIMITS: Limits = Limits {
    max_len: 1 << 26,
    region_start: 1 << 16,
    window_len: 1 << 24,
    eager_count: 16,
    eager_size: 1024,
};

fn queue() -> impl Strategy<Value = Ring> {
    prop_oneof![
        Just(Ring::Rx),
        Just(Ring::Tx),
        Just(Ring::Cq),
        Just(Ring::PostQ)
    ]
}

/// SGL entries: half anywhere in the 40-bit offset space, half inside the
/// limits' region area (so the accept path is drawn as often as refusals).
fn sges() -> impl Strategy<Value = (u8, [WireSge; SGES_PER_MSG])> {
    let anywhere = prop::array::uniform5((0u64..1 << 40, 1u32..1 << 24));
    let inside = prop::array::uniform5((LIMITS.region_start..LIMITS.window_len - 4096, 1u32..4096));
    (1u8..=5, prop_oneof![anywhere, inside]).prop_map(|(n, raw)| {
        let mut s = [WireSge::default(); SGES_PER_MSG];
        for i in 0..n as usize {
            s[i] = WireSge {
                offset: raw[i].0,
                len: raw[i].1,
            };
        }
        (n, s)
    })
}

fn status() -> impl Strategy<Value = WireStatus> {
    prop_oneof![
        Just(WireStatus::Ok),
        Just(WireStatus::Access),
        Just(WireStatus::Protocol),
        Just(WireStatus::NoRoom)
    ]
}

fn msg() -> impl Strategy<Value = Msg> {
    prop_oneof![
        (any::<u64>(), any::<u32>(), any::<u64>(), any::<u32>()).prop_map(
            |(op, rkey, roff, len)| Msg::WriteReq {
                op,
                rkey,
                roff,
                len
            }
        ),
        (any::<u64>(), any::<u32>(), sges()).prop_map(|(op, start, (n, sges))| Msg::Sgl {
            op,
            start,
            n,
            sges
        }),
        (any::<u64>(), any::<u32>()).prop_map(|(op, len)| Msg::Done { op, len }),
        (any::<u64>(), status(), any::<u32>()).prop_map(|(op, status, len)| Msg::Ack {
            op,
            status,
            len
        }),
        (any::<u64>(), any::<u32>(), any::<u64>(), any::<u32>()).prop_map(
            |(op, rkey, roff, len)| Msg::ReadReq {
                op,
                rkey,
                roff,
                len
            }
        ),
        (any::<u64>(), any::<u32>(), sges()).prop_map(|(op, start, (n, sges))| Msg::ReadSgl {
            op,
            start,
            n,
            sges
        }),
        (any::<u64>(), any::<u32>(), any::<u64>()).prop_map(|(op, rkey, roff)| Msg::ReadIntent {
            op,
            rkey,
            roff
        }),
        (any::<u64>(), status(), any::<u32>()).prop_map(|(op, status, len)| Msg::ReadSize {
            op,
            status,
            len
        }),
        (any::<u64>(), any::<u32>()).prop_map(|(op, len)| Msg::Rts { op, len }),
        (
            any::<u64>(),
            any::<u32>(),
            any::<u16>(),
            prop::option::of(any::<u16>())
        )
            .prop_map(|(op, len, prev, next)| Msg::ChainRts {
                op,
                len,
                prev,
                next: next.map(|n| n.min(0xfffe))
            }),
        (any::<u64>(), any::<u16>(), any::<u32>(), sges()).prop_map(
            |(op, origin, start, (n, sges))| Msg::ChainSgl {
                op,
                origin,
                start,
                n,
                sges
            }
        ),
        (any::<u64>(), any::<u16>(), any::<u32>()).prop_map(|(op, origin, len)| Msg::ChainDone {
            op,
            origin,
            len
        }),
        any::<u64>().prop_map(|op| Msg::Cancel { op }),
        (any::<u64>(), any::<u16>()).prop_map(|(op, origin)| Msg::ChainRelease { op, origin }),
        (prop::collection::vec(any::<u8>(), 1..=INLINE_MAX)).prop_map(|v| {
            let mut data = [0u8; INLINE_MAX];
            data[..v.len()].copy_from_slice(&v);
            Msg::SendInline {
                len: v.len() as u8,
                data,
            }
        }),
        (any::<u32>(), any::<u32>()).prop_map(|(buf, len)| Msg::SendBuf { buf, len }),
        (0..LIMITS.eager_count, 1..=LIMITS.eager_size)
            .prop_map(|(buf, len)| Msg::SendBuf { buf, len }),
    ]
}

/// The invariants every body must satisfy, whatever its bytes.
fn check(body: &Body, q: Ring) -> Result<(), TestCaseError> {
    if let Ok(m) = wire::decode(body) {
        // Canonical: decoding is the inverse of encoding.
        prop_assert_eq!(&wire::encode(&m)[..], &body[..]);
        if let Ok(v) = wire::decode_validated(body, q, &LIMITS) {
            prop_assert_eq!(v, m);
            match v {
                Msg::Sgl { start, n, sges, .. }
                | Msg::ReadSgl { start, n, sges, .. }
                | Msg::ChainSgl { start, n, sges, .. } => {
                    prop_assert!((1..=SGES_PER_MSG as u8).contains(&n));
                    let mut end = u64::from(start);
                    for s in &sges[..n as usize] {
                        prop_assert!(s.len > 0);
                        prop_assert!(s.offset >= LIMITS.region_start);
                        prop_assert!(s.offset + u64::from(s.len) <= LIMITS.window_len);
                        end += u64::from(s.len);
                    }
                    prop_assert!(end <= u64::from(LIMITS.max_len));
                }
                Msg::SendBuf { buf, len } => {
                    prop_assert!(buf < LIMITS.eager_count && (1..=LIMITS.eager_size).contains(&len))
                }
                Msg::SendInline { len, .. } => {
                    prop_assert!((1..=INLINE_MAX).contains(&(len as usize)))
                }
                Msg::WriteReq { len, roff, .. } | Msg::ReadReq { len, roff, .. } => {
                    prop_assert!((1..=LIMITS.max_len).contains(&len));
                    prop_assert!(roff.checked_add(u64::from(len)).is_some());
                }
                _ => {}
            }
        }
    } else {
        prop_assert!(wire::decode_validated(body, q, &LIMITS).is_err());
    }
    let _ = Hello::decode(body);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

    #[test]
    fn random_bodies_never_panic(bytes in prop::array::uniform32(any::<u8>()), tail in prop::array::uniform24(any::<u8>()), q in queue()) {
        let mut body = [0u8; BODY];
        body[..32].copy_from_slice(&bytes);
        body[32..].copy_from_slice(&tail);
        check(&body, q)?;
        // Bodies with a valid op code and otherwise random bytes.
        for code in [1u8, 2, 3, 4, 5, 6, 7, 8, 9, 0x0a, 0x0b, 0x0c, 0x10, 0x11] {
            body[0] = code;
            check(&body, q)?;
        }
    }

    #[test]
    fn in_range_sgls_and_buffers_are_accepted(
        start in 0u32..1 << 20,
        (n, sges) in (1u8..=5, prop::array::uniform5((LIMITS.region_start..LIMITS.window_len - 4096, 1u32..4096)))
            .prop_map(|(n, raw)| {
                let mut s = [WireSge::default(); SGES_PER_MSG];
                for i in 0..n as usize {
                    s[i] = WireSge { offset: raw[i].0, len: raw[i].1 };
                }
                (n, s)
            }),
        buf in 0..LIMITS.eager_count,
        len in 1..=LIMITS.eager_size,
    ) {
        let sgl = Msg::Sgl { op: 1, start, n, sges };
        prop_assert_eq!(wire::decode_validated(&wire::encode(&sgl), Ring::Tx, &LIMITS), Ok(sgl));
        let rs = Msg::ReadSgl { op: 2, start, n, sges };
        prop_assert_eq!(wire::decode_validated(&wire::encode(&rs), Ring::Tx, &LIMITS), Ok(rs));
        let sb = Msg::SendBuf { buf, len };
        prop_assert_eq!(wire::decode_validated(&wire::encode(&sb), Ring::PostQ, &LIMITS), Ok(sb));
    }

    #[test]
    fn valid_messages_roundtrip(m in msg()) {
        let body = wire::encode(&m);
        prop_assert_eq!(wire::decode(&body), Ok(m));
    }

    #[test]
    fn mutated_messages_keep_the_invariants(
        m in msg(),
        flips in prop::collection::vec((0usize..BODY, any::<u8>()), 1..6),
        q in queue(),
    ) {
        let mut body = wire::encode(&m);
        for (at, x) in flips {
            body[at] ^= x;
        }
        check(&body, q)?;
    }
}
