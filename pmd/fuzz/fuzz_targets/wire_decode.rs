//! Fuzzes the transport's message decoder and validator: any 56 bytes, on
//! any queue, must decode or fail cleanly, re-encode canonically, and
//! validate only within the limits.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ntbdk_pmd::transport::wire::{self, BODY, Hello, Limits, Msg, Ring};

const LIMITS: Limits = Limits {
    max_len: 1 << 26,
    region_start: 1 << 16,
    window_len: 1 << 24,
    eager_count: 16,
    eager_size: 1024,
};

fuzz_target!(|data: &[u8]| {
    if data.len() < BODY + 1 {
        return;
    }
    let mut body = [0u8; BODY];
    body.copy_from_slice(&data[1..=BODY]);
    let queue = match data[0] % 4 {
        0 => Ring::Rx,
        1 => Ring::Tx,
        2 => Ring::Cq,
        _ => Ring::PostQ,
    };
    let _ = Hello::decode(&body);
    let Ok(m) = wire::decode(&body) else {
        assert!(wire::decode_validated(&body, queue, &LIMITS).is_err());
        return;
    };
    assert_eq!(
        wire::encode(&m),
        body,
        "decode must be the inverse of encode"
    );
    if let Ok(Msg::Sgl { n, sges, .. } | Msg::ReadSgl { n, sges, .. }) =
        wire::decode_validated(&body, queue, &LIMITS)
    {
        for s in &sges[..n as usize] {
            assert!(s.offset >= LIMITS.region_start);
            assert!(s.offset + u64::from(s.len) <= LIMITS.window_len);
        }
    }
});
