//! The ivshmem layout, run without a VM: a plain memfd stands in for BAR2,
//! each "VM" maps it separately (as two guests map one memory backend), and
//! the fabric code runs over it with heartbeat-only liveness.

use std::time::{Duration, Instant};

use super::ivshmem::{IvshmemConfig, fabric_in, join_in};
use crate::hw::emu::{Liveness, SharedRegion, SlotState, WindowBacking};
use crate::hw::{LinkEvent, NtbDevice};

const BAR2_LEN: usize = 1 << 20;
/// Short for a quick test, long enough that a live VM's heartbeat thread
/// a loaded machine stalls for a moment is not taken for dead.
const TIMEOUT: Duration = Duration::from_millis(500);

/// A memfd of `BAR2_LEN` zero bytes: a fresh ivshmem memory backend.
fn bar2() -> std::fs::File {
    let fd = nix::sys::memfd::memfd_create(
        c"ntbdk-ivshmem-bar2",
        nix::sys::memfd::MFdFlags::MFD_CLOEXEC,
    )
    .unwrap();
    let f = std::fs::File::from(fd);
    f.set_len(BAR2_LEN as u64).unwrap();
    f
}

/// One VM's mapping of BAR2.
fn map(f: &std::fs::File) -> SharedRegion {
    SharedRegion::map_fd(f, BAR2_LEN, "test BAR2").unwrap()
}

fn cfg(heartbeat_thread: bool) -> IvshmemConfig {
    IvshmemConfig {
        slots: 4,
        heartbeat_timeout: TIMEOUT,
        heartbeat_thread,
        ..IvshmemConfig::default()
    }
}

fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn two_vms_form_a_fabric_over_one_bar2() {
    let mem = bar2();
    let a = join_in(map(&mem), "vm-a BAR2", &cfg(true)).unwrap();
    let b = join_in(map(&mem), "vm-b BAR2", &cfg(true)).unwrap();
    assert_ne!(a.port(), b.port());
    assert_eq!(a.port_count(), 4);
    assert_eq!(a.fabric().liveness(), Liveness::HeartbeatOnly);
    assert_eq!(a.fabric().window_backing(), WindowBacking::OneSharedRegion);
    assert!(!a.fabric().status().window_backing.isolates_peers());
    let (pa, pb) = (a.port(), b.port());
    assert!(a.link(pb).unwrap().up && b.link(pa).unwrap().up);
    assert_eq!(a.link(pb).unwrap().generation, b.generation());

    // Data through the window, every byte checked on the other mapping.
    let payload: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    let w = a.peer_window(pb, 0).unwrap();
    w.write(4096, &payload).unwrap();
    w.write_u64(0, 0xC0FFEE).unwrap();
    let mine = b.local_window(0).unwrap();
    assert_eq!(mine.load_u64(0).unwrap(), 0xC0FFEE);
    let mut got = vec![0u8; payload.len()];
    mine.read(4096, &mut got).unwrap();
    assert_eq!(got, payload);
    // The windows do not overlap: a's own window did not see it.
    assert_eq!(a.local_window(0).unwrap().load_u64(0).unwrap(), 0);

    // Doorbells and scratchpads are words in BAR2.
    a.peer_db_set(pb, 0b1010).unwrap();
    assert_eq!(b.db_read(), 0b1010);
    b.db_clear(0b1000);
    assert_eq!(b.db_read(), 0b0010);
    a.peer_spad_write(pb, 5, 0xfeed).unwrap();
    assert_eq!(b.spad_read(5).unwrap(), 0xfeed);
    assert_eq!(a.counters().non_posted_reads, 0);

    // Alive peers stay up across several timeouts (heartbeats advance).
    std::thread::sleep(TIMEOUT * 3);
    assert!(a.link(pb).unwrap().up && b.link(pa).unwrap().up);

    // A clean leave: the slot is freed at once.
    drop(b);
    assert!(!a.link(pb).unwrap().up);
    assert_eq!(
        a.fabric().status().slots[pb as usize].state,
        SlotState::Free
    );
}

#[test]
fn a_stopped_vm_is_found_dead_by_heartbeat_and_its_slot_reclaimed() {
    let mem = bar2();
    let a = join_in(map(&mem), "vm-a BAR2", &cfg(true)).unwrap();
    // "VM b" stops dead: no heartbeat thread, never serviced, never dropped.
    // Its pid is ours and alive: only the heartbeat can tell.
    let b = join_in(map(&mem), "vm-b BAR2", &cfg(false)).unwrap();
    let pb = b.port();
    let mut ev = Vec::new();
    a.poll_link_events(&mut ev);
    assert!(ev.contains(&LinkEvent::Up {
        peer: pb,
        generation: b.generation()
    }));
    let generation = b.generation();
    std::mem::forget(b);
    let t = Instant::now();
    wait_for("link down", TIMEOUT * 10, || !a.link(pb).unwrap().up);
    assert!(t.elapsed() >= TIMEOUT / 2, "declared dead too early");
    ev.clear();
    wait_for("the down event", TIMEOUT * 10, || {
        a.poll_link_events(&mut ev);
        ev.contains(&LinkEvent::Down {
            peer: pb,
            generation,
        })
    });
    // a's background scan reclaims the slot; a new VM can take it.
    wait_for("reclaim", TIMEOUT * 10, || {
        a.fabric().status().slots[pb as usize].state == SlotState::Free
    });
    let c = join_in(
        map(&mem),
        "vm-c BAR2",
        &IvshmemConfig {
            slot: Some(pb),
            ..cfg(true)
        },
    )
    .unwrap();
    assert_eq!(c.port(), pb);
    assert!(c.generation() != generation);
    wait_for("the new link", TIMEOUT * 10, || a.link(pb).unwrap().up);
}

#[test]
fn later_vms_take_the_first_vms_geometry() {
    let mem = bar2();
    let first = fabric_in(map(&mem), "vm-a BAR2", &cfg(true)).unwrap();
    let other = IvshmemConfig {
        slots: 8,
        ..cfg(true)
    };
    let second = fabric_in(map(&mem), "vm-b BAR2", &other).unwrap();
    assert_eq!(second.config(), first.config());
    assert_eq!(second.config().slots, 4);
}

#[test]
fn a_too_small_bar2_is_refused_with_the_fix() {
    let fd = nix::sys::memfd::memfd_create(c"ntbdk-small", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
        .unwrap();
    let f = std::fs::File::from(fd);
    f.set_len(16 << 10).unwrap();
    let r = SharedRegion::map_fd(&f, 16 << 10, "small BAR2").unwrap();
    let e = fabric_in(r, "small BAR2", &cfg(true)).unwrap_err();
    assert!(e.to_string().contains("fewer slots"), "{e}");
}

/// Every slot held by a VM that died (the memory backend outlived them): a
/// VM that comes up afterwards has no live member to reclaim them for it.
/// It watches the slots for a timeout, sees their heartbeats stopped, and
/// takes one; a status tool's reclaim from a fresh handle frees them all.
#[test]
fn a_new_vm_reclaims_slots_whose_vms_all_died() {
    // Four VMs join and die without leaving.
    let all_dead = || {
        let mem = bar2();
        for i in 0..4 {
            let vm = join_in(map(&mem), &format!("vm-{i} BAR2"), &cfg(false)).unwrap();
            std::mem::forget(vm);
        }
        mem
    };
    let mem = all_dead();
    let t = Instant::now();
    let late = join_in(map(&mem), "vm-late BAR2", &cfg(true)).unwrap();
    assert!(
        t.elapsed() >= TIMEOUT,
        "claimed before a timeout of watching"
    );
    assert!(late.port() < 4);

    let mem = all_dead();
    let tool = fabric_in(map(&mem), "status BAR2", &cfg(false)).unwrap();
    let mut freed = tool.reclaim_dead();
    freed.sort_unstable();
    assert_eq!(freed, [0, 1, 2, 3]);
    // A handle that has watched long enough does not wait again.
    let t = Instant::now();
    assert!(tool.reclaim_dead().is_empty());
    assert!(t.elapsed() < TIMEOUT);
}
