//! The command line of a VM's run (`ftvm run`, `ftvm record`, `ftvm
//! replay`): clap's structs, turned into the API's [`VmConfig`] here, at
//! the edge, where a value is checked and refused as the user wrote it
//! (`--mem 60G`); or the configuration read whole from `--config FILE`.
//! The library (`ftvm_vmm`) never sees a command line.

use crate::pair_cli::choice;
use clap::Args;
use ftvm_api::limits::CPU_LIMIT_PERCENT;
use ftvm_api::vm_config::{
    check_tap_name, DiskConfig, Firmware, HartThreads, MacAddress, NetConfig, UserConfig, VmConfig,
    DEFAULT_BOOT_TIMEOUT_S, DEFAULT_STOP_TIMEOUT_S, HARTS, MEMORY_BYTES,
};
use ftvm_vmm::replay::ReplayConfig;
use std::path::{Path, PathBuf};

/// `ftvm record`'s options.
#[derive(Args)]
pub struct RecordArgs {
    /// Where to write the log.
    #[arg(long, value_name = "FILE")]
    pub log: PathBuf,
    #[command(flatten)]
    pub run: RunArgs,
}

/// `ftvm run`'s options (also `record`'s and `ft primary`'s): turned into
/// a [`VmConfig`] by `TryFrom`, or read as one from `--config FILE`.
#[derive(Args)]
pub struct RunArgs {
    /// Read the VM's configuration from FILE (JSON, `ftvm_api::VmConfig`:
    /// every field optional, e.g. {"memory_bytes": 536870912, "disks":
    /// [{"path": "/srv/vm/disk.img"}], "control": "/srv/vm/control.sock"})
    /// instead of these options, as a program that starts VMs gives it.
    #[arg(long, value_name = "FILE", conflicts_with_all = RUN_OPTIONS)]
    pub config: Option<PathBuf>,
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
    /// The VM's host name, in its seed: the image's guest takes it at boot
    /// (`/usr/lib/ftvm/setup`; a new name replaces the one it had).
    #[arg(long, value_name = "NAME", conflicts_with = "restore")]
    pub hostname: Option<String>,
    /// A public key (an OpenSSH `.pub` file) root may log in with over
    /// ssh, in the VM's seed: the guest adds it to root's authorized keys
    /// at boot. May be repeated.
    #[arg(long = "ssh-key", value_name = "FILE", conflicts_with = "restore")]
    pub ssh_keys: Vec<PathBuf>,
    /// An account the guest makes at boot, in the VM's seed: NAME, the
    /// public keys in KEYFILE it may log in with over ssh, and the groups
    /// it joins (those the image has), e.g. `alice:alice.pub:sudo,adm`.
    /// No password (keys only). May be repeated.
    #[arg(long = "user", value_name = "NAME[:KEYFILE[:GROUP,...]]", conflicts_with = "restore")]
    pub users: Vec<String>,
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
    #[arg(long, value_parser = choice::<HartThreads>(HartThreads::NAMES), default_value = "multi")]
    pub hart_threads: HartThreads,
}

/// Every option of [`RunArgs`] but `--config`, which replaces them all.
const RUN_OPTIONS: [&str; 26] = [
    "image",
    "persist",
    "bios",
    "kernel",
    "initrd",
    "append",
    "mem",
    "cpus",
    "disks",
    "nets",
    "hostname",
    "ssh_keys",
    "users",
    "no_rng",
    "restore",
    "control",
    "paused",
    "exec",
    "verbose",
    "exec_timeout",
    "boot_timeout",
    "fast_time",
    "stop_timeout",
    "cpu_limit",
    "dirty_tracking",
    "hart_threads",
];

/// `ftvm replay`'s options.
#[derive(Args)]
pub struct ReplayArgs {
    /// The log written by `ftvm record`.
    #[arg(long, value_name = "FILE")]
    log: PathBuf,
    /// Show the guest's console output as it is regenerated.
    #[arg(long)]
    show_console: bool,
    /// At the end of the log (or its last go-live point), go on running
    /// live with the recorded disks and TAPs.
    #[arg(long)]
    then_run: bool,
    /// With --then-run: the control socket of the live VM.
    #[arg(long, value_name = "PATH", requires = "then_run")]
    control: Option<PathBuf>,
}

impl From<ReplayArgs> for ReplayConfig {
    fn from(a: ReplayArgs) -> ReplayConfig {
        ReplayConfig { log: a.log, show_console: a.show_console, then_run: a.then_run, control: a.control }
    }
}

/// Why a configuration file could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    #[error("cannot read the configuration {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is not a configuration ftvm reads: {source}", .path.display())]
    Unreadable {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// The configuration in the JSON file at `path`.
pub fn read_config<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, ConfigFileError> {
    let text = std::fs::read(path).map_err(|source| ConfigFileError::Read { path: path.to_path_buf(), source })?;
    serde_json::from_slice(&text).map_err(|source| ConfigFileError::Unreadable { path: path.to_path_buf(), source })
}

/// Why a run's options are refused (exit status 1, as the library's own
/// refusals of a configuration).
#[derive(Debug, thiserror::Error)]
pub enum RunOptionsError {
    /// An option's value that cannot be taken, said as the user wrote it.
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    File(#[from] ConfigFileError),
}

fn usage(message: impl Into<String>) -> RunOptionsError {
    RunOptionsError::Invalid(message.into())
}

impl TryFrom<RunArgs> for VmConfig {
    type Error = RunOptionsError;

    fn try_from(a: RunArgs) -> Result<VmConfig, RunOptionsError> {
        if let Some(path) = &a.config {
            return Ok(read_config(path)?);
        }
        // In the order the library checked them when it parsed them.
        if !HARTS.contains(&a.cpus) {
            let (lo, hi) = (HARTS.start(), HARTS.end());
            return Err(usage(format!("--cpus must be between {lo} and {hi}, not {}", a.cpus)));
        }
        let memory_bytes = guest_memory(&a.mem)?;
        // A restored VM's memory is its snapshot's, checked as it is read.
        if a.restore.is_none() {
            if let Some(host) = ftvm_host::memory::capacity().filter(|&host| memory_bytes > host) {
                let s = &a.mem;
                let e = format!("--mem {s} is more than this host has ({} MiB of RAM and swap)", host >> 20);
                return Err(usage(e));
            }
        }
        let disks = a.disks.iter().map(|d| parse_disk(d)).collect::<Result<Vec<_>, _>>()?;
        let nets = a.nets.iter().map(|n| parse_net(n)).collect::<Result<Vec<_>, _>>()?;
        let ssh_keys = ftvm_image::seed::read_public_keys(&a.ssh_keys).map_err(|e| usage(e.to_string()))?;
        let users = a
            .users
            .iter()
            .map(|spec| ftvm_image::seed::parse_user(spec).map(UserConfig::from).map_err(|e| usage(e.to_string())))
            .collect::<Result<Vec<_>, RunOptionsError>>()?;
        Ok(VmConfig {
            image: a.image,
            persist: a.persist,
            bios: a.bios.map(|b| if b == "none" { Firmware::None } else { Firmware::File(b.into()) }),
            kernel: a.kernel,
            initrd: a.initrd,
            append: a.append,
            memory_bytes,
            harts: a.cpus,
            disks,
            nets,
            hostname: a.hostname,
            ssh_keys,
            users,
            no_rng: a.no_rng,
            restore: a.restore,
            control: a.control,
            paused: a.paused,
            exec: a.exec,
            verbose: a.verbose,
            exec_timeout_s: a.exec_timeout,
            boot_timeout_s: a.boot_timeout,
            fast_time: a.fast_time,
            stop_timeout_s: a.stop_timeout,
            cpu_limit: a.cpu_limit,
            dirty_tracking: a.dirty_tracking,
            hart_threads: a.hart_threads,
        })
    }
}

/// Parse and check `--mem`.
fn guest_memory(s: &str) -> Result<u64, RunOptionsError> {
    let bytes = parse_mem(s)?;
    if bytes < *MEMORY_BYTES.start() {
        return Err(usage(format!("--mem {s} is too small: the minimum is {}M", MEMORY_BYTES.start() >> 20)));
    }
    if bytes > *MEMORY_BYTES.end() {
        return Err(usage(format!("--mem {s} is too large: the maximum is {}G", MEMORY_BYTES.end() >> 30)));
    }
    Ok(bytes)
}

/// Parse a memory size: `512M`, `2G`, `1048576K`, or a plain number of MiB.
fn parse_mem(s: &str) -> Result<u64, RunOptionsError> {
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

/// `--disk PATH[,readonly][,latency=26ms]`.
fn parse_disk(s: &str) -> Result<DiskConfig, RunOptionsError> {
    let mut parts = s.split(',');
    let path = PathBuf::from(parts.next().unwrap_or_default());
    if path.as_os_str().is_empty() {
        return Err(usage("--disk needs a path"));
    }
    let mut readonly = false;
    let mut latency = std::time::Duration::ZERO;
    for opt in parts {
        match opt.split_once('=') {
            None if matches!(opt, "readonly" | "ro") => readonly = true,
            Some(("latency", l)) => latency = ftvm_vmm::host_io::parse_latency(l).map_err(|e| usage(e.to_string()))?,
            _ => return Err(usage(format!("unknown disk option '{opt}' in --disk {s}"))),
        }
    }
    Ok(DiskConfig { path, readonly, latency_us: latency.as_micros() as u64 })
}

/// `--net tap=NAME[,mac=..][,bridge=..]`.
fn parse_net(s: &str) -> Result<NetConfig, RunOptionsError> {
    let (mut tap, mut mac, mut bridge) = (None, None, None);
    for opt in s.split(',') {
        match opt.split_once('=') {
            Some(("tap", v)) if !v.is_empty() => tap = Some(v.to_string()),
            Some(("mac", v)) => mac = Some(v.parse::<MacAddress>().map_err(|e| usage(e.to_string()))?),
            Some(("bridge", v)) if !v.is_empty() => bridge = Some(v.to_string()),
            _ => return Err(usage(format!("invalid --net option '{opt}' (use tap=NAME[,mac=MAC][,bridge=BR])"))),
        }
    }
    let tap = tap.ok_or_else(|| usage(format!("--net {s} names no TAP (use tap=NAME)")))?;
    check_tap_name(&tap).map_err(usage)?;
    Ok(NetConfig { tap, mac, bridge })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
        assert_eq!(d, DiskConfig { path: "/tmp/x.img".into(), readonly: true, latency_us: 0 });
        let d = parse_disk("/tmp/x.img,latency=26ms").unwrap();
        let latency_us = Duration::from_millis(26).as_micros() as u64;
        assert_eq!(d, DiskConfig { path: "/tmp/x.img".into(), readonly: false, latency_us });
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
            parse_net("tap=t0,bridge=br0").unwrap(),
            NetConfig { tap: "t0".into(), mac: None, bridge: Some("br0".into()) }
        );
        let b = parse_net("mac=02:00:00:00:00:01,tap=x").unwrap();
        assert_eq!(b, NetConfig { tap: "x".into(), mac: Some(MacAddress([2, 0, 0, 0, 0, 1])), bridge: None });
        assert!(parse_net("bridge=br0").unwrap_err().to_string().contains("names no TAP"));
        assert!(parse_net("tap=t0,speed=10G").is_err());
        assert!(parse_net("tap=averyveryverylongname").unwrap_err().to_string().contains("15 bytes"));
        assert!(parse_net("tap=t0,mac=zz").is_err());
    }

    /// The agent started its VMs with these options; it now writes their
    /// configuration to a file: the same VM either way.
    #[test]
    fn the_agents_configuration_is_the_vm_its_old_options_made() {
        use ftvm_cluster::agent::vms::{mac_of, tap_name, vm_config};
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            run: RunArgs,
        }
        let spec = r#"{"name": "redis", "memory_mib": 512, "cpus": 2, "command": "redis-server",
                       "network": {"bridge": "br0", "ip": "10.0.0.5/24"}}"#;
        let spec: ftvm_cluster::model::VmSpec = serde_json::from_str(spec).unwrap();
        let dir = Path::new("/srv/ftvm/vms/redis");
        let net = format!("tap={},mac={},bridge=br0", tap_name("redis"), mac_of("redis"));
        let image = ftvm_image::GuestImage {
            kernel: "/img/Image".into(),
            initrd: "/img/initrd.img".into(),
            rootfs: "/img/rootfs.ext4".into(),
            firmware: "/img/fw_dynamic.bin".into(),
            kernel_version: String::new(),
        };
        let options = [
            "run",
            "--bios",
            "/img/fw_dynamic.bin",
            "--kernel",
            "/img/Image",
            "--initrd",
            "/img/initrd.img",
            "--hostname",
            "redis",
            "--mem",
            "512M",
            "--cpus",
            "2",
            "--disk",
            "/srv/ftvm/vms/redis/disk.img",
            "--control",
            "/srv/ftvm/vms/redis/control.sock",
            "--append",
            "console=ttyS0 root=/dev/vda rw quiet ftvm.ip=10.0.0.5/24",
            "--net",
            &net,
            "--exec",
            "redis-server",
        ];
        let from_options = VmConfig::try_from(<Cli as clap::Parser>::parse_from(options).run).unwrap();
        assert_eq!(from_options, vm_config(&spec, dir, &image));
    }
}
