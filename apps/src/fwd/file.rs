//! file-trans: a file as eager sends — a header with its size, chunks of one
//! eager buffer, a trailer with its checksum — and the receiver's
//! acknowledgement, which says whether the checksums matched.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use ntbdk_pmd::transport::{Completion, OpKind, Qp, SendWr};

use super::checksum::Checksum;
use super::send_all;
use super::stats::Stats;
use crate::cli::session::{check_interrupted, completion_error};
use crate::perf::{EAGER_SIZE, Endpoint};

const HEADER: &[u8; 8] = b"NTBFHDR1";
const TRAILER: &[u8; 8] = b"NTBFEND1";
const ACK: &[u8; 8] = b"NTBFACK1";

/// What a transfer moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transfer {
    /// Bytes of the file.
    pub bytes: u64,
    /// Its checksum (the sender's, which the receiver's matched).
    pub checksum: u64,
    /// How long it took.
    pub elapsed: Duration,
}

fn tagged(tag: &[u8; 8], v: u64) -> [u8; 16] {
    let mut m = [0u8; 16];
    m[..8].copy_from_slice(tag);
    m[8..].copy_from_slice(&v.to_le_bytes());
    m
}

fn untag(tag: &[u8; 8], m: &[u8]) -> Option<u64> {
    (m.len() >= 16 && &m[..8] == tag).then(|| u64::from_le_bytes(m[8..16].try_into().unwrap()))
}

/// Waits for the next message from `qp`'s peer into `buf`; returns its
/// length. Fails after `timeout` without one.
fn next_message(
    ep: &mut Endpoint,
    qp: Qp,
    comps: &mut [Completion],
    buf: &mut [u8],
    timeout: Duration,
    stats: &mut Stats,
) -> Result<usize> {
    let start = Instant::now();
    let mut polls = 0u32;
    loop {
        // One completion at a time keeps the messages in order here.
        let n = ep.t.poll_completions(&mut comps[..1]);
        if n == 1 {
            let c = comps[0];
            match c.op {
                OpKind::Recv if c.peer == qp.peer() => {
                    if !c.status.is_ok() {
                        return Err(completion_error(&c));
                    }
                    let len = c.bytes as usize;
                    ep.read_recv(c.cookie, &mut buf[..len])?;
                    ep.repost(qp, c.cookie)?;
                    stats.queue(c.peer).received(c.bytes);
                    return Ok(len);
                }
                OpKind::Send => stats.queue(c.peer).sent(c.bytes),
                _ if !c.status.is_ok() => return Err(completion_error(&c)),
                _ => {}
            }
            continue;
        }
        polls = polls.wrapping_add(1);
        if polls.is_multiple_of(1024) {
            check_interrupted()?;
            if start.elapsed() >= timeout {
                bail!(
                    "nothing from port {} for {timeout:?}: did the other side stop?",
                    qp.peer()
                );
            }
        }
    }
}

/// Sends the file at `path` to `qp`'s peer (which runs [`recv_file`]) in
/// bursts of `burst` chunks, then waits for its acknowledgement. Fails if
/// the receiver reports a checksum mismatch.
pub fn send_file(
    ep: &mut Endpoint,
    qp: Qp,
    path: &Path,
    burst: usize,
    timeout: Duration,
    stats: &mut Stats,
) -> Result<Transfer> {
    let mut file =
        File::open(path).with_context(|| format!("opening {} to send", path.display()))?;
    let size = file
        .metadata()
        .with_context(|| format!("reading the size of {}", path.display()))?
        .len();
    ep.post_recvs(qp)?;
    let start = Instant::now();
    send_all(
        ep,
        qp,
        &[SendWr {
            data: &tagged(HEADER, size),
            cookie: 0,
        }],
        timeout,
    )?;
    let chunk = EAGER_SIZE as usize;
    let mut buf = vec![0u8; chunk * burst.max(1)];
    let mut sum = Checksum::new();
    let mut left = size;
    while left > 0 {
        let want = (buf.len() as u64).min(left) as usize;
        file.read_exact(&mut buf[..want])
            .with_context(|| format!("reading {} (did it shrink?)", path.display()))?;
        sum.update(&buf[..want]);
        let wrs: Vec<SendWr<'_>> = buf[..want]
            .chunks(chunk)
            .map(|c| SendWr { data: c, cookie: 0 })
            .collect();
        send_all(ep, qp, &wrs, timeout)?;
        left -= want as u64;
    }
    send_all(
        ep,
        qp,
        &[SendWr {
            data: &tagged(TRAILER, sum.value()),
            cookie: 0,
        }],
        timeout,
    )?;
    let mut comps = vec![Completion::default(); 1];
    let mut msg = vec![0u8; chunk];
    let len = next_message(ep, qp, &mut comps, &mut msg, timeout, stats)
        .context("waiting for the receiver's acknowledgement")?;
    match untag(ACK, &msg[..len]) {
        Some(theirs) if theirs == sum.value() => Ok(Transfer {
            bytes: size,
            checksum: theirs,
            elapsed: start.elapsed(),
        }),
        Some(theirs) => bail!(
            "the receiver's checksum {theirs:016x} differs from ours {:016x}: the copy is corrupt",
            sum.value()
        ),
        None => bail!("the receiver answered something other than an acknowledgement"),
    }
}

/// Receives one file from `qp`'s peer (which runs [`send_file`]) into
/// `path`, checks its checksum and acknowledges. Fails (after answering)
/// on a mismatch, and after `timeout` without a message.
pub fn recv_file(
    ep: &mut Endpoint,
    qp: Qp,
    path: &Path,
    timeout: Duration,
    stats: &mut Stats,
) -> Result<Transfer> {
    ep.post_recvs(qp)?;
    let mut comps = vec![Completion::default(); 1];
    let mut msg = vec![0u8; EAGER_SIZE as usize];
    let len =
        next_message(ep, qp, &mut comps, &mut msg, timeout, stats).context("waiting for a file")?;
    let start = Instant::now();
    let Some(size) = untag(HEADER, &msg[..len]) else {
        bail!("port {} sent something other than a file header", qp.peer());
    };
    let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let mut sum = Checksum::new();
    let mut got = 0u64;
    while got < size {
        let len = next_message(ep, qp, &mut comps, &mut msg, timeout, stats)?;
        if got + len as u64 > size {
            bail!(
                "port {} sent more than the {size} bytes it announced",
                qp.peer()
            );
        }
        sum.update(&msg[..len]);
        out.write_all(&msg[..len])
            .with_context(|| format!("writing {}", path.display()))?;
        got += len as u64;
    }
    out.flush()
        .with_context(|| format!("writing {}", path.display()))?;
    let len = next_message(ep, qp, &mut comps, &mut msg, timeout, stats)?;
    let Some(theirs) = untag(TRAILER, &msg[..len]) else {
        bail!("port {} sent no trailer after the file", qp.peer());
    };
    send_all(
        ep,
        qp,
        &[SendWr {
            data: &tagged(ACK, sum.value()),
            cookie: 0,
        }],
        timeout,
    )?;
    // Let the acknowledgement leave before the caller drops the transport.
    let end = Instant::now() + Duration::from_millis(20);
    while Instant::now() < end {
        ep.t.progress();
    }
    if theirs != sum.value() {
        bail!(
            "checksum mismatch: the sender's is {theirs:016x}, the received file's {:016x}",
            sum.value()
        );
    }
    Ok(Transfer {
        bytes: size,
        checksum: theirs,
        elapsed: start.elapsed(),
    })
}
