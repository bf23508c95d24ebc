//! Memory zones on 4 KiB pages (the path every machine has): creation,
//! validation on attach, sharing with a real second process, and IOVA.
//! Hugepage-backed zones are tested in `hugepages.rs`.

mod common;

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::time::Duration;

use common::{child_command, is_child, is_root, run_child};
use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use ntbdk_mempool::{IovaMode, MemError, PageSize, Zone, ZoneOptions};

const TIMEOUT: Duration = Duration::from_secs(30);

/// The zone's usable bytes (each test owns its zones).
#[allow(clippy::mut_from_ref)]
fn bytes(z: &Zone) -> &mut [u8] {
    // SAFETY: the tests use each zone from one thread at a time; the slice
    // covers exactly the usable bytes.
    unsafe { std::slice::from_raw_parts_mut(z.as_ptr(), z.len()) }
}

fn pattern(i: usize, salt: u8) -> u8 {
    (i as u8).wrapping_mul(31).wrapping_add(salt) ^ (i >> 8) as u8
}

#[test]
fn small_zone_is_sized_aligned_zeroed_and_writable() {
    for len in [1, 4095, 4096, 4097, 100_000, 1 << 20] {
        let z = Zone::create("small", len, &ZoneOptions::no_huge()).unwrap();
        assert_eq!(z.page_size(), PageSize::Small4K);
        assert!(!z.is_huge());
        assert_eq!(z.name(), "small");
        assert!(z.len() >= len);
        assert_eq!(z.len() % 4096, 0, "4 KiB zones are whole pages");
        assert!(
            z.len() - len < 4096,
            "at most one page of waste: {} for {len}",
            z.len()
        );
        assert_eq!(z.as_ptr() as usize % 4096, 0);
        let b = bytes(&z);
        assert!(b.iter().all(|&x| x == 0), "zone not zero-filled");
        for (i, x) in b.iter_mut().enumerate() {
            *x = pattern(i, 1);
        }
        assert!(b.iter().enumerate().all(|(i, &x)| x == pattern(i, 1)));
    }
}

#[test]
fn bad_arguments_are_rejected() {
    let o = ZoneOptions::no_huge();
    for (name, len) in [("", 4096), ("x", 0), ("a\0b", 4096)] {
        let e = Zone::create(name, len, &o).unwrap_err();
        assert!(
            matches!(e, MemError::InvalidArgument(_)),
            "{name:?}/{len}: {e}"
        );
    }
    let long = "n".repeat(201);
    assert!(matches!(
        Zone::create(&long, 4096, &o),
        Err(MemError::InvalidArgument(_))
    ));
    let e = Zone::create("huge-len", usize::MAX - 10, &o).unwrap_err();
    assert!(matches!(e, MemError::InvalidArgument(_)), "{e}");
    // A name of the maximum length works and survives attach.
    let name = "m".repeat(200);
    let z = Zone::create(&name, 10, &o).unwrap();
    let a = Zone::attach(z.as_fd().try_clone_to_owned().unwrap()).unwrap();
    assert_eq!(a.name(), name);
}

#[test]
fn attach_sees_the_same_bytes_and_metadata() {
    let z = Zone::create("attach-me", 3 * 4096 + 5, &ZoneOptions::no_huge()).unwrap();
    for (i, x) in bytes(&z).iter_mut().enumerate() {
        *x = pattern(i, 7);
    }
    let a = Zone::attach(z.as_fd().try_clone_to_owned().unwrap()).unwrap();
    assert_eq!(a.name(), "attach-me");
    assert_eq!(a.len(), z.len());
    assert_eq!(a.page_size(), PageSize::Small4K);
    assert_ne!(a.as_ptr(), z.as_ptr(), "a second, distinct mapping");
    assert!(
        bytes(&a)
            .iter()
            .enumerate()
            .all(|(i, &x)| x == pattern(i, 7))
    );
    bytes(&a)[100] = 0xEE;
    assert_eq!(
        bytes(&z)[100],
        0xEE,
        "writes through either mapping are shared"
    );
    drop(z);
    // The attached mapping outlives the creator's handle.
    assert_eq!(bytes(&a)[100], 0xEE);
}

#[test]
fn open_from_pid_in_the_same_process() {
    let z = Zone::create("by-name", 8192, &ZoneOptions::no_huge()).unwrap();
    bytes(&z)[5] = 5;
    let pid = std::process::id() as i32;
    let a = Zone::open_from_pid(pid, z.as_fd().as_raw_fd()).unwrap();
    assert_eq!(bytes(&a)[5], 5);
    let e = Zone::open_from_pid(pid, 1_000_000).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("/proc/") && msg.contains("must be alive"),
        "{msg}"
    );
    // A descriptor that is not a zone (here a pipe, which an open could
    // block on) is refused by what it names.
    let (rd, _wr) = nix::unistd::pipe().unwrap();
    let e = Zone::open_from_pid(pid, rd.as_raw_fd()).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("pipe:") && msg.contains("not a zone memfd"),
        "{msg}"
    );
}

/// A memfd named like a zone, sealed like one, with `len` bytes of `fill`.
fn fake_zone(name: &str, len: usize, fill: u8, seal: bool) -> OwnedFd {
    let cname = std::ffi::CString::new(name).unwrap();
    // SAFETY: valid C string; plain system calls on the fresh descriptor.
    unsafe {
        let fd = libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING);
        assert!(fd >= 0);
        let fd = OwnedFd::from_raw_fd(fd);
        assert_eq!(libc::ftruncate(fd.as_raw_fd(), len as libc::off_t), 0);
        let buf = vec![fill; len];
        assert_eq!(
            libc::pwrite(fd.as_raw_fd(), buf.as_ptr().cast(), len, 0),
            len as isize
        );
        if seal {
            let s = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
            assert_eq!(libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, s), 0);
        }
        fd
    }
}

fn bad_zone_reason(fd: OwnedFd) -> String {
    match Zone::attach(fd) {
        Err(MemError::BadZone { why }) => why,
        Err(e) => panic!("expected BadZone, got {e}"),
        Ok(z) => panic!("attached a bogus zone: {z:?}"),
    }
}

#[test]
fn attach_rejects_what_is_not_a_zone() {
    // Not a memfd at all.
    let f = std::fs::File::open("/dev/null").unwrap();
    assert!(bad_zone_reason(f.into()).contains("not a zone memfd"));
    // A memfd of someone else.
    let why = bad_zone_reason(fake_zone("other", 16384, 0, true));
    assert!(why.contains("not a zone memfd"), "{why}");
    // Named like a zone but resizable.
    let why = bad_zone_reason(fake_zone("ntbdk:unsealed", 16384, 0, false));
    assert!(why.contains("not sealed"), "{why}");
    // Sealed, but no header.
    let why = bad_zone_reason(fake_zone("ntbdk:garbage", 16384, 0xAB, true));
    assert!(why.contains("bad magic"), "{why}");
    // Too small to hold a zone.
    let why = bad_zone_reason(fake_zone("ntbdk:tiny", 4096, 0, true));
    assert!(why.contains("not a whole number"), "{why}");
}

#[test]
fn attach_rejects_a_damaged_header() {
    let z = Zone::create("damaged", 4096, &ZoneOptions::no_huge()).unwrap();
    // The header sits right after the usable bytes, in the last page.
    // SAFETY: the header page is part of the zone's mapping (len() + 4 KiB).
    let header = unsafe { std::slice::from_raw_parts_mut(z.as_ptr().add(z.len()), 64) };
    let saved = header.to_vec();
    // Version field (after the 8-byte magic).
    header[8] ^= 0xFF;
    let why = bad_zone_reason(z.as_fd().try_clone_to_owned().unwrap());
    assert!(why.contains("version"), "{why}");
    header.copy_from_slice(&saved);
    // Usable length (bytes 24..32) larger than the file.
    header[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
    let why = bad_zone_reason(z.as_fd().try_clone_to_owned().unwrap());
    assert!(why.contains("usable length"), "{why}");
    header.copy_from_slice(&saved);
    Zone::attach(z.as_fd().try_clone_to_owned().unwrap()).expect("restored header attaches");
}

// ---- cross-process sharing -------------------------------------------------

/// Child: receives a zone over the Unix socket at fd `NTBDK_SOCK`, checks the
/// parent's pattern and writes its own into the second half.
#[test]
fn child_zone_over_scm_rights() {
    if !is_child("child_zone_over_scm_rights") {
        return;
    }
    let sock: RawFd = std::env::var("NTBDK_SOCK").unwrap().parse().unwrap();
    let mut byte = [0u8; 1];
    let mut iov = [IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!(RawFd);
    let msg = recvmsg::<()>(sock, &mut iov, Some(&mut space), MsgFlags::empty()).unwrap();
    let fd = msg
        .cmsgs()
        .unwrap()
        .find_map(|c| match c {
            ControlMessageOwned::ScmRights(fds) => fds.first().copied(),
            _ => None,
        })
        .expect("no fd received");
    // SAFETY: SCM_RIGHTS installed a fresh descriptor that we now own.
    let z = Zone::attach(unsafe { OwnedFd::from_raw_fd(fd) }).unwrap();
    check_and_answer(&z, "shared-scm");
}

/// Child: opens the parent's zone through `/proc/<pid>/fd/<fd>`.
#[test]
fn child_zone_by_pid() {
    if !is_child("child_zone_by_pid") {
        return;
    }
    let pid = std::env::var("NTBDK_PID").unwrap().parse().unwrap();
    let fd = std::env::var("NTBDK_FD").unwrap().parse().unwrap();
    let z = Zone::open_from_pid(pid, fd).unwrap();
    check_and_answer(&z, "shared-pid");
}

fn check_and_answer(z: &Zone, name: &str) {
    assert_eq!(z.name(), name);
    let half = z.len() / 2;
    let b = bytes(z);
    for (i, &x) in b[..half].iter().enumerate() {
        assert_eq!(x, pattern(i, 3), "byte {i} from the parent");
    }
    for (i, x) in b[half..].iter_mut().enumerate() {
        *x = pattern(i, 9);
    }
}

fn parent_zone(name: &str) -> Zone {
    let z = Zone::create(name, 256 * 1024, &ZoneOptions::no_huge()).unwrap();
    let half = z.len() / 2;
    for (i, x) in bytes(&z)[..half].iter_mut().enumerate() {
        *x = pattern(i, 3);
    }
    z
}

fn check_child_answer(z: &Zone) {
    let half = z.len() / 2;
    for (i, &x) in bytes(z)[half..].iter().enumerate() {
        assert_eq!(x, pattern(i, 9), "byte {} from the child", half + i);
    }
}

#[test]
fn zone_shared_with_a_child_over_scm_rights() {
    if common::role().is_some() {
        return;
    }
    let z = parent_zone("shared-scm");
    let (ours, theirs) = UnixStream::pair().unwrap();
    const CHILD_SOCK: RawFd = 10;
    let mut cmd = child_command("child_zone_over_scm_rights");
    let theirs_fd = theirs.as_raw_fd();
    cmd.env("NTBDK_SOCK", CHILD_SOCK.to_string());
    // SAFETY: dup2 is async-signal-safe; it gives the child the socket at a
    // known number without CLOEXEC.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(theirs_fd, CHILD_SOCK) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().unwrap();
    let reaper = common::Reaper(Some(child));
    drop(theirs);
    let fds = [z.as_fd().as_raw_fd()];
    sendmsg::<()>(
        ours.as_raw_fd(),
        &[IoSlice::new(b"z")],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .unwrap();
    let st = reaper.wait(TIMEOUT);
    assert!(st.success(), "child failed: {st}");
    check_child_answer(&z);
}

#[test]
fn zone_shared_with_a_child_by_pid() {
    if common::role().is_some() {
        return;
    }
    let z = parent_zone("shared-pid");
    let mut cmd = child_command("child_zone_by_pid");
    cmd.env("NTBDK_PID", std::process::id().to_string())
        .env("NTBDK_FD", z.as_fd().as_raw_fd().to_string());
    run_child(cmd, TIMEOUT);
    check_child_answer(&z);
}

// ---- IOVA --------------------------------------------------------------------

#[test]
fn iova_va_is_the_virtual_address() {
    let z = Zone::create("iova-va", 3 * 4096, &ZoneOptions::no_huge()).unwrap();
    for off in [0, 1, 4095, 4096, z.len() - 1] {
        assert_eq!(
            z.iova(off, IovaMode::Va).unwrap(),
            z.as_ptr() as u64 + off as u64
        );
    }
    let e = z.iova(z.len(), IovaMode::Va).unwrap_err();
    assert!(matches!(e, MemError::OutOfRange { .. }), "{e}");
    assert!(matches!(
        z.iova(usize::MAX, IovaMode::Pa),
        Err(MemError::OutOfRange { .. })
    ));
}

#[test]
fn iova_pa_as_root() {
    if !is_root() {
        common::skip("iova_pa_as_root", "needs root to read physical addresses");
        return;
    }
    let z = Zone::create("iova-pa", 4 * 4096, &ZoneOptions::no_huge()).unwrap();
    let mut pages = Vec::new();
    for page in 0..4 {
        let base = z.iova(page * 4096, IovaMode::Pa).unwrap();
        assert_ne!(base, 0);
        assert_eq!(base % 4096, 0, "page {page} starts a physical page");
        for off in [1, 100, 4095] {
            assert_eq!(
                z.iova(page * 4096 + off, IovaMode::Pa).unwrap(),
                base + off as u64
            );
        }
        pages.push(base);
    }
    // An attached mapping of the same pages has the same physical addresses.
    let a = Zone::attach(z.as_fd().try_clone_to_owned().unwrap()).unwrap();
    for (page, &pa) in pages.iter().enumerate() {
        assert_eq!(a.iova(page * 4096 + 8, IovaMode::Pa).unwrap(), pa + 8);
    }
    pages.sort();
    pages.dedup();
    assert_eq!(pages.len(), 4, "four distinct physical pages");
}

/// Child, run without privileges: a physical look-up must be a clear error.
#[test]
fn child_iova_pa_unprivileged() {
    if !is_child("child_iova_pa_unprivileged") {
        return;
    }
    assert!(!is_root());
    let z = Zone::create("iova-nopriv", 4096, &ZoneOptions::no_huge()).unwrap();
    let e = z.iova(0, IovaMode::Pa).unwrap_err();
    assert!(matches!(e, MemError::PaLookupNeedsRoot), "{e}");
    assert!(e.to_string().contains("needs root"));
    assert_eq!(IovaMode::detect(), IovaMode::Va);
}

#[test]
fn iova_pa_without_root_is_a_clear_error() {
    if common::role().is_some() {
        return;
    }
    if !is_root() {
        let z = Zone::create("iova-nopriv", 4096, &ZoneOptions::no_huge()).unwrap();
        assert!(matches!(
            z.iova(0, IovaMode::Pa),
            Err(MemError::PaLookupNeedsRoot)
        ));
        return;
    }
    // As root: re-run the check in a child that dropped to `nobody`.
    let mut cmd = child_command("child_iova_pa_unprivileged");
    cmd.uid(65534).gid(65534);
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            common::skip(
                "iova_pa_without_root_is_a_clear_error",
                format_args!("cannot run as nobody: {e}"),
            );
            return;
        }
    };
    let st = common::Reaper(Some(child)).wait(TIMEOUT);
    if st.code() == Some(126) || st.code() == Some(127) {
        common::skip(
            "iova_pa_without_root_is_a_clear_error",
            "nobody cannot execute the test",
        );
        return;
    }
    assert!(st.success(), "unprivileged child failed: {st}");
}
