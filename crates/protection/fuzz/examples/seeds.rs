//! Writes a few valid inputs for each target, made with the real
//! encoders, into `corpus/TARGET/` (where `cargo fuzz run TARGET` starts
//! from). Run from this directory: `cargo run --release --example seeds`.

use ftvm_machine::layout::RAM_BASE;
use ftvm_machine::{DeviceSpec, Machine, MachineConfig, DEFAULT_GUEST_IPS};
use ftvm_protection::epoch::{EpochMode, EpochProtocol};
use ftvm_protection::pair::{DiskPolicy, DiskSharing, ModeSetting, PairDisk, PairHeader, PAIR_HEADER_VERSION};
use ftvm_replay::Header;
use ftvm_replication::checkpoint_stream::{encode, Record};
use ftvm_replication::page_delta::{PageEncoder, PAGE_SIZE};

fn put(target: &str, name: &str, bytes: &[u8]) {
    let dir = std::path::Path::new("corpus").join(target);
    std::fs::create_dir_all(&dir).expect("corpus directory");
    std::fs::write(dir.join(format!("seed-{name}")), bytes).expect("seed written");
}

/// A record as the checkpoint_backup target takes it: kind | u16 length | payload.
fn compact(out: &mut Vec<u8>, r: &Record) {
    let mut full = Vec::new();
    encode(&mut full, r);
    let payload = &full[9..];
    out.push(full[0]);
    out.extend_from_slice(&(payload.len() as u16).to_le_bytes());
    out.extend_from_slice(payload);
}

fn main() {
    for (name, mode) in [
        ("lockstep", ModeSetting::Lockstep),
        ("epoch", ModeSetting::Epoch(EpochMode::new(4096, EpochProtocol::Original).expect("an epoch mode"))),
        ("checkpoint", ModeSetting::Checkpoint { interval_ms: 20 }),
    ] {
        let pair = PairHeader {
            version: PAIR_HEADER_VERSION,
            generation: 7,
            mode,
            disk_policy: DiskPolicy { sharing: DiskSharing::Separate, backup_reads: true },
            disks: vec![PairDisk { slot: 0, path: "/srv/a.img".into(), digest: Some("1048576:ab01".into()) }],
            storage_token: "00ff".into(),
            host: "seed-host".into(),
        };
        let mut h = Header::default();
        h.set("machine", "ram=16777216 harts=1");
        pair.write(&mut h);
        put("pair_header", &format!("{name}-field"), h.get("ft-pair").expect("written").as_bytes());
        let text: String = h.fields.iter().map(|(k, v)| format!("{k} {v}\n")).collect();
        put("pair_header", &format!("{name}-header"), text.as_bytes());
    }

    // A small machine's state, for the checkpoints (a kernel that spins).
    let cfg = MachineConfig {
        harts: 1,
        ram_size: 16 << 20,
        firmware: None,
        kernel: 0x0000_006fu32.to_le_bytes().to_vec(),
        initrd: None,
        cmdline: String::new(),
        devices: vec![DeviceSpec::Disk { size: 1 << 20, readonly: false }],
        guest_ips: DEFAULT_GUEST_IPS,
        rtc_base_ns: 0,
        extensions: ftvm_machine::Extensions::ALL,
        seed: None,
    };
    let mut m = Machine::new(&cfg).expect("a machine");
    m.run_until(1000);
    m.take_io_requests();
    let state = zstd::bulk::compress(&m.checkpoint_state().expect("a state"), 1).expect("compressed");

    let base = RAM_BASE / PAGE_SIZE as u64;
    let mut enc = PageEncoder::new(64);
    let pfns = [base, base + 1, base + 2];
    let mut pages = vec![0u8; 3 * PAGE_SIZE];
    pages[..4].copy_from_slice(&0x0000_006fu32.to_le_bytes());
    pages[PAGE_SIZE + 17] = 9;
    let first = enc.encode(&pfns, &pages);
    pages[PAGE_SIZE + 18] = 10;
    let second = enc.encode(&pfns[1..2], &pages[PAGE_SIZE..2 * PAGE_SIZE]);

    let mut stream = Vec::new();
    for r in [
        Record::DiskSync { slot: 0, offset: 0, data: vec![0xcd; 512] },
        Record::Pages { number: 0, pages: first },
        Record::DiskWrite { slot: 0, offset: 4096, data: vec![0xab; 512] },
        Record::Checkpoint { number: 0, icount: 1000, state: state.clone(), pages: Vec::new() },
        Record::KeepAlive,
        Record::Checkpoint { number: 1, icount: 1000, state, pages: second },
        Record::End { status: Some(0) },
    ] {
        compact(&mut stream, &r);
    }
    put("checkpoint_backup", "stream", &stream);
}
