//! Two hosts exchange messages, and one tells the other the key of a region
//! it exposes: the key exchange every write or read starts with.
//!
//! Host B registers a region the peer may write and read, and sends its key
//! in a message (the transport's sends are how hosts tell each other keys;
//! perftest uses a TCP socket for the same). Host A receives it, greets B,
//! and B answers. Each host is a process of its own: run with no
//! arguments, the program starts host B as a child of itself on a private
//! emulated fabric, removed at the end, even on error; or run each host by
//! hand, in two terminals (in real use each host is its own machine,
//! opening the same `emu:NAME`, or `vfio:BDF` on a VM or NTB).
//!
//! ```sh
//! cargo run --release -p ntbdk-apps --example messages
//! cargo run --release -p ntbdk-apps --example messages -- --role b --fabric demo  # terminal 1
//! cargo run --release -p ntbdk-apps --example messages -- --role a --fabric demo  # terminal 2
//! ```

use anyhow::Result;
use ntbdk_pmd::hw::open::open;
use ntbdk_pmd::transport::{Access, Config, Geometry, OpKind, RegionKey, Sge, Transport};

#[path = "common/mod.rs"]
pub mod common;

use common::{Example, PrivateFabric, WAIT, hang_up, next};

const A: u16 = 0;
const B: u16 = 1;

fn main() -> Result<()> {
    EXAMPLE.main()
}

/// The example: two hosts, each a process of its own.
pub const EXAMPLE: Example = Example {
    name: "messages",
    host_a,
    host_b,
};

/// Host A: learns B's region key, greets B, reads the answer.
fn host_a(fabric: &PrivateFabric, say: &dyn Fn(String)) -> Result<()> {
    let dev = open(&fabric.spec, &fabric.options(A))?; // or "vfio:0000:00:04.0".parse()?
    let mut t = Transport::new(dev, Config::new(Geometry::new(2)))?;
    let qp = t.create_qp(B)?;
    let inbox = t.register_region(4096, Access::LOCAL)?;
    for i in 0..2 {
        let sge = Sge {
            key: inbox,
            offset: i * 2048,
            len: 2048,
        };
        t.post_recv(qp, sge, i)?;
    }
    t.wait_connected(B, WAIT)?;
    say("connected to port 1".into());

    // The key exchange: B's first message is its region's key.
    let c = next(&mut t, OpKind::Recv)?;
    let mut key = [0u8; 4];
    t.region_read(inbox, c.cookie * 2048, &mut key)?;
    let key = RegionKey(u32::from_le_bytes(key));
    say(format!(
        "B's region key is {:#010x} ({} bytes received)",
        key.0, c.bytes
    ));

    t.post_send(qp, b"hello from A", 0)?;
    let c = next(&mut t, OpKind::Recv)?;
    let mut text = vec![0u8; c.bytes as usize];
    t.region_read(inbox, c.cookie * 2048, &mut text)?;
    say(format!("received {:?}", String::from_utf8_lossy(&text)));
    Ok(()) // dropping the transport hangs up
}

/// Host B: exposes a region, sends its key, answers A's greeting.
fn host_b(fabric: &PrivateFabric, say: &dyn Fn(String)) -> Result<()> {
    let dev = open(&fabric.spec, &fabric.options(B))?;
    let mut t = Transport::new(dev, Config::new(Geometry::new(2)))?;
    let qp = t.create_qp(A)?;
    let inbox = t.register_region(2048, Access::LOCAL)?;
    t.post_recv(
        qp,
        Sge {
            key: inbox,
            offset: 0,
            len: 2048,
        },
        0,
    )?;
    // A region peers may write and read; its key is all they need.
    let shared = t.register_region(1 << 20, Access::ALL)?;
    t.wait_connected(A, WAIT)?;
    say(format!(
        "connected to port 0; sending region key {:#010x}",
        shared.0
    ));
    t.post_send(qp, &shared.0.to_le_bytes(), 1)?;

    let c = next(&mut t, OpKind::Recv)?;
    let mut text = vec![0u8; c.bytes as usize];
    t.region_read(inbox, 0, &mut text)?;
    say(format!("received {:?}", String::from_utf8_lossy(&text)));
    t.post_send(qp, b"hello from B", 2)?;
    // B sent last: it waits for A to hang up, so its message is not lost
    // with a connection torn down under it.
    hang_up(&mut t, qp)
}
