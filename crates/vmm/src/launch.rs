//! Starting a VM from its configuration (`ftvm_api::VmConfig`, typed: the
//! command line turned its options into it, or a file held it): the
//! machine's configuration and the backends of its devices (the default
//! guest image filling in what was not given), or a snapshot to restore,
//! and where its log goes (nowhere, a file, or a backup). What `ftvm run`,
//! `ftvm record` and `ftvm ft primary` share. An image's root disk is
//! booted on a copy of its own (`overlay`) unless `persist`.

use crate::error::{file, usage, RebootRefused, SnapshotProblem, VmmError};
use crate::ft::protect::{MachineProtector, Protector};
use crate::ft::{PairSetup, ProtectSetup};
use crate::host_io::{self, Backend, HostEvent, HostIo};
use crate::overlay::Overlay;
use crate::{console, control, exec, ft, live, record};
use ftvm_api::vm_config::{
    check_tap_name, DiskConfig, Firmware, HartThreads, NetConfig, VmConfig, HARTS, MAX_DISK_LATENCY, MEMORY_BYTES,
};
use ftvm_machine::{snapshot_file, Machine, MachineConfig, DEFAULT_GUEST_IPS};
use ftvm_protection::control::CPU_LIMIT_PERCENT;
use ftvm_protection::events::Events;
use ftvm_protection::pair::{DiskSharing, Mode};
use ftvm_protection::primary::Primary;
use ftvm_replay::recorder::{self, Start};
use ftvm_replication::fence::Fence;
use std::path::PathBuf;
use std::time::Duration;

/// The backend of a configured disk.
fn disk_backend(disk: &DiskConfig) -> Result<Backend, VmmError> {
    if disk.path.as_os_str().is_empty() {
        return Err(usage("a disk needs a path"));
    }
    let latency = Duration::from_micros(disk.latency_us);
    if latency > MAX_DISK_LATENCY {
        return Err(usage(format!(
            "disk {}: a latency of {} us is over the limit of {} s",
            disk.path.display(),
            disk.latency_us,
            MAX_DISK_LATENCY.as_secs()
        )));
    }
    Ok(Backend::Disk { path: disk.path.clone(), readonly: disk.readonly, latency })
}

/// The backend of a configured NIC; `index` picks the default MAC.
fn net_backend(net: &NetConfig, index: usize) -> Result<Backend, VmmError> {
    if net.tap.is_empty() {
        return Err(usage("a NIC needs a TAP's name"));
    }
    check_tap_name(&net.tap).map_err(usage)?;
    // QEMU's default MAC, so guests and tools see familiar addresses.
    let mac = net.mac.map_or([0x52, 0x54, 0x00, 0x12, 0x34, 0x56u8.wrapping_add(index as u8)], |m| m.0);
    Ok(Backend::Tap { name: net.tap.clone(), mac, bridge: net.bridge.clone() })
}

fn read_file(doing: &'static str, path: &std::path::Path) -> Result<Vec<u8>, VmmError> {
    std::fs::read(path).map_err(file(doing, path))
}

/// The backends of the virtio slots, in slot order: disks, NICs, rng.
fn backends(args: &VmConfig, default_disk: Option<PathBuf>) -> Result<Vec<Backend>, VmmError> {
    let mut out = args.disks.iter().map(disk_backend).collect::<Result<Vec<_>, _>>()?;
    if out.is_empty() {
        if let Some(path) = default_disk {
            out.push(Backend::Disk { path, readonly: false, latency: Duration::ZERO });
        }
    }
    for (i, n) in args.nets.iter().enumerate() {
        out.push(net_backend(n, i)?);
    }
    if !args.no_rng {
        out.push(Backend::Rng);
    }
    if out.len() > ftvm_machine::layout::VIRTIO_SLOTS {
        return Err(usage(format!(
            "{} virtio devices (disks, NICs, rng) asked for; the board has {} slots",
            out.len(),
            ftvm_machine::layout::VIRTIO_SLOTS
        )));
    }
    Ok(out)
}

/// The image `--image` names, or the default one.
fn image(args: &VmConfig) -> Result<ftvm_image::GuestImage, VmmError> {
    Ok(match &args.image {
        Some(name) => ftvm_image::locate_named(name)?,
        None => ftvm_image::locate()?,
    })
}

/// Turn run options into a machine configuration (without its devices)
/// and the backends of its devices, filling in the image (`--image`, or
/// the default one) for whatever was not given. Its root disk is a copy of
/// the image's for this run (returned: removed when it drops) unless
/// `--persist`.
fn machine_config(args: &VmConfig) -> Result<(MachineConfig, Vec<Backend>, Sources, Option<Overlay>), VmmError> {
    // Options first: a typo should not be reported as a missing image, nor
    // wait for a kernel to be read.
    // (The command line checked its own options' values first, to quote
    // them as written; a configuration file's are checked here.)
    if !HARTS.contains(&args.harts) {
        let (lo, hi) = (HARTS.start(), HARTS.end());
        return Err(usage(format!("harts {} is out of range ({lo} to {hi})", args.harts)));
    }
    let ram_size = args.memory_bytes;
    if !MEMORY_BYTES.contains(&ram_size) {
        let (lo, hi) = (MEMORY_BYTES.start() >> 20, MEMORY_BYTES.end() >> 20);
        return Err(usage(format!("memory of {ram_size} bytes is out of range ({lo} to {hi} MiB)")));
    }
    if let Some(host) = ftvm_host::memory::capacity().filter(|&host| ram_size > host) {
        return Err(usage(format!(
            "memory of {} MiB is more than this host has ({} MiB of RAM and swap)",
            ram_size >> 20,
            host >> 20
        )));
    }
    // Checked before looking for the image, for the same reason.
    backends(args, None)?;
    if args.bios.is_some() && args.kernel.is_some() {
        if let Some(opt) = [("--image", args.image.is_some()), ("--persist", args.persist)].iter().find(|o| o.1) {
            return Err(usage(format!("{} has no image to use: --bios and --kernel are both given", opt.0)));
        }
    }
    if args.persist && args.kernel.is_some() {
        return Err(usage(
            "--persist writes the image's root disk, which --kernel does not boot: name a disk with --disk",
        ));
    }
    // The image supplies the firmware unless --bios is given, and kernel,
    // initrd and root disk unless --kernel is.
    let image = if args.bios.is_none() || args.kernel.is_none() { Some(image(args)?) } else { None };
    let firmware_path = match &args.bios {
        Some(Firmware::None) => None,
        Some(Firmware::File(p)) => Some(p.clone()),
        None => Some(image.as_ref().unwrap().firmware.clone()),
    };
    let firmware = firmware_path.as_ref().map(|p| read_file("cannot read firmware", p)).transpose()?;
    let default_kernel = args.kernel.is_none();
    let kernel_path = args.kernel.clone().unwrap_or_else(|| image.as_ref().unwrap().kernel.clone());
    let kernel = read_file("cannot read kernel", &kernel_path)?;
    let initrd_path = match (&args.initrd, default_kernel) {
        (Some(p), _) => Some(p.clone()),
        (None, true) => Some(image.as_ref().unwrap().initrd.clone()),
        (None, false) => None,
    };
    let initrd = initrd_path.as_ref().map(|p| read_file("cannot read initrd", p)).transpose()?;
    // The image's root disk, when no --disk is given: a copy for this run
    // unless --persist.
    let mut overlay = None;
    let root = match &image {
        Some(img) if default_kernel && args.disks.is_empty() && !args.persist => {
            let name = args.image.as_deref().unwrap_or(ftvm_image::IMAGE_NAME);
            let copy = Overlay::create(img, name)?;
            let path = copy.path().to_path_buf();
            overlay = Some(copy);
            Some(path)
        }
        Some(img) if default_kernel => Some(img.rootfs.clone()),
        _ => None,
    };
    let backends = backends(args, root)?;
    let mut cmdline = args.append.clone().unwrap_or_else(|| {
        if default_kernel {
            "console=ttyS0 root=/dev/vda rw".to_string()
        } else {
            String::new()
        }
    });
    if args.exec.is_some() {
        exec::add_to_cmdline(&mut cmdline, args.verbose);
    }
    // Linux copies at most this much of the command line and silently drops
    // the rest, which would cut an --exec command short.
    let max = ftvm_image::protocol::KERNEL_CMDLINE_MAX - 1;
    if cmdline.len() > max {
        return Err(usage(format!(
            "the kernel command line would be {} bytes, over Linux's limit of {max}",
            cmdline.len()
        )));
    }
    tracing::debug!(%cmdline, "kernel command line");
    let users = args.users.iter().map(Into::into).collect();
    let seed = ftvm_image::seed::Seed::new(args.hostname.clone(), args.ssh_keys.clone(), users)
        .map_err(|e| usage(e.to_string()))?;
    let cfg = MachineConfig {
        harts: args.harts,
        ram_size,
        firmware,
        kernel,
        initrd,
        cmdline,
        devices: Vec::new(),
        guest_ips: DEFAULT_GUEST_IPS,
        rtc_base_ns: wall_clock_ns(),
        extensions: ftvm_machine::Extensions::ALL,
        seed: seed.text(),
    };
    Ok((cfg, backends, Sources { firmware: firmware_path, kernel: kernel_path, initrd: initrd_path }, overlay))
}

/// The host's clock, in ns since the Unix epoch: what a new VM's RTC
/// starts from. Read here, by the host, and handed to the machine (which
/// never reads a clock); a clock before 1970 reads as the epoch.
pub(crate) fn wall_clock_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// Where a booted machine's firmware, kernel and initrd came from.
struct Sources {
    firmware: Option<PathBuf>,
    kernel: PathBuf,
    initrd: Option<PathBuf>,
}

/// Where a running VM's log goes.
// One per process, read once at its start.
#[allow(clippy::large_enum_variant)]
pub enum Target {
    None,
    /// `ftvm record`
    File(PathBuf),
    /// `ftvm ft primary`
    Backup(ft::ProtectConfig),
}

/// `ftvm run`, `ftvm record` and `ftvm ft primary`.
pub fn run(mut args: VmConfig, target: Target) -> Result<u32, VmmError> {
    if let Target::Backup(ft) = &target {
        // Before anything is made: an option of another mode is refused.
        ft.check_mode_options()?;
    }
    if let Some(percent) = args.cpu_limit {
        CPU_LIMIT_PERCENT.check("a CPU limit", percent).map_err(usage)?;
    }
    if args.paused && args.control.is_none() {
        return Err(usage("a VM started paused needs a control socket: nothing else could resume it"));
    }
    let (events_tx, events) = std::sync::mpsc::channel();
    let journal = match &target {
        Target::Backup(ft) => ft.pair.journal()?,
        _ => Events::default(),
    };
    // A protected primary's outputs leave only while its backup's
    // acknowledgements keep its lease (or the arbiter says it is alone).
    let fence = match &target {
        Target::Backup(_) => Fence::leased(),
        _ => Fence::alone(),
    };
    // Files made for the pair (the default shared disk), removed if the
    // primary does not start.
    let mut made = ft::Leftovers::default();
    if let Target::Backup(ft) = &target {
        // A VM restored from a snapshot keeps the snapshot's disks unless
        // --disk names others: its guest has them mounted.
        if ft.disk_sharing()? == DiskSharing::Separate && args.disks.is_empty() {
            return Err(usage(if ft.mode == Mode::Checkpoint {
                "checkpoint mode keeps a copy of the disk on each host: name this host's with --disk"
            } else {
                "with --disk-sharing separate, name this host's copy of the disk with --disk"
            }));
        }
        if args.persist {
            return Err(usage(
                "--persist: a pair's disk is disk.img in --shared (or --disk), a copy of the image, never the image itself",
            ));
        }
        // The disk lives on the shared storage, where the backup finds it.
        if args.disks.is_empty() && args.kernel.is_none() && args.restore.is_none() {
            let img = image(&args)?;
            let disk = ft::default_shared_disk(&ft.pair, &img.rootfs, &mut made)?;
            args.disks.push(DiskConfig { path: disk, readonly: false, latency_us: 0 });
        }
    }
    let mut primary: Option<Box<dyn Primary<Machine>>> = None;
    let mut start_log = |h: &mut ftvm_replay::Header| -> Result<(), VmmError> {
        primary = match &target {
            Target::None => None,
            Target::File(path) => Some(Box::new(record::Recording::create(path, h)?)),
            Target::Backup(ft) => {
                let started = ft::start_primary(ft, h, events_tx.clone(), &journal, fence.clone())?;
                // The pair started: its backup uses what was made.
                made.disarm();
                Some(started)
            }
        };
        Ok(())
    };
    let mut overlay = None;
    let (mut machine, mut io, on_reset) = match &args.restore {
        None => {
            let (mut cfg, backends, src, copy) = machine_config(&args)?;
            if let (Some(copy), Target::File(log)) = (&copy, &target) {
                copy.keeper().keep(format!("the log {} names it, for `ftvm replay --then-run`", log.display()));
            }
            overlay = copy;
            let (io, devices) = HostIo::open(backends, events_tx.clone(), fence.clone())?;
            cfg.devices = devices;
            let m = Machine::new(&cfg)?;
            if !matches!(target, Target::None) {
                let start = Start::Boot {
                    firmware: src.firmware.as_deref().zip(cfg.firmware.as_deref()),
                    kernel: (&src.kernel, &cfg.kernel),
                    initrd: src.initrd.as_deref().zip(cfg.initrd.as_deref()),
                    cmdline: &cfg.cmdline,
                    seed: cfg.seed.as_deref(),
                };
                let mut h = recorder::header(&m, cfg.ram_size, cfg.guest_ips, &io.describe(), start);
                start_log(&mut h)?;
            }
            let on_reset = match target {
                Target::None => {
                    let dirty_tracking = args.dirty_tracking;
                    live::OnReset::Boot(Box::new(move || {
                        // A reboot starts virtual time from zero again: the
                        // guest's date is the host's at the reboot.
                        let cfg = MachineConfig { rtc_base_ns: wall_clock_ns(), ..cfg.clone() };
                        let mut m = Machine::new(&cfg)?;
                        m.set_dirty_tracking(dirty_tracking);
                        Ok(m)
                    }))
                }
                Target::File(_) => live::OnReset::Refuse(RebootRefused::Recorded),
                Target::Backup(_) => live::OnReset::Refuse(RebootRefused::Protected),
            };
            (m, io, on_reset)
        }
        Some(file) => {
            let (m, io) = restore(&args, file, &events_tx, fence.clone())?;
            if !matches!(target, Target::None) {
                let bytes = std::fs::read(file).map_err(crate::error::file("cannot read snapshot", file))?;
                // The header names it for the replay (or the backup) to find,
                // whatever its working directory.
                let file = std::fs::canonicalize(file).unwrap_or_else(|_| file.clone());
                let start = Start::Snapshot { path: &file, bytes: &bytes };
                let mut h = recorder::header(&m, m.ram().size(), DEFAULT_GUEST_IPS, &io.describe(), start);
                start_log(&mut h)?;
            }
            (m, io, live::OnReset::Refuse(RebootRefused::Restored))
        }
    };
    // Replay checks digests of the pages written, so recording tracks them.
    // Checkpoints carry the pages written since the last one.
    machine.set_dirty_tracking(args.dirty_tracking || primary.is_some());
    crate::signals::forward_stop_signals(events_tx.clone());
    let console_hub = crate::attach::ConsoleHub::default();
    console_hub.set_input(events_tx.clone());
    if args.exec.is_some() {
        console_hub.forbid_typing("the console carries the --exec command's protocol");
    }
    let _control = match &args.control {
        Some(path) => {
            io.set_control(true);
            Some(control::listen(path, events_tx.clone(), journal.clone(), console_hub.clone())?)
        }
        None => None,
    };
    // With --exec, stdin is the command's: read unless it is a terminal
    // (a command waiting on a terminal nobody types into for it would
    // hang a script; it gets the end of its input at once instead).
    let stdin_tty = std::io::IsTerminal::is_terminal(&std::io::stdin());
    let console_input = args.exec.is_none() || !stdin_tty;
    if console_input {
        let escape = args.exec.is_none();
        console::spawn_reader(events_tx.clone(), HostEvent::Console, escape);
    }
    drop(events_tx);
    let options = live::Options {
        console: console_hub,
        fast_time: args.fast_time,
        exec: args.exec.clone(),
        show_boot: args.verbose,
        console_input,
        paused: args.paused,
        ft_alone: false,
        limits: args.exec.is_some().then(|| live::ExecLimits {
            boot: Duration::from_secs(args.boot_timeout_s),
            command: args.exec_timeout_s.map(Duration::from_secs),
        }),
        stop_timeout: Duration::from_secs(args.stop_timeout_s),
        disk_keepers: overlay.iter().map(Overlay::keeper).collect(),
        cpu_limit: args.cpu_limit.filter(|&p| p < 100),
        parallel_harts: args.hart_threads == HartThreads::Multi,
    };
    // A plain VM, and a primary whose backup is lost, can be given one
    // while it runs; a recording cannot (its log is the file's).
    let protector: Option<Box<dyn Protector<Machine>>> = match target {
        Target::File(_) => None,
        _ => Some(Box::new(MachineProtector { journal })),
    };
    let result = live::run(machine, io, events, options, on_reset, primary, protector);
    // The run's copy of the root disk goes (or is said to be kept) only
    // once the VM and its disk threads are done with it.
    drop(overlay);
    result
}

/// A machine from a snapshot file, with its devices attached to the
/// backends the file names (or to those given with --disk/--net instead).
fn restore(
    args: &VmConfig,
    file: &std::path::Path,
    events: &std::sync::mpsc::Sender<HostEvent>,
    fence: Fence,
) -> Result<(Machine, HostIo), VmmError> {
    let conflicting = [
        ("--bios", args.bios.is_some()),
        ("--kernel", args.kernel.is_some()),
        ("--initrd", args.initrd.is_some()),
        ("--append", args.append.is_some()),
        ("--exec", args.exec.is_some()),
        ("--no-rng", args.no_rng),
    ];
    if let Some((opt, _)) = conflicting.iter().find(|(_, given)| *given) {
        return Err(usage(format!("{opt} cannot be combined with --restore: the snapshot holds the whole machine")));
    }
    let bad = |problem: SnapshotProblem| VmmError::Snapshot { path: file.to_path_buf(), problem };
    let snap = snapshot_file::read(file)?;
    let text = String::from_utf8(snap.host).map_err(|_| bad(SnapshotProblem::DeviceListText))?;
    let mut backends = host_io::parse_description(&text).map_err(|e| bad(e.into()))?;
    // --disk and --net given on the command line replace the snapshot's, in order.
    let mut disks = args.disks.iter().map(disk_backend);
    let mut nets = args.nets.iter().enumerate().map(|(i, n)| net_backend(n, i));
    for b in backends.iter_mut() {
        let given = match b {
            Backend::Disk { .. } => disks.next(),
            Backend::Tap { .. } => nets.next(),
            Backend::Rng => None,
        };
        if let Some(g) = given {
            let g = g?;
            // The guest knows its MAC: a replacement NIC keeps it.
            *b = match (g, &*b) {
                (Backend::Tap { name, bridge, .. }, Backend::Tap { mac, .. }) => {
                    Backend::Tap { name, mac: *mac, bridge }
                }
                (g, _) => g,
            };
        }
    }
    if disks.next().is_some() || nets.next().is_some() {
        return Err(bad(SnapshotProblem::FewerDevices));
    }
    // As with --mem: RAM beyond the host is refused before it is allocated.
    let ram = Machine::snapshot_ram(&snap.machine).map_err(|e| bad(e.into()))?;
    if let Some(host) = ftvm_host::memory::capacity().filter(|&host| ram > host) {
        return Err(bad(SnapshotProblem::TooLarge { ram, host }));
    }
    let mut machine = Machine::restore(&snap.machine).map_err(|e| bad(e.into()))?;
    // The guest's RTC goes on from the host's clock, not from when the
    // snapshot was taken (virtual time stood still in between). A VM
    // restored --paused stays exactly as saved, so that a snapshot of it
    // is the same file: its RTC goes on from the snapshot's date.
    if !args.paused {
        machine.set_rtc_now_ns(wall_clock_ns());
    }
    let (io, devices) = HostIo::open(backends, events.clone(), fence)?;
    for (slot, (want, got)) in machine.devices().iter().zip(&devices).enumerate() {
        if want != got {
            return Err(bad(SnapshotProblem::DeviceChanged {
                slot,
                was: format!("{want:?}"),
                now: format!("{got:?}"),
            }));
        }
    }
    if machine.devices().len() != devices.len() {
        return Err(bad(SnapshotProblem::DeviceCount));
    }
    Ok((machine, io))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot whose machine has more RAM than this host is refused
    /// before any of it is allocated (as --mem is): the file holds the
    /// largest RAM a machine may have, 64 GiB of zero pages.
    #[test]
    fn a_snapshot_of_more_ram_than_the_host_has_is_refused_before_it_is_allocated() {
        const RAM: u64 = 64 << 30;
        let Some(host) = ftvm_host::memory::capacity().filter(|&host| host < RAM) else {
            eprintln!("this host has 64 GiB of RAM and swap or more: nothing to show");
            return;
        };
        let cfg = MachineConfig {
            harts: 1,
            ram_size: 16 << 20,
            firmware: None,
            // j . : a kernel that spins.
            kernel: 0x0000_006fu32.to_le_bytes().to_vec(),
            initrd: None,
            cmdline: String::new(),
            seed: None,
            devices: Vec::new(),
            guest_ips: DEFAULT_GUEST_IPS,
            rtc_base_ns: 0,
            extensions: ftvm_machine::Extensions::ALL,
        };
        let small = Machine::new(&cfg).unwrap().snapshot().unwrap();
        // The same state up to its RAM, then 64 GiB of it: the whole page
        // map (a bit a page, none set) and no page data.
        let field = [ftvm_machine::layout::RAM_BASE.to_le_bytes(), (16u64 << 20).to_le_bytes()].concat();
        let at = small.windows(16).position(|w| w == field).unwrap() + 8;
        let mut huge = small[..at].to_vec();
        huge.extend_from_slice(&RAM.to_le_bytes());
        let map = RAM / 4096 / 8;
        huge.extend_from_slice(&map.to_le_bytes());
        huge.resize(huge.len() + map as usize, 0);
        huge.extend_from_slice(&0u64.to_le_bytes());
        let path = std::env::temp_dir().join(format!("ftvm-huge-{}.snap", std::process::id()));
        snapshot_file::write(&path, b"", &huge).unwrap();
        let args = VmConfig { restore: Some(path.clone()), ..VmConfig::default() };
        let (events, _) = std::sync::mpsc::channel();
        let refused = restore(&args, &path, &events, Fence::alone()).err().expect("refused");
        std::fs::remove_file(&path).unwrap();
        assert!(
            matches!(&refused, VmmError::Snapshot { problem: SnapshotProblem::TooLarge { ram: RAM, host: h }, .. } if *h == host),
            "{refused}"
        );
        assert!(refused.to_string().contains("its machine has 65536 MiB of RAM, more than this host has"), "{refused}");
    }

    /// What the command line's `--disk` and `--net` were checked for here
    /// (a configuration file's values come as they are).
    #[test]
    fn disks_and_nics_of_a_configuration() {
        let disk = |latency_us| DiskConfig { path: "/tmp/x.img".into(), readonly: true, latency_us };
        let d = disk_backend(&disk(26_000)).unwrap();
        assert_eq!(d, Backend::Disk { path: "/tmp/x.img".into(), readonly: true, latency: Duration::from_millis(26) });
        assert!(disk_backend(&disk(11_000_000)).unwrap_err().to_string().contains("over the limit"));
        assert!(disk_backend(&DiskConfig { path: "".into(), readonly: false, latency_us: 0 }).is_err());
        let net = |tap: &str| NetConfig { tap: tap.into(), mac: None, bridge: Some("br0".into()) };
        assert_eq!(
            net_backend(&net("t0"), 1).unwrap(),
            Backend::Tap { name: "t0".into(), mac: [0x52, 0x54, 0, 0x12, 0x34, 0x57], bridge: Some("br0".into()) }
        );
        assert!(net_backend(&net("averyveryverylongname"), 0).unwrap_err().to_string().contains("15 bytes"));
    }
}
