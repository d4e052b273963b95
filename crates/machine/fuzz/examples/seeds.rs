//! Writes a few valid inputs for each target, made with the real
//! encoders from a small running machine (two harts spinning, a disk, a
//! NIC and an entropy device), into `corpus/TARGET/` (where
//! `cargo fuzz run TARGET` starts from). Run from this directory:
//! `cargo run --release --example seeds`.

use ftvm_machine::{snapshot_file, DeviceSpec, Machine, MachineConfig, DEFAULT_GUEST_IPS};

fn put(target: &str, name: &str, bytes: &[u8]) {
    let dir = std::path::Path::new("corpus").join(target);
    std::fs::create_dir_all(&dir).expect("corpus directory");
    std::fs::write(dir.join(format!("seed-{name}")), bytes).expect("seed written");
}

fn main() {
    let cfg = MachineConfig {
        harts: 2,
        ram_size: 16 << 20,
        firmware: None,
        // j . : a kernel that spins.
        kernel: 0x0000_006fu32.to_le_bytes().to_vec(),
        initrd: None,
        cmdline: "console=ttyS0".into(),
        devices: vec![
            DeviceSpec::Disk { size: 1 << 20, readonly: false },
            DeviceSpec::Net { mac: [0x52, 0x54, 0, 0x12, 0x34, 0x56] },
            DeviceSpec::Rng,
        ],
        guest_ips: DEFAULT_GUEST_IPS,
        rtc_base_ns: 0,
        extensions: ftvm_machine::Extensions::ALL,
        seed: None,
    };
    let mut m = Machine::new(&cfg).expect("a machine");
    m.run_until(5_000);
    m.take_io_requests();
    let state = m.checkpoint_state().expect("a checkpoint state");
    let whole = m.snapshot().expect("a snapshot");
    put("machine_state", "checkpoint-state", &state);
    put("machine_state", "snapshot", &whole);
    let file = snapshot_file::encode(b"disk /srv/a.img\ntap tap0 52:54:00:12:34:56\nrng\n", &whole).expect("a file");
    put("snapshot_file", "file", &file);
    // Without its checksum: the target adds it back.
    put("snapshot_file", "file-unsealed", &file[..file.len() - 32]);
    eprintln!("state {} bytes, snapshot {} bytes, file {} bytes", state.len(), whole.len(), file.len());
}
