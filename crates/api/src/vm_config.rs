//! A VM's configuration as a serde type ([`VmConfig`]): what `ftvm run`
//! takes (its options turned into this at the command line's edge), and
//! the JSON file `ftvm run --config FILE` reads, as Firecracker's
//! `--config-file`: how a program that starts VMs (the cluster's agent)
//! says what it wants without building a command line. Sizes are numbers
//! of bytes, paths are paths, and each disk and NIC says its options as
//! fields; nothing here reads the host.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// Guest memory when none is given: 1 GiB.
pub const DEFAULT_MEMORY_BYTES: u64 = 1 << 30;
/// The guest memory a machine may have, both ends included (what the
/// machine itself enforces): 16 MiB to 64 GiB.
pub const MEMORY_BYTES: std::ops::RangeInclusive<u64> = (16 << 20)..=(64 << 30);
/// The harts a machine may have.
pub const HARTS: std::ops::RangeInclusive<usize> = 1..=8;
/// The longest name a TAP may have (Linux's IFNAMSIZ less its NUL).
pub const MAX_TAP_NAME: usize = 15;
/// The longest latency a disk may be given: a guest's I/O timeouts are 30 s
/// and more, and a longer one would only model a broken disk.
pub const MAX_DISK_LATENCY: Duration = Duration::from_secs(10);
/// `--stop-timeout`'s default: a guest syncs and powers off in a few
/// seconds; one that has not in 30 (as systemd's stop timeout, 90, is
/// for a whole host) will not.
pub const DEFAULT_STOP_TIMEOUT_S: u64 = 30;
/// `--boot-timeout`'s default: the default guest starts a command in well
/// under a minute on a busy 2-core host; ten times that is a hang.
pub const DEFAULT_BOOT_TIMEOUT_S: u64 = 600;

/// A VM: what it boots (or restores), its size, devices, and how it runs.
/// Each field left out of a file takes `ftvm run`'s default.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmConfig {
    /// Boot this image (`ftvm image list`) instead of the default one: its
    /// firmware, kernel, initrd and root disk fill in what is not given.
    #[serde(default)]
    pub image: Option<String>,
    /// Let the guest write the image's root disk itself, not a copy.
    #[serde(default)]
    pub persist: bool,
    /// The M-mode firmware.
    #[serde(default)]
    pub bios: Option<Firmware>,
    /// The kernel Image (or a bare-metal ELF program with no firmware).
    #[serde(default)]
    pub kernel: Option<PathBuf>,
    /// The initial ramdisk.
    #[serde(default)]
    pub initrd: Option<PathBuf>,
    /// The kernel command line.
    #[serde(default)]
    pub append: Option<String>,
    /// Guest memory, in bytes.
    #[serde(default = "default_memory")]
    pub memory_bytes: u64,
    /// Number of harts.
    #[serde(default = "default_harts")]
    pub harts: usize,
    /// Raw disk images, in order: the first is /dev/vda.
    #[serde(default)]
    pub disks: Vec<DiskConfig>,
    /// NICs, each on a TAP.
    #[serde(default)]
    pub nets: Vec<NetConfig>,
    /// The VM's host name, in its seed (the guest's setup takes it at boot).
    #[serde(default)]
    pub hostname: Option<String>,
    /// Public keys root may log in with over ssh (`authorized_keys`
    /// lines), in its seed.
    #[serde(default)]
    pub ssh_keys: Vec<String>,
    /// Accounts the guest makes, in its seed.
    #[serde(default)]
    pub users: Vec<UserConfig>,
    /// Leave out the virtio-rng device (host entropy for the guest).
    #[serde(default)]
    pub no_rng: bool,
    /// Continue the VM saved in this snapshot file instead of booting.
    #[serde(default)]
    pub restore: Option<PathBuf>,
    /// Listen for requests on this Unix socket.
    #[serde(default)]
    pub control: Option<PathBuf>,
    /// Start paused (needs `control`): nothing runs until `resume`.
    #[serde(default)]
    pub paused: bool,
    /// Boot, run this command in the guest with /bin/sh -c, power off,
    /// exit with its status.
    #[serde(default)]
    pub exec: Option<String>,
    /// With `exec`, also show the boot messages before the command starts.
    #[serde(default)]
    pub verbose: bool,
    /// With `exec`: fail if the command has not finished this many
    /// seconds after it started. None: no limit.
    #[serde(default)]
    pub exec_timeout_s: Option<u64>,
    /// With `exec`: fail if the command has not started this many seconds
    /// after the guest began to boot.
    #[serde(default = "default_boot_timeout")]
    pub boot_timeout_s: u64,
    /// Let guest time run as fast as the host can go.
    #[serde(default)]
    pub fast_time: bool,
    /// On SIGTERM or SIGINT, how long the guest has to power off before
    /// it is stopped.
    #[serde(default = "default_stop_timeout")]
    pub stop_timeout_s: u64,
    /// Limit the VM to this percentage of one host core (5 to 100).
    #[serde(default)]
    pub cpu_limit: Option<u8>,
    /// Record which guest pages are written.
    #[serde(default)]
    pub dirty_tracking: bool,
    /// Where the harts run.
    #[serde(default)]
    pub hart_threads: HartThreads,
}

fn default_memory() -> u64 {
    DEFAULT_MEMORY_BYTES
}

fn default_harts() -> usize {
    1
}

fn default_boot_timeout() -> u64 {
    DEFAULT_BOOT_TIMEOUT_S
}

fn default_stop_timeout() -> u64 {
    DEFAULT_STOP_TIMEOUT_S
}

/// Every field at its default: the default image, booted.
impl Default for VmConfig {
    fn default() -> VmConfig {
        VmConfig {
            image: None,
            persist: false,
            bios: None,
            kernel: None,
            initrd: None,
            append: None,
            memory_bytes: default_memory(),
            harts: default_harts(),
            disks: Vec::new(),
            nets: Vec::new(),
            hostname: None,
            ssh_keys: Vec::new(),
            users: Vec::new(),
            no_rng: false,
            restore: None,
            control: None,
            paused: false,
            exec: None,
            verbose: false,
            exec_timeout_s: None,
            boot_timeout_s: default_boot_timeout(),
            fast_time: false,
            stop_timeout_s: default_stop_timeout(),
            cpu_limit: None,
            dirty_tracking: false,
            hart_threads: HartThreads::default(),
        }
    }
}

/// The M-mode firmware a VM starts from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Firmware {
    /// None: the kernel starts in M-mode itself (`--bios none`).
    None,
    /// This file (OpenSBI's fw_dynamic.bin).
    File(PathBuf),
}

/// Whether a TAP may have this name (Linux's limit on an interface's).
pub fn check_tap_name(name: &str) -> Result<(), String> {
    if name.len() > MAX_TAP_NAME {
        return Err(format!("TAP name '{name}' is longer than {MAX_TAP_NAME} bytes"));
    }
    Ok(())
}

/// Where a VM's harts run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HartThreads {
    /// All on one host thread, in a fixed round-robin.
    Single,
    /// Each on a host thread of its own when nothing needs the run exact.
    #[default]
    Multi,
}

crate::mode::named!(HartThreads, "a place for harts", Single => "single", Multi => "multi");

/// A raw disk image and how the guest sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskConfig {
    pub path: PathBuf,
    /// The guest may not write it.
    #[serde(default)]
    pub readonly: bool,
    /// Every request takes at least this long, in microseconds (a model
    /// of a slower disk than the host's, for benchmarks).
    #[serde(default)]
    pub latency_us: u64,
}

/// An account the guest makes at boot (its seed's `user=`): a home, a
/// group of its own, no password (keys only). The names are checked where
/// the seed is made (`ftvm_image::seed`), as every other seed field.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    /// The login name.
    pub name: String,
    /// Supplementary groups; one the image lacks is skipped by the guest.
    #[serde(default)]
    pub groups: Vec<String>,
    /// Public keys (`authorized_keys` lines) it may log in with.
    #[serde(default)]
    pub ssh_keys: Vec<String>,
}

impl From<&UserConfig> for ftvm_image::seed::SeedUser {
    fn from(u: &UserConfig) -> Self {
        ftvm_image::seed::SeedUser { name: u.name.clone(), groups: u.groups.clone(), ssh_keys: u.ssh_keys.clone() }
    }
}

impl From<ftvm_image::seed::SeedUser> for UserConfig {
    fn from(u: ftvm_image::seed::SeedUser) -> Self {
        UserConfig { name: u.name, groups: u.groups, ssh_keys: u.ssh_keys }
    }
}

/// A NIC on a TAP (made if it does not exist).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetConfig {
    /// The TAP's name.
    pub tap: String,
    /// The guest's MAC, `52:54:00:12:34:56`; default: QEMU's, one more
    /// for each NIC before it.
    #[serde(default)]
    pub mac: Option<MacAddress>,
    /// The bridge to put the TAP on.
    #[serde(default)]
    pub bridge: Option<String>,
}

/// A unicast MAC address, written `52:54:00:12:34:56` (in JSON too).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MacAddress(pub [u8; 6]);

/// Why a MAC address is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MacError {
    #[error("invalid MAC address '{0}' (use six hex bytes like 52:54:00:12:34:56)")]
    Unreadable(String),
    /// No NIC may have a multicast address.
    #[error("MAC address '{0}' is a multicast address; a NIC needs a unicast one")]
    Multicast(String),
}

impl std::str::FromStr for MacAddress {
    type Err = MacError;

    fn from_str(s: &str) -> Result<MacAddress, MacError> {
        let parts: Vec<&str> = s.split(':').collect();
        let bad = || MacError::Unreadable(s.to_string());
        if parts.len() != 6 {
            return Err(bad());
        }
        let mut mac = [0u8; 6];
        for (m, p) in mac.iter_mut().zip(parts) {
            if p.len() != 2 {
                return Err(bad());
            }
            *m = u8::from_str_radix(p, 16).map_err(|_| bad())?;
        }
        if mac[0] & 1 != 0 {
            return Err(MacError::Multicast(s.to_string()));
        }
        Ok(MacAddress(mac))
    }
}

impl std::fmt::Display for MacAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl Serialize for MacAddress {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MacAddress {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<MacAddress, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file names only what differs from `ftvm run`'s defaults; a MAC
    /// is written as people write it; a field it does not know is refused.
    #[test]
    fn a_file_takes_the_defaults_and_reads_back_as_written() {
        let c: VmConfig = serde_json::from_str(r#"{"memory_bytes": 536870912}"#).unwrap();
        assert_eq!(c, VmConfig { memory_bytes: 512 << 20, ..VmConfig::default() });
        let c = VmConfig {
            bios: Some(Firmware::None),
            kernel: Some("/k".into()),
            disks: vec![DiskConfig { path: "/d.img".into(), readonly: true, latency_us: 26_000 }],
            nets: vec![NetConfig { tap: "t0".into(), mac: Some("52:54:00:ab:cd:ef".parse().unwrap()), bridge: None }],
            hart_threads: HartThreads::Single,
            ..VmConfig::default()
        };
        let json = serde_json::to_string(&c).unwrap();
        assert!(json.contains(r#""mac":"52:54:00:ab:cd:ef""#) && json.contains(r#""bios":"none""#), "{json}");
        assert_eq!(serde_json::from_str::<VmConfig>(&json).unwrap(), c);
        assert!(serde_json::from_str::<VmConfig>(r#"{"mem": "1G"}"#).is_err());
        let multicast = r#"{"nets": [{"tap": "t0", "mac": "01:00:5e:00:00:01"}]}"#;
        assert!(serde_json::from_str::<VmConfig>(multicast).unwrap_err().to_string().contains("multicast"));
    }
}
