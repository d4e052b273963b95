//! Starting a VM from run options: the machine's configuration and the
//! backends of its devices (the default guest image filling in what was
//! not given), or a snapshot to restore, and where its log goes (nowhere,
//! a file, or a backup). What `ftvm run`, `ftvm record` and
//! `ftvm ft primary` share. An image's root disk is booted on a copy of
//! its own (`overlay`) unless `--persist`.

use crate::error::{file, usage, RebootRefused, SnapshotProblem, VmmError};
use crate::ft::protect::{MachineProtector, Protector};
use crate::ft::{PairSetup, ProtectSetup};
use crate::host_io::{self, Backend, HostEvent, HostIo};
use crate::overlay::Overlay;
use crate::{console, control, exec, ft, live, record};
use clap::Args;
use ftvm_machine::{snapshot_file, Machine, MachineConfig, DEFAULT_GUEST_IPS};
use ftvm_protection::control::CPU_LIMIT_PERCENT;
use ftvm_protection::events::Events;
use ftvm_protection::pair::{DiskSharing, Mode};
use ftvm_protection::primary::Primary;
use ftvm_replay::recorder::{self, Start};
use ftvm_replication::fence::Fence;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args)]
pub struct RecordArgs {
    /// Where to write the log.
    #[arg(long, value_name = "FILE")]
    pub log: PathBuf,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Args)]
pub struct RunArgs {
    /// Boot this image (`ftvm image list`; built with `ftvm image build
    /// --name NAME`) instead of the default one: its firmware, kernel,
    /// initrd and root disk fill in what is not given.
    #[arg(long, value_name = "NAME", conflicts_with = "restore")]
    pub image: Option<String>,
    /// Let the guest write the image's root disk itself. Without it the
    /// guest runs on a copy that goes when the run ends (kept if a snapshot
    /// or a recording names it), and the image stays as built. A disk given
    /// with --disk is always written.
    #[arg(long, conflicts_with_all = ["disks", "restore"])]
    pub persist: bool,
    /// M-mode firmware (OpenSBI fw_dynamic.bin), or `none` to start the kernel itself in M-mode.
    #[arg(long)]
    pub bios: Option<String>,
    /// Kernel Image (or a bare-metal ELF program with --bios none).
    #[arg(long)]
    pub kernel: Option<PathBuf>,
    /// Initial ramdisk.
    #[arg(long)]
    pub initrd: Option<PathBuf>,
    /// Kernel command line.
    #[arg(long)]
    pub append: Option<String>,
    /// Guest memory, e.g. 512M or 2G (a plain number is MiB).
    #[arg(long, default_value = "1G")]
    pub mem: String,
    /// Number of harts.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    pub cpus: usize,
    /// A raw disk image: PATH[,readonly][,latency=26ms]. May be repeated;
    /// the first is /dev/vda. A latency makes every request take at least
    /// that long, to model a slower disk than the host's (for benchmarks).
    #[arg(long = "disk")]
    pub disks: Vec<String>,
    /// A NIC on a TAP: tap=NAME[,mac=52:54:00:12:34:56][,bridge=BR]. The TAP
    /// is created if it does not exist. May be repeated.
    #[arg(long = "net")]
    pub nets: Vec<String>,
    /// Leave out the virtio-rng device (host entropy for the guest).
    #[arg(long)]
    pub no_rng: bool,
    /// Continue the VM saved in this snapshot file instead of booting.
    #[arg(long, value_name = "FILE")]
    pub restore: Option<PathBuf>,
    /// Listen for commands (pause, resume, snapshot, ...) on this Unix socket.
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// Start paused (needs --control): nothing runs until `resume`.
    #[arg(long, requires = "control")]
    pub paused: bool,
    /// Boot, run CMD in the guest with /bin/sh -c, power off, exit with its status.
    #[arg(long)]
    pub exec: Option<String>,
    /// With --exec, also show the boot messages before the command starts.
    #[arg(long)]
    pub verbose: bool,
    /// With --exec: stop the guest and fail (exit status 124) if the command
    /// has not finished SECONDS (wall time) after it started. Default: no limit.
    #[arg(long, value_name = "SECONDS", requires = "exec", value_parser = clap::value_parser!(u64).range(1..))]
    pub exec_timeout: Option<u64>,
    /// With --exec: stop the guest and fail (exit status 124) if the command
    /// has not started SECONDS (wall time) after the guest began to boot.
    #[arg(long, value_name = "SECONDS", requires = "exec", default_value_t = DEFAULT_BOOT_TIMEOUT_S, value_parser = clap::value_parser!(u64).range(1..))]
    pub boot_timeout: u64,
    /// Let guest time run as fast as the host can go instead of following
    /// the wall clock (idle periods are skipped at once).
    #[arg(long)]
    pub fast_time: bool,
    /// On SIGTERM or SIGINT, how long the guest has to power off before
    /// ftvm stops it. The guest is asked with a magic SysRq on its serial
    /// console (break, then s: sync, u: remount read-only, o: power off);
    /// a second signal stops it at once, as does one while paused or with
    /// 0 here. Exit status: the guest's power-off status (0 for a clean
    /// power off) if it powered off in time, 128 + the signal's number
    /// (143 SIGTERM, 130 SIGINT) if ftvm stopped it, or if it powered off
    /// before an --exec command finished. A protected primary
    /// hands over to its backup instead, and a recording ends as `quit`.
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_STOP_TIMEOUT_S)]
    pub stop_timeout: u64,
    /// Limit the VM to this percentage of one host core (5 to 100; the
    /// control socket's `cpu-limit` changes it). A protected VM's backup
    /// keeps it and runs under it once it goes live.
    #[arg(long, value_name = "PERCENT", value_parser = |text: &str| CPU_LIMIT_PERCENT.parse("a CPU limit", text))]
    pub cpu_limit: Option<u8>,
    /// Record which guest pages are written (what checkpoints and live
    /// migration need); off, stores cost nothing extra.
    #[arg(long)]
    pub dirty_tracking: bool,
    /// Where the harts run: `multi`, each on a host thread of its own,
    /// in parallel, whenever the run need not be repeatable (a plain VM,
    /// a checkpointed primary; a recording, lockstep and epochs always
    /// run them on one thread, as does a CPU limit); `single`, all on one
    /// host thread in turns. QEMU's `-accel tcg,thread=multi|single`.
    #[arg(long, value_enum, default_value_t = HartThreads::Multi)]
    pub hart_threads: HartThreads,
}

/// `--hart-threads`: where a VM's harts run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum HartThreads {
    /// All on one host thread, in a fixed round-robin.
    Single,
    /// Each on a host thread of its own when nothing needs the run exact.
    Multi,
}

/// `--stop-timeout`'s default: a guest syncs and powers off in a few
/// seconds; one that has not in 30 (as systemd's stop timeout, 90, is
/// for a whole host) will not.
pub const DEFAULT_STOP_TIMEOUT_S: u64 = 30;

/// `--boot-timeout`'s default: the default guest starts a command in well
/// under a minute on a busy 2-core host; ten times that is a hang.
pub const DEFAULT_BOOT_TIMEOUT_S: u64 = 600;

/// Guest memory limits (those `Machine::new` enforces), checked here first
/// so the message can quote the option as the user wrote it.
const MIN_MEM: u64 = 16 << 20;
const MAX_MEM: u64 = 64 << 30;
const MAX_CPUS: usize = 8;

/// Parse and check `--mem`.
fn guest_memory(s: &str) -> Result<u64, VmmError> {
    let bytes = parse_mem(s)?;
    if bytes < MIN_MEM {
        return Err(usage(format!("--mem {s} is too small: the minimum is {}M", MIN_MEM >> 20)));
    }
    if bytes > MAX_MEM {
        return Err(usage(format!("--mem {s} is too large: the maximum is {}G", MAX_MEM >> 30)));
    }
    Ok(bytes)
}

/// Parse a memory size: `512M`, `2G`, `1048576K`, or a plain number of MiB.
fn parse_mem(s: &str) -> Result<u64, VmmError> {
    let bad = || usage(format!("invalid memory size '{s}': use a number with K, M or G"));
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                _ => return Err(bad()),
            };
            (&t[..i], m)
        }
        _ => (t, 1 << 20),
    };
    let n: u64 = num.parse().map_err(|_| bad())?;
    n.checked_mul(mult).ok_or_else(|| usage(format!("memory size '{s}' is too large")))
}

fn parse_disk(s: &str) -> Result<Backend, VmmError> {
    let mut parts = s.split(',');
    let path = PathBuf::from(parts.next().unwrap_or_default());
    if path.as_os_str().is_empty() {
        return Err(usage("--disk needs a path"));
    }
    let mut readonly = false;
    let mut latency = Duration::ZERO;
    for opt in parts {
        match opt.split_once('=') {
            None if matches!(opt, "readonly" | "ro") => readonly = true,
            Some(("latency", l)) => latency = host_io::parse_latency(l).map_err(|e| usage(e.to_string()))?,
            _ => return Err(usage(format!("unknown disk option '{opt}' in --disk {s}"))),
        }
    }
    Ok(Backend::Disk { path, readonly, latency })
}

/// `tap=NAME[,mac=..][,bridge=..]`; `index` picks the default MAC.
fn parse_net(s: &str, index: usize) -> Result<Backend, VmmError> {
    let (mut name, mut mac, mut bridge) = (None, None, None);
    for opt in s.split(',') {
        match opt.split_once('=') {
            Some(("tap", v)) if !v.is_empty() => name = Some(v.to_string()),
            Some(("mac", v)) => mac = Some(ftvm_machine::mac::parse_mac(v).map_err(|e| usage(e.to_string()))?),
            Some(("bridge", v)) if !v.is_empty() => bridge = Some(v.to_string()),
            _ => return Err(usage(format!("invalid --net option '{opt}' (use tap=NAME[,mac=MAC][,bridge=BR])"))),
        }
    }
    let name = name.ok_or_else(|| usage(format!("--net {s} names no TAP (use tap=NAME)")))?;
    if name.len() > 15 {
        return Err(usage(format!("TAP name '{name}' is longer than 15 bytes")));
    }
    // QEMU's default MAC, so guests and tools see familiar addresses.
    let mac = mac.unwrap_or([0x52, 0x54, 0x00, 0x12, 0x34, 0x56u8.wrapping_add(index as u8)]);
    Ok(Backend::Tap { name, mac, bridge })
}

fn read_file(doing: &'static str, path: &std::path::Path) -> Result<Vec<u8>, VmmError> {
    std::fs::read(path).map_err(file(doing, path))
}

/// The backends of the virtio slots, in slot order: disks, NICs, rng.
fn backends(args: &RunArgs, default_disk: Option<PathBuf>) -> Result<Vec<Backend>, VmmError> {
    let mut out = args.disks.iter().map(|d| parse_disk(d)).collect::<Result<Vec<_>, _>>()?;
    if out.is_empty() {
        if let Some(path) = default_disk {
            out.push(Backend::Disk { path, readonly: false, latency: Duration::ZERO });
        }
    }
    for (i, n) in args.nets.iter().enumerate() {
        out.push(parse_net(n, i)?);
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
fn image(args: &RunArgs) -> Result<ftvm_image::GuestImage, VmmError> {
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
fn machine_config(args: &RunArgs) -> Result<(MachineConfig, Vec<Backend>, Sources, Option<Overlay>), VmmError> {
    // Options first: a typo should not be reported as a missing image, nor
    // wait for a kernel to be read.
    if args.cpus == 0 || args.cpus > MAX_CPUS {
        return Err(usage(format!("--cpus must be between 1 and {MAX_CPUS}, not {}", args.cpus)));
    }
    let ram_size = guest_memory(&args.mem)?;
    if let Some(host) = ftvm_host::memory::capacity().filter(|&host| ram_size > host) {
        let s = &args.mem;
        return Err(usage(format!("--mem {s} is more than this host has ({} MiB of RAM and swap)", host >> 20)));
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
    let firmware_path = match args.bios.as_deref() {
        Some("none") => None,
        Some(p) => Some(PathBuf::from(p)),
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
    let cfg = MachineConfig {
        harts: args.cpus,
        ram_size,
        firmware,
        kernel,
        initrd,
        cmdline,
        devices: Vec::new(),
        guest_ips: DEFAULT_GUEST_IPS,
        rtc_base_ns: wall_clock_ns(),
        extensions: ftvm_machine::Extensions::ALL,
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
pub fn run(mut args: RunArgs, target: Target) -> Result<u32, VmmError> {
    if let Target::Backup(ft) = &target {
        // Before anything is made: an option of another mode is refused.
        ft.check_mode_options()?;
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
            args.disks.push(disk.display().to_string());
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
            boot: Duration::from_secs(args.boot_timeout),
            command: args.exec_timeout.map(Duration::from_secs),
        }),
        stop_timeout: Duration::from_secs(args.stop_timeout),
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
    args: &RunArgs,
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
    let mut disks = args.disks.iter().map(|d| parse_disk(d));
    let mut nets = args.nets.iter().enumerate().map(|(i, n)| parse_net(n, i));
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
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            run: RunArgs,
        }
        let args = <Cli as clap::Parser>::parse_from(["ftvm", "--restore", path.to_str().unwrap()]).run;
        let (events, _) = std::sync::mpsc::channel();
        let refused = restore(&args, &path, &events, Fence::alone()).err().expect("refused");
        std::fs::remove_file(&path).unwrap();
        assert!(
            matches!(&refused, VmmError::Snapshot { problem: SnapshotProblem::TooLarge { ram: RAM, host: h }, .. } if *h == host),
            "{refused}"
        );
        assert!(refused.to_string().contains("its machine has 65536 MiB of RAM, more than this host has"), "{refused}");
    }

    #[test]
    fn memory_sizes() {
        assert_eq!(parse_mem("512M").unwrap(), 512 << 20);
        assert_eq!(parse_mem("2G").unwrap(), 2 << 30);
        assert_eq!(parse_mem("256").unwrap(), 256 << 20);
        assert!(parse_mem("lots").is_err());
        assert!(parse_mem("12Q").is_err());
        assert!(parse_mem("99999999999G").is_err());
        assert_eq!(guest_memory("16M").unwrap(), 16 << 20);
        assert_eq!(guest_memory("64G").unwrap(), 64 << 30);
        assert!(guest_memory("1500K").unwrap_err().to_string().contains("--mem 1500K is too small"));
        assert!(guest_memory("65G").unwrap_err().to_string().contains("too large"));
    }

    #[test]
    fn disk_options() {
        let d = parse_disk("/tmp/x.img,readonly").unwrap();
        assert_eq!(d, Backend::Disk { path: "/tmp/x.img".into(), readonly: true, latency: Duration::ZERO });
        let d = parse_disk("/tmp/x.img,latency=26ms").unwrap();
        assert_eq!(d, Backend::Disk { path: "/tmp/x.img".into(), readonly: false, latency: Duration::from_millis(26) });
        assert_eq!(parse_disk("/x,latency=500us,ro").unwrap(), parse_disk("/x,ro,latency=500us").unwrap());
        assert!(parse_disk("/tmp/x.img,latency=26").unwrap_err().to_string().contains("invalid disk latency '26'"));
        assert!(parse_disk("/tmp/x.img,latency=1min").is_err());
        assert!(parse_disk("/tmp/x.img,latency=11s").unwrap_err().to_string().contains("over the limit"));
        assert!(parse_disk("/tmp/x.img,bogus").is_err());
        assert!(parse_disk("").is_err());
    }

    #[test]
    fn net_options() {
        assert_eq!(
            parse_net("tap=t0,bridge=br0", 1).unwrap(),
            Backend::Tap { name: "t0".into(), mac: [0x52, 0x54, 0, 0x12, 0x34, 0x57], bridge: Some("br0".into()) }
        );
        let b = parse_net("mac=02:00:00:00:00:01,tap=x", 0).unwrap();
        assert_eq!(b, Backend::Tap { name: "x".into(), mac: [2, 0, 0, 0, 0, 1], bridge: None });
        assert!(parse_net("bridge=br0", 0).unwrap_err().to_string().contains("names no TAP"));
        assert!(parse_net("tap=t0,speed=10G", 0).is_err());
        assert!(parse_net("tap=averyveryverylongname", 0).unwrap_err().to_string().contains("15 bytes"));
        assert!(parse_net("tap=t0,mac=zz", 0).is_err());
    }
}
