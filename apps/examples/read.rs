//! A read: host A reads 1 MiB out of a region of host B's.
//!
//! B fills a region peers may read and sends its key in a message; A posts
//! one read naming that key and its own region to land in. No byte is read
//! across the bridge: A sends B where its region lies, and B copies the
//! data into it with posted writes, so A's device counts zero non-posted
//! reads. Each host is a process of its own (host B a child of this
//! program, or `--role a|b --fabric NAME` by hand: see the `messages`
//! example) on a private emulated fabric, removed at the end.
//!
//! ```sh
//! cargo run --release -p ntbdk-apps --example read
//! ```

use anyhow::{Result, ensure};
use ntbdk_pmd::hw::open::open;
use ntbdk_pmd::transport::{
    Access, Config, Geometry, OpKind, RegionKey, RemoteAddr, Sge, Transport,
};

#[path = "common/mod.rs"]
pub mod common;

use common::{Example, PrivateFabric, WAIT, hang_up, next};

const A: u16 = 0;
const B: u16 = 1;
const LEN: usize = 1 << 20;

fn main() -> Result<()> {
    EXAMPLE.main()
}

/// The example: two hosts, each a process of its own.
pub const EXAMPLE: Example = Example {
    name: "read",
    host_a,
    host_b,
};

/// The byte at `i` of B's region.
fn pattern(i: usize) -> u8 {
    (i % 253) as u8
}

/// Host A: the reader.
fn host_a(fabric: &PrivateFabric, say: &dyn Fn(String)) -> Result<()> {
    let dev = open(&fabric.spec, &fabric.options(A))?; // or "vfio:0000:00:04.0".parse()?
    let mut t = Transport::new(dev, Config::new(Geometry::new(2)))?;
    let qp = t.create_qp(B)?;
    let inbox = t.register_region(64, Access::LOCAL)?;
    t.post_recv(
        qp,
        Sge {
            key: inbox,
            offset: 0,
            len: 64,
        },
        0,
    )?;
    t.wait_connected(B, WAIT)?;

    next(&mut t, OpKind::Recv)?;
    let mut key = [0u8; 4];
    t.region_read(inbox, 0, &mut key)?;
    let remote = RegionKey(u32::from_le_bytes(key));
    say(format!("B's region key is {:#010x}", remote.0));

    let local = t.register_region(LEN, Access::LOCAL)?;
    let sge = [Sge {
        key: local,
        offset: 0,
        len: LEN as u64,
    }];
    t.post_read(
        qp,
        &sge,
        RemoteAddr {
            key: remote,
            offset: 0,
        },
        9,
    )?;
    let c = next(&mut t, OpKind::Read)?;
    let mut got = vec![0u8; LEN];
    t.region_read(local, 0, &mut got)?;
    let bad = got
        .iter()
        .enumerate()
        .filter(|&(i, &b)| b != pattern(i))
        .count();
    ensure!(bad == 0, "{bad} of {LEN} bytes read differ from B's region");
    say(format!(
        "read {} bytes of B's region (cookie {}), all as B wrote them",
        c.bytes, c.cookie
    ));
    let reads = t.device().counters().non_posted_reads;
    say(format!("non-posted reads across the bridge: {reads}"));

    t.post_send(qp, b"done", 0)?;
    // A sent last: it waits for B to hang up.
    hang_up(&mut t, qp)
}

/// Host B: the region's owner, which serves the read while it polls.
fn host_b(fabric: &PrivateFabric, say: &dyn Fn(String)) -> Result<()> {
    let dev = open(&fabric.spec, &fabric.options(B))?;
    let mut t = Transport::new(dev, Config::new(Geometry::new(2)))?;
    let qp = t.create_qp(A)?;
    let inbox = t.register_region(64, Access::LOCAL)?;
    t.post_recv(
        qp,
        Sge {
            key: inbox,
            offset: 0,
            len: 64,
        },
        0,
    )?;
    let region = t.register_region(LEN, Access::LOCAL | Access::REMOTE_READ)?;
    let data: Vec<u8> = (0..LEN).map(pattern).collect();
    t.region_write(region, 0, &data)?;
    t.wait_connected(A, WAIT)?;
    say(format!("filled region {:#010x}; sending its key", region.0));
    t.post_send(qp, &region.0.to_le_bytes(), 1)?;

    let c = next(&mut t, OpKind::Recv)?;
    let mut text = vec![0u8; c.bytes as usize];
    t.region_read(inbox, 0, &mut text)?;
    say(format!("A says {:?}", String::from_utf8_lossy(&text)));
    Ok(())
}
