//! `ntb-perf`'s engine on an Intel NTB: the client and its server, each
//! with its control channel (six user scratchpads) and transport, over the
//! two sides of the Intel register model, for every part. What runs on the
//! hardware through `ntb-perf --device vfio:BDF` is this engine on
//! `IntelNtb<MappedBar>`; here it is `IntelNtb<ModelBar>`, the same code
//! over the model's registers.

use std::sync::Arc;
use std::time::Duration;

use ntbdk_apps::cli::session::wait_peers;
use ntbdk_apps::perf::control::{ServerControl, max_servers};
use ntbdk_apps::perf::{Budget, Client, Endpoint, Op, WriteMode, serve};
use ntbdk_pmd::hw::NtbDevice;
use ntbdk_pmd::hw::intel::model::{IntelNtbModel, ModelMemory};
use ntbdk_pmd::hw::intel::{B2bSide, IntelConfig, IntelPart};

const BAR: [usize; 2] = [8 << 20, 1 << 20];
const DRAM: usize = 16 << 20;
const TIMEOUT: Duration = Duration::from_secs(20);

/// Waits until `dev` sees its peer's link up, as the apps do (each look
/// services the device, which runs the scratchpad handshake).
fn wait_link(dev: &dyn NtbDevice, peer: u16) {
    wait_peers(
        dev,
        "the Intel model",
        &[peer],
        1,
        Some(TIMEOUT),
        "no peer",
        || Ok(()),
    )
    .unwrap();
}

#[test]
fn ntb_perf_measures_every_operation_over_the_intel_model() {
    for part in [IntelPart::Gen3Skx, IntelPart::Gen4Icx, IntelPart::Gen4Spr] {
        let mem = ModelMemory::create(part, BAR, DRAM).unwrap();
        // The upstream side is port 0, the client here.
        let device = |side| -> Arc<dyn NtbDevice> {
            let model = IntelNtbModel::attach(&mem, side);
            Arc::new(model.device(IntelConfig::default(), true).unwrap())
        };
        let (client_dev, server_dev) = (device(B2bSide::Usd), device(B2bSide::Dsd));
        assert_eq!((client_dev.port(), server_dev.port()), (0, 1));
        assert!(
            max_servers(&*client_dev) >= 1,
            "{part:?}: too few scratchpads"
        );
        let server = std::thread::spawn(move || {
            wait_link(&*server_dev, 0);
            let mut ctl = ServerControl::new(server_dev.clone()).unwrap();
            let mut ep = Endpoint::new(server_dev, TIMEOUT).unwrap();
            serve(&mut ep, &mut ctl, 0, TIMEOUT).unwrap()
        });
        wait_link(&*client_dev, 1);
        let ep = Endpoint::new(client_dev.clone(), TIMEOUT).unwrap();
        let mut client = Client::connect(ep, &[1], TIMEOUT).unwrap();
        for (op, mode) in [
            (Op::Send, WriteMode::Direct),
            (Op::Write, WriteMode::Direct),
            (Op::Write, WriteMode::Rendezvous),
            (Op::Read, WriteMode::Direct),
        ] {
            client.set_write_mode(mode);
            client.set_cq_mod(if op.moderable(mode) { 100 } else { 1 });
            let largest = client.max_size(op).min(1 << 20);
            for size in [64, 4096.min(largest), largest] {
                let row = client
                    .bandwidth(op, size, 8, 64, Budget::iterations(500))
                    .unwrap_or_else(|e| panic!("{part:?} {op:?} {mode:?} {size} B: {e:#}"));
                assert_eq!(row.iterations, 500, "{part:?} {op:?} {mode:?} {size} B");
            }
            let lat = client
                .latency(op, 64, 10, Budget::iterations(200))
                .unwrap_or_else(|e| panic!("{part:?} {op:?} {mode:?} latency: {e:#}"));
            assert_eq!(lat.iterations, 200, "{part:?} {op:?} {mode:?}");
        }
        client.stop().unwrap();
        let stats = server.join().unwrap();
        assert!(stats.recvs > 0, "{part:?}: the server received no send");
        for (port, c) in client.counters() {
            assert_eq!(c.failed_ops, 0, "{part:?}: failures towards port {port}");
        }
        // Everything crossed as posted writes, as on the emulated fabric.
        assert_eq!(client_dev.counters().non_posted_reads, 0, "{part:?}");
    }
}
