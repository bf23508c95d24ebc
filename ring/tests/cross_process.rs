//! Rings across two real processes: this test binary creates two rings in a
//! `memfd` mapping and re-executes itself as a child process (selected by an
//! environment variable) that attaches to them. The parent sends numbered
//! items through an SPSC ring; the child checks each one and sends a
//! transformed copy back through an MPMC ring; the parent checks those. A
//! second exchange does the same through split handles: a `Producer` in the
//! parent and a `Consumer` in the child on an SPSC ring, and back a
//! `Producer` in the child on an SPMC ring whose consumer side the parent
//! runs through the `Ring`.
// loom builds run only tests/loom.rs; Miri can neither create a memfd nor
// start a process.
#![cfg(not(any(loom, miri)))]

use std::ffi::c_void;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use ntbdk_ring::{Ring, RingError, RingMode};

/// Environment variable that turns the `child_role` test into the child:
/// `<role>:<fd>:<len>`.
const CHILD_ENV: &str = "NTBDK_RING_TEST_CHILD";
/// Items sent each way.
const ITEMS: u64 = 2_000_000;
/// Capacity of both rings.
const CAPACITY: usize = 1024;
/// Longest either side waits for the other before failing.
const DEADLINE: Duration = Duration::from_secs(60);

/// The `i`-th item the parent sends.
fn forward(i: u64) -> u64 {
    i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5A5A_0000_0000_5A5A
}

/// What the child sends back for item `v`.
fn backward(v: u64) -> u64 {
    !v.rotate_left(17)
}

/// Offset of the second ring in the region: after the first, page-aligned.
fn second_offset() -> usize {
    Ring::<u64>::bytes_for(CAPACITY)
        .unwrap()
        .next_multiple_of(4096)
}

/// A shared read-write mapping of a whole file, unmapped on drop.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    fn new(file: &File, len: usize) -> Mapping {
        // SAFETY: a fresh shared mapping of `len` bytes of a file at least
        // that long; the kernel picks the address.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(
            ptr,
            libc::MAP_FAILED,
            "mmap: {}",
            std::io::Error::last_os_error()
        );
        Mapping {
            ptr: ptr.cast(),
            len,
        }
    }

    /// The mapping from `offset` on: (start, length).
    fn at(&self, offset: usize) -> (*mut u8, usize) {
        assert!(offset <= self.len);
        // SAFETY: `offset <= len`, so the pointer stays in (or one past) the mapping.
        (unsafe { self.ptr.add(offset) }, self.len - offset)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: mapped in `new` with this length; the rings using it are
        // dropped before the mapping (declared after it).
        unsafe { libc::munmap(self.ptr.cast::<c_void>(), self.len) };
    }
}

/// Spawns this test binary as the child in `role`, with `file` inherited.
fn spawn_child(role: &str, file: &File, len: usize) -> Child {
    let fd = file.as_raw_fd();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child_role", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, format!("{role}:{fd}:{len}"));
    // SAFETY: the closure runs in the forked child before exec and calls only
    // async-signal-safe functions (fcntl, prctl, getppid).
    unsafe {
        cmd.pre_exec(move || {
            // Let the memfd survive exec (it was created close-on-exec, so
            // no other child of this test process inherits it).
            if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Die with the parent, should the test process be killed.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    };
    cmd.spawn().expect("spawn the child process")
}

/// Waits for `child` until the deadline; kills it if it is still running.
fn wait_child(child: &mut Child, deadline: Instant) -> ExitStatus {
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("child process did not finish before the deadline: killed");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Kills the child if the parent's side panics, so no process is left over.
struct KillOnDrop(Option<Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn new_region(len: usize) -> File {
    let memfd = memfd::MemfdOptions::default()
        .close_on_exec(true)
        .create("ntbdk-ring-test")
        .expect("memfd_create");
    let file = memfd.into_file();
    file.set_len(len as u64).unwrap();
    file
}

#[test]
fn parent_and_child_process_exchange_every_item() {
    let len = second_offset() + Ring::<u64>::bytes_for(CAPACITY).unwrap();
    let file = new_region(len);
    let map = Mapping::new(&file, len);
    let (a, a_len) = map.at(0);
    let (b, b_len) = map.at(second_offset());
    // SAFETY: both regions are inside the mapping, page-aligned, disjoint,
    // and outlive the rings (dropped first, in reverse declaration order);
    // only ring handles touch them.
    let to_child = unsafe { Ring::<u64>::init_in(a, a_len, CAPACITY, RingMode::SPSC) }.unwrap();
    // SAFETY: as above.
    let from_child = unsafe { Ring::<u64>::init_in(b, b_len, CAPACITY, RingMode::MPMC) }.unwrap();

    let mut child = KillOnDrop(Some(spawn_child("echo", &file, len)));
    let deadline = Instant::now() + DEADLINE;
    let (mut sent, mut received) = (0u64, 0u64);
    let mut out = [0u64; 64];
    let mut batch = [0u64; 64];
    while received < ITEMS {
        assert!(
            Instant::now() < deadline,
            "exchange stalled at {sent} sent, {received} received"
        );
        if let Some(status) = child.0.as_mut().unwrap().try_wait().unwrap() {
            // The child exits once it has sent everything back; what it sent
            // may still be in the ring.
            assert!(status.success(), "child failed: {status}");
            assert_eq!(
                received + from_child.len() as u64,
                ITEMS,
                "child exited before sending everything back"
            );
        }
        let n = (ITEMS - sent).min(batch.len() as u64) as usize;
        for (k, slot) in batch[..n].iter_mut().enumerate() {
            *slot = forward(sent + k as u64);
        }
        sent += to_child.enqueue_burst(&batch[..n]).n as u64;
        let got = from_child.dequeue_burst(&mut out).n;
        for &v in &out[..got] {
            assert_eq!(
                v,
                backward(forward(received)),
                "item {received} came back wrong"
            );
            received += 1;
        }
        if got == 0 {
            std::thread::yield_now();
        }
    }
    let status = wait_child(child.0.as_mut().unwrap(), deadline);
    child.0 = None;
    assert!(status.success(), "child failed: {status}");
    assert!(to_child.is_empty() && from_child.is_empty());
}

#[test]
fn parent_and_child_process_exchange_every_item_through_handles() {
    let len = second_offset() + Ring::<u64>::bytes_for(CAPACITY).unwrap();
    let file = new_region(len);
    let map = Mapping::new(&file, len);
    let (a, a_len) = map.at(0);
    let (b, b_len) = map.at(second_offset());
    // SAFETY: both regions are inside the mapping, page-aligned, disjoint,
    // and outlive the handles (dropped first, in reverse declaration order);
    // only ring handles touch them.
    let mut to_child = unsafe { Ring::<u64>::init_in(a, a_len, CAPACITY, RingMode::SPSC) }
        .unwrap()
        .into_producer()
        .unwrap();
    // The child takes this ring's producer handle; we consume through the
    // Ring (its consumer side is Multi, so no handle).
    // SAFETY: as above.
    let from_child = unsafe { Ring::<u64>::init_in(b, b_len, CAPACITY, RingMode::SPMC) }.unwrap();

    let mut child = KillOnDrop(Some(spawn_child("echo-handles", &file, len)));
    let deadline = Instant::now() + DEADLINE;
    let (mut sent, mut received) = (0u64, 0u64);
    let mut out = [0u64; 64];
    let mut batch = [0u64; 64];
    let mut round = 0u64;
    while received < ITEMS {
        assert!(
            Instant::now() < deadline,
            "exchange stalled at {sent} sent, {received} received"
        );
        if let Some(status) = child.0.as_mut().unwrap().try_wait().unwrap() {
            assert!(status.success(), "child failed: {status}");
            assert_eq!(
                received + from_child.len() as u64,
                ITEMS,
                "child exited before sending everything back"
            );
        }
        round += 1;
        // Alternate single elements, bulks and bursts.
        let n = (ITEMS - sent).min(1 + round % batch.len() as u64) as usize;
        for (k, slot) in batch[..n].iter_mut().enumerate() {
            *slot = forward(sent + k as u64);
        }
        sent += match round % 3 {
            _ if n == 0 => 0,
            0 => u64::from(to_child.enqueue(batch[0]).is_ok()),
            1 => to_child.enqueue_bulk(&batch[..n]).map_or(0, |_| n as u64),
            _ => to_child.enqueue_burst(&batch[..n]).n as u64,
        };
        let got = from_child.dequeue_burst(&mut out).n;
        for &v in &out[..got] {
            assert_eq!(
                v,
                backward(forward(received)),
                "item {received} came back wrong"
            );
            received += 1;
        }
        if got == 0 {
            std::thread::yield_now();
        }
    }
    let status = wait_child(child.0.as_mut().unwrap(), deadline);
    child.0 = None;
    assert!(status.success(), "child failed: {status}");
    assert_eq!(sent, ITEMS);
    assert_eq!(to_child.free_count(), CAPACITY);
    assert!(from_child.is_empty());
}

#[test]
fn child_process_sees_element_mismatch() {
    let len = Ring::<u64>::bytes_for(CAPACITY).unwrap();
    let file = new_region(len);
    let map = Mapping::new(&file, len);
    let (a, a_len) = map.at(0);
    // SAFETY: the whole mapping, page-aligned, outlives the ring.
    let ring = unsafe { Ring::<u64>::init_in(a, a_len, CAPACITY, RingMode::MPMC) }.unwrap();
    ring.enqueue(42).unwrap();
    let mut child = KillOnDrop(Some(spawn_child("wrong-type", &file, len)));
    let status = wait_child(child.0.as_mut().unwrap(), Instant::now() + DEADLINE);
    child.0 = None;
    assert!(status.success(), "child failed: {status}");
    // The child's failed attach changed nothing.
    assert_eq!(ring.dequeue(), Some(42));
}

/// The child's side: a no-op unless the parent set `CHILD_ENV`.
#[test]
fn child_role() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut parts = spec.split(':');
    let role = parts.next().unwrap().to_string();
    let fd: i32 = parts.next().unwrap().parse().unwrap();
    let len: usize = parts.next().unwrap().parse().unwrap();
    // SAFETY: the parent passed us this open memfd; we own our copy of it.
    let file = unsafe { File::from_raw_fd(fd) };
    let map = Mapping::new(&file, len);
    match role.as_str() {
        "echo" => child_echo(&map),
        "echo-handles" => child_echo_handles(&map),
        "wrong-type" => {
            let (a, a_len) = map.at(0);
            // SAFETY: the region is the parent's ring, mapped for `len` bytes.
            let err = unsafe { Ring::<u32>::attach(a, a_len) }.unwrap_err();
            assert!(
                matches!(
                    err,
                    RingError::ElementMismatch {
                        found_size: 8,
                        expected_size: 4,
                        ..
                    }
                ),
                "{err}"
            );
            // With the right type it attaches and sees the parent's item.
            // SAFETY: as above.
            let ring = unsafe { Ring::<u64>::attach(a, a_len) }.unwrap();
            assert_eq!(ring.mode(), RingMode::MPMC);
            assert_eq!(ring.len(), 1);
        }
        other => panic!("unknown child role {other}"),
    }
}

/// Checks every item from the parent and sends its transform back.
fn child_echo(map: &Mapping) {
    let (a, a_len) = map.at(0);
    let (b, b_len) = map.at(second_offset());
    // SAFETY: the parent initialised both rings there before spawning us and
    // keeps them mapped until we exit; only ring handles touch them.
    let from_parent = unsafe { Ring::<u64>::attach(a, a_len) }.unwrap();
    // SAFETY: as above.
    let to_parent = unsafe { Ring::<u64>::attach(b, b_len) }.unwrap();
    assert_eq!(from_parent.mode(), RingMode::SPSC);
    assert_eq!(to_parent.mode(), RingMode::MPMC);
    let deadline = Instant::now() + DEADLINE;
    let mut buf = [0u64; 48];
    let mut next = 0u64;
    while next < ITEMS {
        assert!(Instant::now() < deadline, "child stalled at item {next}");
        let got = from_parent.dequeue_burst(&mut buf).n;
        for v in &mut buf[..got] {
            assert_eq!(*v, forward(next), "item {next} arrived wrong");
            *v = backward(*v);
            next += 1;
        }
        let mut sent = 0;
        while sent < got {
            assert!(Instant::now() < deadline, "parent stopped consuming");
            // Alternate bulk and single enqueues to cover both paths.
            if got - sent >= 4 && to_parent.enqueue_bulk(&buf[sent..sent + 4]).is_ok() {
                sent += 4;
            } else if to_parent.enqueue(buf[sent]).is_ok() {
                sent += 1;
            } else {
                std::thread::yield_now();
            }
        }
        if got == 0 {
            std::thread::yield_now();
        }
    }
}

/// Checks every item from the parent through a `Consumer` handle and sends
/// its transform back through a `Producer` handle.
fn child_echo_handles(map: &Mapping) {
    let (a, a_len) = map.at(0);
    let (b, b_len) = map.at(second_offset());
    // SAFETY: the parent initialised both rings there before spawning us and
    // keeps them mapped until we exit; only ring handles touch them.
    let mut from_parent = unsafe { Ring::<u64>::attach(a, a_len) }
        .unwrap()
        .into_consumer()
        .unwrap();
    // SAFETY: as above.
    let mut to_parent = unsafe { Ring::<u64>::attach(b, b_len) }
        .unwrap()
        .into_producer()
        .unwrap();
    assert_eq!(from_parent.mode(), RingMode::SPSC);
    assert_eq!(to_parent.mode(), RingMode::SPMC);
    let deadline = Instant::now() + DEADLINE;
    let mut buf = [0u64; 48];
    let mut next = 0u64;
    let mut round = 0usize;
    while next < ITEMS {
        assert!(Instant::now() < deadline, "child stalled at item {next}");
        round += 1;
        // Alternate single elements, bulks of 3 and bursts.
        let got = match round % 3 {
            0 => match from_parent.dequeue() {
                Some(v) => {
                    buf[0] = v;
                    1
                }
                None => 0,
            },
            1 => from_parent.dequeue_bulk(&mut buf[..3]).map_or(0, |_| 3),
            _ => from_parent.dequeue_burst(&mut buf).n,
        };
        for v in &mut buf[..got] {
            assert_eq!(*v, forward(next), "item {next} arrived wrong");
            *v = backward(*v);
            next += 1;
        }
        let mut sent = 0;
        while sent < got {
            assert!(Instant::now() < deadline, "parent stopped consuming");
            if got - sent >= 4 && to_parent.enqueue_bulk(&buf[sent..sent + 4]).is_ok() {
                sent += 4;
            } else if to_parent.enqueue(buf[sent]).is_ok() {
                sent += 1;
            } else {
                std::thread::yield_now();
            }
        }
        if got == 0 {
            std::thread::yield_now();
        }
    }
}
