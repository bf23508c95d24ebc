//! Real processes on one emulated fabric: scratchpads, doorbells, window
//! writes verified byte by byte, link up/down and hot plug after SIGKILL.
//!
//! Children are this test binary re-executed with a role (see
//! `emu_support`); they die with the parent and every wait is bounded.

mod emu_support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use emu_support::{RoleChild, TestDir, child_role, death_bound, env, pattern, wait_for};
use ntbdk_pmd::hw::emu::{DeviceConfig, EmuDevice, EmuFabric, FabricConfig, SlotState};
use ntbdk_pmd::hw::{LinkEvent, NtbDevice, Port};

const ENTRY: &str = "child_entry";
const WAIT: Duration = Duration::from_secs(20);
const WINDOW: usize = 256 << 10;

fn fabric_cfg(slots: usize, timeout: Duration) -> FabricConfig {
    FabricConfig {
        slots,
        window_size: WINDOW,
        heartbeat_timeout: timeout,
        ..Default::default()
    }
}

fn dev_cfg(dir: &std::path::Path, fabric: FabricConfig, slot: Option<Port>) -> DeviceConfig {
    DeviceConfig {
        slot,
        fabric,
        dir: Some(dir.to_owned()),
        ..Default::default()
    }
}

/// Child configuration from the environment.
fn child_dev() -> EmuDevice {
    let dir: PathBuf = env::<String>("EMU_DIR").into();
    let name: String = env("EMU_NAME");
    let fabric = EmuFabric::attach_in(&dir, &name).expect("child attaches");
    let slot = std::env::var("EMU_SLOT").ok().map(|s| s.parse().unwrap());
    let cfg = DeviceConfig {
        slot,
        ..Default::default()
    };
    fabric.join(&cfg).expect("child joins")
}

fn wait_db(dev: &EmuDevice, bits: u64) {
    wait_for(WAIT, &format!("doorbell bits {bits:#x}"), || {
        (dev.db_read() & bits == bits).then_some(())
    });
    dev.db_clear(bits);
}

/// The dispatcher for child roles; a no-op in a normal test run.
#[test]
fn child_entry() {
    let Some(role) = child_role() else { return };
    match role.as_str() {
        "echo" => role_echo(),
        "mesh" => role_mesh(),
        "ring" => {
            let dir: PathBuf = env::<String>("EMU_DIR").into();
            let name: String = env("EMU_NAME");
            let fabric = EmuFabric::attach_in(&dir, &name).unwrap();
            let devs: Vec<EmuDevice> = (0..env::<usize>("EMU_DEVICES"))
                .map(|_| fabric.join(&DeviceConfig::default()).unwrap())
                .collect();
            println!("JOINED {} 0", devs.len());
            ring_round(&devs);
            println!("VERIFIED");
            wait_for(WAIT, "the parent's go", || {
                (fabric.registers(0).unwrap().spad(15).unwrap() == 0xD0E).then_some(())
            });
            println!("DONE");
        }
        "idle" => {
            let dev = child_dev();
            println!("JOINED {} {}", dev.port(), dev.generation());
            std::thread::sleep(WAIT);
        }
        other => panic!("unknown role {other}"),
    }
}

/// Waits for the parent's data, checks it, answers with its own.
fn role_echo() {
    let dev = child_dev();
    let parent: Port = env("EMU_PARENT");
    println!("JOINED {} {}", dev.port(), dev.generation());
    wait_db(&dev, 1);
    let x = dev.spad_read(0).unwrap();
    let mine = dev.local_window(0).unwrap();
    let mut buf = vec![0u8; WINDOW];
    mine.read(0, &mut buf).unwrap();
    for (i, b) in buf.iter().enumerate() {
        assert_eq!(
            *b,
            pattern(parent, dev.port(), i),
            "byte {i} from the parent"
        );
    }
    let out: Vec<u8> = (0..WINDOW)
        .map(|i| pattern(dev.port(), parent, i))
        .collect();
    let w = dev.peer_window(parent, 0).unwrap();
    w.write(0, &out).unwrap();
    dev.peer_spad_write(parent, 1, x.wrapping_add(1)).unwrap();
    dev.peer_db_set(parent, 2).unwrap();
    wait_db(&dev, 4);
    let c = dev.counters();
    assert_eq!(c.non_posted_reads, 0);
    assert_eq!(c.posted_bytes, WINDOW as u64 + 4 + 8);
    println!("DONE");
}

/// Every member writes a chunk into every other member's window, rings its
/// bit, waits for all bits, then verifies every chunk it received.
fn role_mesh() {
    let dev = child_dev();
    let n: usize = env("EMU_MEMBERS");
    let chunk = WINDOW / 16;
    let me = dev.port();
    println!("JOINED {me} {}", dev.generation());
    let peers: Vec<Port> = wait_for(WAIT, "all members up", || {
        let up: Vec<Port> = dev
            .peer_ports()
            .into_iter()
            .filter(|&p| dev.link(p).unwrap().up)
            .collect();
        (up.len() == n - 1).then_some(up)
    });
    for &p in &peers {
        let data: Vec<u8> = (0..chunk).map(|i| pattern(me, p, i)).collect();
        dev.peer_window(p, 0)
            .unwrap()
            .write(me as usize * chunk, &data)
            .unwrap();
        dev.peer_spad_write(p, me as usize, 0x1000 + me as u32)
            .unwrap();
        dev.peer_db_set(p, 1 << me).unwrap();
    }
    let want: u64 = peers.iter().map(|&p| 1u64 << p).sum();
    wait_db(&dev, want);
    let local = dev.local_window(0).unwrap();
    let mut buf = vec![0u8; chunk];
    for &p in &peers {
        local.read(p as usize * chunk, &mut buf).unwrap();
        for (i, b) in buf.iter().enumerate() {
            assert_eq!(*b, pattern(p, me, i), "byte {i} from {p}");
        }
        assert_eq!(dev.spad_read(p as usize).unwrap(), 0x1000 + p as u32);
    }
    assert_eq!(dev.counters().non_posted_reads, 0);
    println!("VERIFIED");
    // Stay until the parent says everyone verified (so no window vanishes
    // while a slower member still writes).
    wait_for(WAIT, "the parent's go", || {
        (dev.spad_read(15).unwrap() == 0xD0E).then_some(())
    });
    println!("DONE");
}

/// Each device writes a flag, a message and a scratchpad into the next
/// port's window (port + 1, wrapping), then checks what the previous one sent.
fn ring_round(devs: &[EmuDevice]) {
    for d in devs {
        let me = d.port();
        let next = ((me as usize + 1) % d.port_count()) as Port;
        wait_for(WAIT, "the next port up", || {
            d.link(next).unwrap().up.then_some(())
        });
        let w = d.peer_window(next, 0).unwrap();
        w.write(64, &[me as u8; 512]).unwrap();
        d.peer_spad_write(next, 1, me as u32).unwrap();
        w.write_u64(0, me as u64 + 1).unwrap();
    }
    for d in devs {
        let me = d.port();
        let prev = ((me as usize + d.port_count() - 1) % d.port_count()) as Port;
        let local = d.local_window(0).unwrap();
        wait_for(WAIT, "the previous port's flag", || {
            (local.load_u64(0).unwrap() == prev as u64 + 1).then_some(())
        });
        let mut got = [0u8; 512];
        local.read(64, &mut got).unwrap();
        assert!(got.iter().all(|&b| b == prev as u8), "message from {prev}");
        assert_eq!(d.spad_read(1).unwrap(), prev as u32);
    }
}

fn child_env(dir: &TestDir, name: &str) -> Vec<(&'static str, String)> {
    vec![
        ("EMU_DIR", dir.path().display().to_string()),
        ("EMU_NAME", name.to_owned()),
    ]
}

fn parse_joined(s: &str) -> (Port, u64) {
    let mut it = s.split_whitespace();
    (
        it.next().unwrap().parse().unwrap(),
        it.next().unwrap().parse().unwrap(),
    )
}

#[test]
fn two_processes_exchange_spads_doorbells_and_windows() {
    let dir = TestDir::new("mp-two");
    // Nobody dies here: a timeout no stall of a loaded machine reaches.
    let cfg = dev_cfg(dir.path(), fabric_cfg(4, Duration::from_secs(2)), None);
    let me = EmuDevice::open("two", &cfg).unwrap();
    let mut env = child_env(&dir, "two");
    env.push(("EMU_PARENT", me.port().to_string()));
    let mut child = RoleChild::spawn(ENTRY, "echo", &env);
    let (peer, generation) = parse_joined(&child.expect_line("JOINED", WAIT));
    assert_ne!(peer, me.port());

    let mut events = Vec::new();
    wait_for(WAIT, "the child's link-up event", || {
        me.poll_link_events(&mut events);
        events
            .contains(&LinkEvent::Up { peer, generation })
            .then_some(())
    });
    let data: Vec<u8> = (0..WINDOW).map(|i| pattern(me.port(), peer, i)).collect();
    me.peer_window(peer, 0).unwrap().write(0, &data).unwrap();
    me.peer_spad_write(peer, 0, 41).unwrap();
    me.peer_db_set(peer, 1).unwrap();

    wait_db(&me, 2);
    assert_eq!(me.spad_read(1).unwrap(), 42);
    let mut buf = vec![0u8; WINDOW];
    me.local_window(0).unwrap().read(0, &mut buf).unwrap();
    for (i, b) in buf.iter().enumerate() {
        assert_eq!(*b, pattern(peer, me.port(), i), "byte {i} from the child");
    }
    me.peer_db_set(peer, 4).unwrap();
    child.expect_line("DONE", WAIT);
    assert!(child.wait_success(WAIT), "the child failed");

    // It left cleanly: link down, slot free.
    events.clear();
    wait_for(WAIT, "the child's link-down event", || {
        me.poll_link_events(&mut events);
        events
            .contains(&LinkEvent::Down { peer, generation })
            .then_some(())
    });
    assert_eq!(
        me.fabric().status().slots[peer as usize].state,
        SlotState::Free
    );
    let c = me.counters();
    assert_eq!(c.non_posted_reads, 0);
    assert_eq!(c.posted_writes, 4); // window copy, spad, two doorbells
    drop(me);
    EmuFabric::destroy_in(dir.path(), "two").unwrap();
}

#[test]
fn four_processes_write_into_each_others_windows() {
    let dir = TestDir::new("mp-mesh");
    let fabric =
        EmuFabric::create_in(dir.path(), "mesh", &fabric_cfg(8, Duration::from_secs(1))).unwrap();
    let n = 4;
    let mut env = child_env(&dir, "mesh");
    env.push(("EMU_MEMBERS", n.to_string()));
    let mut kids: Vec<RoleChild> = (0..n)
        .map(|_| RoleChild::spawn(ENTRY, "mesh", &env))
        .collect();
    let mut ports: Vec<Port> = kids
        .iter_mut()
        .map(|k| parse_joined(&k.expect_line("JOINED", WAIT)).0)
        .collect();
    for k in &mut kids {
        k.expect_line("VERIFIED", WAIT);
    }
    for &p in &ports {
        fabric.registers(p).unwrap().set_spad(15, 0xD0E).unwrap();
    }
    for k in &mut kids {
        k.expect_line("DONE", WAIT);
        assert!(k.wait_success(WAIT));
    }
    ports.sort();
    ports.dedup();
    assert_eq!(ports.len(), n, "every member got its own slot");
    let st = fabric.status();
    for p in ports {
        let s = &st.slots[p as usize];
        assert_eq!(s.state, SlotState::Free, "slot {p} released");
        // Mirrored counters: one chunk, one spad write, one ring per peer.
        assert_eq!(s.counters.posted_writes, 3 * (n as u64 - 1), "slot {p}");
        assert_eq!(s.counters.non_posted_reads, 0);
    }
    EmuFabric::destroy_in(dir.path(), "mesh").unwrap();
}

#[test]
fn sigkilled_peer_goes_down_within_the_timeout_and_can_rejoin() {
    let dir = TestDir::new("mp-kill");
    // Short for a quick test, long enough that a stall of the idle child
    // on a loaded machine is not taken for its death.
    let timeout = Duration::from_secs(1);
    let cfg = dev_cfg(dir.path(), fabric_cfg(4, timeout), None);
    let me = EmuDevice::open("hotplug", &cfg).unwrap();
    let env = child_env(&dir, "hotplug");
    let mut child = RoleChild::spawn(ENTRY, "idle", &env);
    let (peer, generation) = parse_joined(&child.expect_line("JOINED", WAIT));
    wait_for(WAIT, "link up", || me.link(peer).unwrap().up.then_some(()));
    let mut events = Vec::new();
    me.poll_link_events(&mut events);

    // SIGKILL, not reaped: the pid stays (a zombie) and the heartbeat stops.
    child.sigkill();
    let killed = Instant::now();
    wait_for(WAIT, "link down after SIGKILL", || {
        (!me.link(peer).unwrap().up).then_some(())
    });
    let seen_down = killed.elapsed();
    eprintln!("link-down seen {seen_down:?} after SIGKILL (timeout {timeout:?})");
    assert!(
        seen_down <= death_bound(timeout),
        "link-down seen after {seen_down:?}, beyond {:?} for a {timeout:?} heartbeat timeout",
        death_bound(timeout)
    );
    // Our heartbeat thread's scan reclaims the slot.
    wait_for(Duration::from_secs(5), "the dead slot reclaimed", || {
        (me.fabric().status().slots[peer as usize].state == SlotState::Free).then_some(())
    });
    events.clear();
    me.poll_link_events(&mut events);
    assert_eq!(events, vec![LinkEvent::Down { peer, generation }]);
    drop(child);

    // Hot plug: a new process takes the same slot with a new generation.
    let mut env = env;
    env.push(("EMU_SLOT", peer.to_string()));
    let mut again = RoleChild::spawn(ENTRY, "idle", &env);
    let (p2, g2) = parse_joined(&again.expect_line("JOINED", WAIT));
    assert_eq!(p2, peer);
    assert!(g2 > generation, "generation {g2} after {generation}");
    events.clear();
    wait_for(WAIT, "the rejoin event", || {
        me.poll_link_events(&mut events);
        events
            .contains(&LinkEvent::Up {
                peer,
                generation: g2,
            })
            .then_some(())
    });
    assert_eq!(me.link(peer).unwrap().generation, g2);
    // And the window of the new generation is mapped afresh and writable.
    me.peer_window(peer, 0).unwrap().write(0, b"again").unwrap();
    drop(again);
    drop(me);
    EmuFabric::destroy_in(dir.path(), "hotplug").unwrap();
}

#[test]
fn a_dead_pid_is_reclaimed_before_its_heartbeat_goes_stale() {
    let dir = TestDir::new("mp-pid");
    // A long timeout: only the pid check can find the death quickly.
    let fabric =
        EmuFabric::create_in(dir.path(), "pid", &fabric_cfg(4, Duration::from_secs(30))).unwrap();
    let env = child_env(&dir, "pid");
    let mut child = RoleChild::spawn(ENTRY, "idle", &env);
    let (peer, _) = parse_joined(&child.expect_line("JOINED", WAIT));
    assert!(fabric.status().slots[peer as usize].owner_alive);
    child.sigkill();
    let _ = child.child.wait(); // reaped: the pid is gone
    assert_eq!(fabric.reclaim_dead(), vec![peer]);
    let s = &fabric.status().slots[peer as usize];
    assert_eq!(s.state, SlotState::Free);
    assert!(!s.link_up);
    EmuFabric::destroy_in(dir.path(), "pid").unwrap();
}

#[test]
fn a_128_slot_fabric_shared_by_five_processes() {
    let dir = TestDir::new("mp-wide");
    let cfg = FabricConfig {
        slots: 128,
        window_size: 64 << 10,
        heartbeat_timeout: Duration::from_secs(5),
        ..Default::default()
    };
    let fabric = EmuFabric::create_in(dir.path(), "wide", &cfg).unwrap();
    // The parent takes 32 slots, four children 24 each.
    let parent: Vec<EmuDevice> = (0..32)
        .map(|_| fabric.join(&DeviceConfig::default()).unwrap())
        .collect();
    let mut env = child_env(&dir, "wide");
    env.push(("EMU_DEVICES", "24".into()));
    let mut kids: Vec<RoleChild> = (0..4)
        .map(|_| RoleChild::spawn(ENTRY, "ring", &env))
        .collect();
    for k in &mut kids {
        k.expect_line("JOINED", WAIT);
    }
    let st = fabric.status();
    assert!(st.slots.iter().all(|s| s.state == SlotState::Up));
    let owners: std::collections::HashSet<u32> =
        st.slots.iter().filter_map(|s| s.owner_pid).collect();
    assert_eq!(owners.len(), 5, "five processes own the 128 slots");
    ring_round(&parent);
    for k in &mut kids {
        k.expect_line("VERIFIED", WAIT);
    }
    fabric.registers(0).unwrap().set_spad(15, 0xD0E).unwrap();
    for k in &mut kids {
        k.expect_line("DONE", WAIT);
        assert!(k.wait_success(WAIT));
    }
    drop(parent);
    assert!(
        fabric
            .status()
            .slots
            .iter()
            .all(|s| s.state == SlotState::Free)
    );
    EmuFabric::destroy_in(dir.path(), "wide").unwrap();
}
