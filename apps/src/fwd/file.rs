//! file-trans over a data queue: a header mbuf with the file's size, the
//! file in chunks of one buffer (the chunk index in the user word), a
//! trailer with the chunk count and the file's [`Checksum`]; the receiver
//! writes the chunks out in order, checks count and checksum, and answers
//! with an acknowledgement that says whether they matched, so the sender
//! knows the file arrived intact.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use ntbdk_pmd::mbuf::{Mbuf, MbufPool};
use ntbdk_pmd::transport::DataQueue;

use super::checksum::Checksum;
use super::lcore::{Every, LcoreCtx, Step, counts, drop_unsent, spin, tx_counted};
use super::pattern::{Kind, parse_user, user_word};

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

impl Transfer {
    /// The summary line, `what` being "sent" or "received".
    pub fn line(&self, what: &str) -> String {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        format!(
            "file {what}: {} bytes in {secs:.3} s ({:.3} GB/s), checksum {:016x} matches",
            self.bytes,
            self.bytes as f64 / secs / 1e9,
            self.checksum
        )
    }
}

/// A control mbuf of `kind` with sequence `seq` and the little-endian
/// `words` as payload.
fn control(pool: &MbufPool, kind: Kind, seq: u64, words: &[u64]) -> Result<Mbuf> {
    let mut m = pool.alloc().context("allocating a control mbuf")?;
    for w in words {
        m.append(&w.to_le_bytes())?;
    }
    m.set_user(user_word(kind, seq));
    Ok(m)
}

/// Word `i` of a control mbuf's payload (`None` if it is too short).
fn word(m: &Mbuf, i: usize) -> Option<u64> {
    let mut b = [0u8; 8];
    m.read(i * 8, &mut b).ok()?;
    Some(u64::from_le_bytes(b))
}

/// Fills `buf` from `f` as far as the file goes; returns the bytes read.
fn read_full(f: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Sends the file at `path` on `q` (to a [`recv_file`] on the other side)
/// in mbufs of `pool`, and waits for the receiver's acknowledgement.
pub fn send_file(mut q: DataQueue, pool: MbufPool, path: &Path, ctx: LcoreCtx) -> Result<Transfer> {
    let peer = q.peer();
    let mut f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let size = f.metadata()?.len();
    let chunk = q.buf_size().min(pool.data_room());
    let started = Instant::now();
    let mut sum = Checksum::new();
    let mut batch = vec![control(&pool, Kind::FileHeader, 0, &[size])?];
    let mut got: Vec<Mbuf> = Vec::new();
    let (mut chunks, mut sent_bytes) = (0u64, 0u64);
    let (mut eof, mut trailer_queued) = (false, false);
    let mut ack: Option<bool> = None;
    let mut idle_since = Instant::now();
    let mut every = Every::default();
    let r = spin(&ctx, || {
        while !eof && batch.len() < ctx.burst {
            let Ok(mut m) = pool.alloc() else { break };
            m.set_len(chunk)?;
            let n = read_full(&mut f, m.data_mut().expect("our own pool"))
                .with_context(|| format!("reading {}", path.display()))?;
            if n == 0 {
                eof = true;
                break;
            }
            m.set_len(n)?;
            sum.update(m.data().expect("our own pool"));
            m.set_user(user_word(Kind::FileChunk, chunks));
            chunks += 1;
            sent_bytes += n as u64;
            batch.push(m);
        }
        if eof && !trailer_queued {
            if sent_bytes != size {
                bail!(
                    "{} changed while being sent ({size} bytes at the start, {sent_bytes} read)",
                    path.display()
                );
            }
            batch.push(control(&pool, Kind::FileTrailer, chunks, &[sum.value()])?);
            trailer_queued = true;
        }
        let mut work = 0;
        if !batch.is_empty() {
            work += tx_counted(|m| q.tx_burst(m), &mut batch, &ctx.counters);
        }
        let n = q.rx_burst(&mut got, ctx.burst);
        let (pkts, b) = counts(&got);
        ctx.counters.received(pkts, b);
        for m in &got {
            if let (Some(Kind::FileAck), ok) = parse_user(m.user()) {
                ack = Some(ok == 1);
            }
        }
        Mbuf::free_bulk(&mut got);
        if ack.is_some() {
            return Ok(Step::Done);
        }
        work += n;
        if work > 0 {
            idle_since = Instant::now();
        } else if every.tick(256) {
            if !q.is_up() {
                bail!("port {peer} left before acknowledging the file: did its receiver fail?");
            }
            if idle_since.elapsed() >= ctx.timeout {
                bail!(
                    "port {peer} took nothing and answered nothing for {:?}: is it an {} \
                     file-trans receiver (--recv), and still running?",
                    ctx.timeout,
                    super::TOOL
                );
            }
        }
        Ok(Step::Work(work))
    });
    drop_unsent(&mut batch, &ctx.counters);
    if !r? {
        return Err(crate::cli::Interrupted.into());
    }
    if ack != Some(true) {
        ctx.counters.failed(1);
        bail!(
            "port {peer} received the file but its checksum differs from ours ({:016x}): \
             the copy is corrupt",
            sum.value()
        );
    }
    Ok(Transfer {
        bytes: size,
        checksum: sum.value(),
        elapsed: started.elapsed(),
    })
}

/// Receives a file on `q` (from a [`send_file`] on the other side) into
/// `path`, checks its chunk count and checksum, and acknowledges (with a
/// control mbuf of `pool`). Fails after `--timeout` without a message.
pub fn recv_file(mut q: DataQueue, pool: MbufPool, path: &Path, ctx: LcoreCtx) -> Result<Transfer> {
    let peer = q.peer();
    let mut out: Option<BufWriter<File>> = None;
    let mut started = Instant::now();
    let (mut size, mut bytes, mut next) = (0u64, 0u64, 0u64);
    let mut sum = Checksum::new();
    let mut scratch: Vec<u8> = Vec::new();
    let mut got: Vec<Mbuf> = Vec::with_capacity(ctx.burst);
    let mut ack: Vec<Mbuf> = Vec::new();
    let mut verdict: Option<Result<u64, String>> = None;
    let mut idle_since = Instant::now();
    let mut every = Every::default();
    let r = spin(&ctx, || {
        let n = q.rx_burst(&mut got, ctx.burst);
        let (pkts, b) = counts(&got);
        ctx.counters.received(pkts, b);
        for m in &got {
            match parse_user(m.user()) {
                (Some(Kind::FileHeader), _) => {
                    size = word(m, 0).context("a file header without the file's size")?;
                    let f = File::create(path)
                        .with_context(|| format!("--recv {}: cannot create it", path.display()))?;
                    out = Some(BufWriter::with_capacity(1 << 20, f));
                    started = Instant::now();
                }
                (Some(Kind::FileChunk), seq) => {
                    let Some(w) = out.as_mut() else {
                        bail!(
                            "port {peer} sent a file chunk before the header: restart both sides"
                        );
                    };
                    if seq != next {
                        bail!(
                            "chunk {seq} arrived when chunk {next} was expected: a chunk was lost \
                             or reordered"
                        );
                    }
                    next += 1;
                    scratch.resize(m.len(), 0);
                    m.read(0, &mut scratch)?;
                    sum.update(&scratch);
                    w.write_all(&scratch)
                        .with_context(|| format!("writing {}", path.display()))?;
                    bytes += m.len() as u64;
                }
                (Some(Kind::FileTrailer), count) => {
                    let theirs = word(m, 0).context("a file trailer without the checksum")?;
                    verdict = Some(if count != next || bytes != size {
                        Err(format!(
                            "{next} chunks and {bytes} bytes arrived, the sender sent {count} \
                             chunks of a {size}-byte file"
                        ))
                    } else if theirs != sum.value() {
                        Err(format!(
                            "checksum {:016x} of the bytes received differs from the sender's \
                             {theirs:016x}",
                            sum.value()
                        ))
                    } else {
                        Ok(theirs)
                    });
                    let ok = matches!(verdict, Some(Ok(_)));
                    ack.push(control(&pool, Kind::FileAck, u64::from(ok), &[])?);
                }
                _ => {}
            }
        }
        Mbuf::free_bulk(&mut got);
        let mut work = n;
        if !ack.is_empty() {
            work += tx_counted(|m| q.tx_burst(m), &mut ack, &ctx.counters);
        }
        if work > 0 {
            idle_since = Instant::now();
        }
        if verdict.is_some() && ack.is_empty() {
            // Acknowledged: wait for the sender to read it and leave, so
            // our leaving does not tear the connection down under it.
            if !q.is_up() || idle_since.elapsed() >= ctx.linger() {
                return Ok(Step::Done);
            }
        } else if work == 0 && every.tick(256) {
            if !q.is_up() {
                bail!("port {peer} left after {bytes} bytes of the file, before its trailer");
            }
            if idle_since.elapsed() >= ctx.timeout {
                bail!(
                    "nothing from port {peer} for {:?} ({bytes} bytes so far): is it an {} \
                     file-trans sender (--send), and still running?",
                    ctx.timeout,
                    super::TOOL
                );
            }
        }
        Ok(Step::Work(work))
    });
    if let Some(mut w) = out {
        w.flush()
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if !r? {
        return Err(crate::cli::Interrupted.into());
    }
    match verdict {
        Some(Ok(checksum)) => Ok(Transfer {
            bytes,
            checksum,
            elapsed: started.elapsed(),
        }),
        Some(Err(why)) => {
            ctx.counters.failed(1);
            bail!("the file received is not the one sent: {why}")
        }
        None => unreachable!("the loop ends with a verdict, an error or a stop"),
    }
}
