//! A write: host A writes 1 MiB into a region of host B's.
//!
//! B registers a region peers may write and sends its key in a message; A
//! fills a region of its own and posts one write naming B's key. The data
//! crosses as posted writes only (A copies straight into B's region after
//! B sent it where the region lies); A's completion means B has it. A then
//! tells B, which checks every byte and answers. Each host is a process of
//! its own (host B a child of this program, or `--role a|b --fabric NAME`
//! by hand: see the `messages` example) on a private emulated fabric,
//! removed at the end.
//!
//! ```sh
//! cargo run --release -p ntbdk-apps --example write
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
    name: "write",
    host_a,
    host_b,
};

/// The byte at `i` of what A writes.
fn pattern(i: usize) -> u8 {
    (i % 251) as u8
}

/// Host A: the writer.
fn host_a(fabric: &PrivateFabric, say: &dyn Fn(String)) -> Result<()> {
    let dev = open(&fabric.spec, &fabric.options(A))?; // or "vfio:0000:00:04.0".parse()?
    let mut t = Transport::new(dev, Config::new(Geometry::new(2)))?;
    let qp = t.create_qp(B)?; // the peer on port 1
    let inbox = t.register_region(64, Access::LOCAL)?;
    let slot = Sge {
        key: inbox,
        offset: 0,
        len: 64,
    };
    t.post_recv(qp, slot, 0)?;
    t.wait_connected(B, WAIT)?;

    // B's first message is the key of the region it lets us write.
    next(&mut t, OpKind::Recv)?;
    let mut key = [0u8; 4];
    t.region_read(inbox, 0, &mut key)?;
    let remote = RemoteAddr {
        key: RegionKey(u32::from_le_bytes(key)),
        offset: 0,
    };
    say(format!("B's region key is {:#010x}", remote.key.0));
    t.post_recv(qp, slot, 1)?;

    let data: Vec<u8> = (0..LEN).map(pattern).collect();
    let buf = t.register_region(LEN, Access::LOCAL)?;
    t.region_write(buf, 0, &data)?;
    let local = [Sge {
        key: buf,
        offset: 0,
        len: LEN as u64,
    }];
    t.post_write(qp, &local, remote, 7)?;
    let c = next(&mut t, OpKind::Write)?; // polls t.poll_completions(): B has every byte
    say(format!("wrote {} bytes into B's region", c.bytes));

    t.post_send(qp, b"written", 0)?;
    let c = next(&mut t, OpKind::Recv)?;
    let mut answer = vec![0u8; c.bytes as usize];
    t.region_read(inbox, 0, &mut answer)?;
    say(format!("B says {:?}", String::from_utf8_lossy(&answer)));
    let reads = t.device().counters().non_posted_reads;
    say(format!("non-posted reads across the bridge: {reads}"));
    Ok(()) // dropping the transport hangs up
}

/// Host B: the target, which checks what landed.
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
    let region = t.register_region(LEN, Access::LOCAL | Access::REMOTE_WRITE)?;
    t.wait_connected(A, WAIT)?;
    t.post_send(qp, &region.0.to_le_bytes(), 1)?;

    // B's transport serves the write while it polls, here for A's message.
    next(&mut t, OpKind::Recv)?;
    let mut got = vec![0u8; LEN];
    t.region_read(region, 0, &mut got)?;
    let bad = got
        .iter()
        .enumerate()
        .filter(|&(i, &b)| b != pattern(i))
        .count();
    ensure!(bad == 0, "{bad} of {LEN} bytes differ from what A wrote");
    say(format!(
        "all {LEN} bytes of region {:#010x} are A's",
        region.0
    ));
    t.post_send(qp, b"verified", 2)?;
    hang_up(&mut t, qp)
}
