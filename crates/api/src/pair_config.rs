//! The configuration of a pair's sides as serde types: what both sides
//! take ([`PairConfig`]) and what the primary adds ([`ProtectConfig`]),
//! whether it comes from the command line (`ftvm ft primary`, turned into
//! these at its edge), a configuration file, or the control socket's
//! `protect`. Nothing here parses a command line or touches a host: the
//! host side (`ftvm_vmm::ft`) makes a key, an arbiter and a journal of
//! them.

use crate::mode::{DiskSharing, EpochProtocol, Mode};
use ftvm_replication::isolation::DEFAULT_DEFER;
use ftvm_replication::DEFAULT_MIN_TIMEOUT;
use serde::{Deserialize, Serialize};
use std::net::{Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

// The defaults of the options that have one, for the command line and
// for a typed `protect` request alike: a request that leaves an option out
// gets what the command line would give, so a client written before an
// option existed still works (serde leaves out only `Option`s by itself).
pub const DEFAULT_TIMEOUT_MS: u64 = 500;
pub const DEFAULT_HEARTBEAT_PORT: u16 = 7701;
pub const DEFAULT_LAG_THRESHOLD_MS: u64 = 1000;
pub const DEFAULT_CONNECT_WAIT_S: u64 = 60;

fn default_timeout() -> u64 {
    DEFAULT_TIMEOUT_MS
}

fn default_min_timeout() -> u64 {
    DEFAULT_MIN_TIMEOUT.as_millis() as u64
}

fn default_heartbeat_port() -> u16 {
    DEFAULT_HEARTBEAT_PORT
}

fn default_isolation_defer() -> u64 {
    DEFAULT_DEFER.as_millis() as u64
}

fn default_lag_threshold() -> u64 {
    DEFAULT_LAG_THRESHOLD_MS
}

fn default_connect_wait() -> u64 {
    DEFAULT_CONNECT_WAIT_S
}

fn default_mode() -> Mode {
    Mode::Lockstep
}

/// Options both sides take (also the `protect` request's, as JSON, where
/// each option left out takes its command-line default).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairConfig {
    /// The shared storage both hosts reach: holds the arbiter's records
    /// and, unless --disk is given, the VM's disk (disk.img) and the
    /// pair's key. One of --shared and --etcd.
    pub shared: Option<PathBuf>,
    /// The cluster's etcd as the arbiter instead of a shared directory
    /// (endpoints, comma-separated: http://HOST:PORT,... or https://
    /// with --etcd-credentials); the VM's records go under its --vm-name.
    /// Each host then keeps its own disk (--disk) and the pair's key is
    /// given (--pair-key).
    pub etcd: Option<String>,
    /// The credentials directory (`ftvm cluster issue`) whose ca.pem,
    /// cert.pem and key.pem etcd is spoken to with, over TLS.
    pub etcd_credentials: Option<PathBuf>,
    /// The VM's name in the cluster: its pairs' generations are recorded
    /// under it at the arbiter (with --etcd).
    pub vm_name: Option<String>,
    /// Silence, in milliseconds, after which the other side is declared
    /// failed: the channel's, and the heartbeats' until a shorter timeout
    /// is learned from their arrivals.
    #[serde(default = "default_timeout")]
    pub timeout: u64,
    /// The shortest heartbeat silence, in milliseconds, declared a failure.
    /// Each side learns its heartbeat timeout from the other's beats: four
    /// times the longest gap between two of them in the last minute, at
    /// least this, at most --timeout (which this may equal, to learn
    /// nothing). Heartbeats go every sixth of it.
    #[serde(default = "default_min_timeout")]
    pub min_timeout: u64,
    /// UDP port of the heartbeats on the backup's logging-channel address
    /// (the primary beats from a port of its own, which the backup
    /// answers once it has heard it).
    #[serde(default = "default_heartbeat_port")]
    pub heartbeat_port: u16,
    /// Append every event of this side's life (protected, failure
    /// declared, arbiter won, going live, ...) to FILE, a JSON object a
    /// line; the control socket's `events` streams them too.
    pub events: Option<PathBuf>,
    /// The pair's key (`ftvm ft keygen FILE` makes one), which both sides
    /// must hold: it authenticates and encrypts the channel and the
    /// heartbeats. Default: pair.key on the shared storage, made by the
    /// side that comes first.
    pub pair_key: Option<PathBuf>,
    /// An address this host must reach to count itself on the network
    /// (repeat for more; IPv4). After declaring the other side failed, a
    /// side that reaches none of them may be the one cut off: it leaves
    /// the arbiter to the other side for --isolation-defer ms, so the side
    /// clients can reach wins. Default: this host's default gateway.
    #[serde(default)]
    pub isolation_addresses: Vec<Ipv4Addr>,
    /// How long, in milliseconds, a side that reaches no isolation address
    /// waits for the other side to claim the arbiter before it contends.
    #[serde(default = "default_isolation_defer")]
    pub isolation_defer: u64,
    /// This host's identity, which the two sides of a pair compare (a
    /// backup on its primary's own host is refused). Default: the
    /// environment's FTVM_HOST_ID, else /etc/machine-id.
    pub host_id: Option<String>,
    /// Contend at the arbiter without checking the isolation addresses.
    #[serde(default)]
    pub no_isolation_check: bool,
}

/// A pair's primary side: what `ftvm ft primary` adds to a VM's
/// configuration, and what the control socket's `protect` gives a running
/// VM (each option left out takes its command-line default).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProtectConfig {
    /// The backup's logging-channel address (it must be listening): an
    /// IP address or a host name (its first IPv4 address), and a port.
    pub backup: SocketAddr,
    /// Execution lag, in milliseconds, past which the primary is slowed
    /// until the backup follows; below it, a lag that stays over 3/40 of it
    /// (75 ms by default) for two seconds trims the primary's CPU share by at
    /// most 10 %.
    #[serde(default = "default_lag_threshold")]
    pub lag_threshold: u64,
    /// How long to wait, in seconds, for the backup to accept the channel
    /// and to be ready to follow.
    #[serde(default = "default_connect_wait")]
    pub connect_wait: u64,
    /// shared: one disk on the shared storage, written by the primary
    /// alone under the Output Rule; separate: each host has its own copy
    /// (identical when protection starts, or it is refused) and the backup
    /// performs the writes on its copy (VMware FT §4.1). Default: shared (separate with --etcd, which has no shared storage);
    /// checkpoint mode always uses separate disks (Remus §2.5).
    pub disk_sharing: Option<DiskSharing>,
    /// The backup performs the guest's disk reads itself instead of
    /// receiving their data in the log: less log, a slower backup (§4.2).
    #[serde(default)]
    pub backup_reads: bool,
    /// lockstep: inputs delivered at the instruction they arrive (VMware
    /// FT); epoch: inputs buffered and delivered at the end of each epoch
    /// (Bressoud & Schneider); checkpoint: whole-VM checkpoints (Remus).
    #[serde(default = "default_mode")]
    pub mode: Mode,
    /// With --mode epoch: instructions per epoch [default: 65536].
    // Options of one mode are Options, not defaults: given with another
    // mode they are refused (`check_mode_options`), not silently ignored.
    pub epoch_length: Option<u64>,
    /// With --mode epoch: original waits for the backup's acknowledgement
    /// at every epoch end (P2); revised only before an output leaves
    /// (§4.3) [default: revised].
    pub epoch_protocol: Option<EpochProtocol>,
    /// With --mode checkpoint: time between checkpoints, in milliseconds
    /// (Remus: 25, i.e. 40 per second) [default: 25].
    pub interval: Option<u64>,
    /// With --mode checkpoint: take checkpoints only on the beat of
    /// --interval, as Remus does. By default a checkpoint is also taken
    /// as soon as the guest idles with frames waiting to leave (at most
    /// one every 2 ms), so a reply does not wait out the interval.
    #[serde(default)]
    pub no_idle_checkpoints: bool,
    /// What both sides take.
    pub pair: PairConfig,
}

/// Instructions per epoch when `--epoch-length` is not given.
pub const DEFAULT_EPOCH_LENGTH: u64 = 65536;
/// Milliseconds between checkpoints when `--interval` is not given.
pub const DEFAULT_INTERVAL_MS: u64 = 25;

/// An option of one mode given with another, where it would do nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{option} is for --mode {needs} (this pair's mode is {mode})")]
pub struct ModeOptionError {
    /// The option as written on the command line.
    pub option: &'static str,
    /// The mode it belongs to.
    pub needs: &'static str,
    /// The mode given (or the default).
    pub mode: &'static str,
}

/// Every option at its command-line default, no storage named: what a
/// client that builds a configuration fills in (`..PairConfig::default()`).
impl Default for PairConfig {
    fn default() -> PairConfig {
        PairConfig {
            shared: None,
            etcd: None,
            etcd_credentials: None,
            vm_name: None,
            timeout: default_timeout(),
            min_timeout: default_min_timeout(),
            heartbeat_port: default_heartbeat_port(),
            events: None,
            pair_key: None,
            isolation_addresses: Vec::new(),
            isolation_defer: default_isolation_defer(),
            host_id: None,
            no_isolation_check: false,
        }
    }
}

impl ProtectConfig {
    /// A primary toward `backup`, on `pair`, every other option at its
    /// command-line default (lockstep mode).
    pub fn new(backup: SocketAddr, pair: PairConfig) -> ProtectConfig {
        ProtectConfig {
            backup,
            lag_threshold: default_lag_threshold(),
            connect_wait: default_connect_wait(),
            disk_sharing: None,
            backup_reads: false,
            mode: default_mode(),
            epoch_length: None,
            epoch_protocol: None,
            interval: None,
            no_idle_checkpoints: false,
            pair,
        }
    }

    /// Refuses an epoch-only or checkpoint-only option given without its
    /// mode: it would be ignored, and the pair run otherwise than asked.
    pub fn check_mode_options(&self) -> Result<(), ModeOptionError> {
        let given = [
            ("--epoch-length", Mode::Epoch, self.epoch_length.is_some()),
            ("--epoch-protocol", Mode::Epoch, self.epoch_protocol.is_some()),
            ("--interval", Mode::Checkpoint, self.interval.is_some()),
            ("--no-idle-checkpoints", Mode::Checkpoint, self.no_idle_checkpoints),
        ];
        match given.into_iter().find(|&(_, needs, present)| present && needs != self.mode) {
            Some((option, needs, _)) => Err(ModeOptionError { option, needs: needs.name(), mode: self.mode.name() }),
            None => Ok(()),
        }
    }
}

/// Why a HOST:PORT option's value is refused.
#[derive(Debug, thiserror::Error)]
pub enum AddressError {
    #[error("expected HOST:PORT (an IP address or a host name, and a port)")]
    NoPort,
    #[error("'{0}' is not a port number (1 to 65535)")]
    BadPort(String),
    /// Port 0 would listen on, or connect to, a port picked at random.
    #[error("port 0 is no port to listen on or connect to: give the port (1 to 65535)")]
    PortZero,
    #[error("cannot resolve host '{host}': {source}")]
    Resolve {
        host: String,
        #[source]
        source: std::io::Error,
    },
    #[error("host '{host}' has no IPv4 address (it resolves to {found})")]
    NoIpv4 { host: String, found: String },
}

/// The value parser of every HOST:PORT option: an IP address and a port
/// (`10.0.0.2:7700`, `[fe80::1]:7700`), or a host name and a port
/// (`backup-host:7700`), taken as the first IPv4 address the name
/// resolves to (the heartbeats and isolation checks are IPv4). Port 0 is
/// refused.
pub fn host_port(s: &str) -> Result<SocketAddr, AddressError> {
    let addr = match s.parse::<SocketAddr>() {
        Ok(addr) => addr,
        Err(_) => {
            let (host, port) = s.rsplit_once(':').ok_or(AddressError::NoPort)?;
            if host.is_empty() {
                return Err(AddressError::NoPort);
            }
            let port: u16 = port.parse().map_err(|_| AddressError::BadPort(port.to_string()))?;
            if port == 0 {
                return Err(AddressError::PortZero);
            }
            let found: Vec<SocketAddr> = (host, port)
                .to_socket_addrs()
                .map_err(|source| AddressError::Resolve { host: host.to_string(), source })?
                .collect();
            let first_v4 = found.iter().find(|a| a.is_ipv4()).copied();
            first_v4.ok_or_else(|| {
                let found: Vec<String> = found.iter().map(|a| a.ip().to_string()).collect();
                AddressError::NoIpv4 { host: host.to_string(), found: found.join(", ") }
            })?
        }
    };
    if addr.port() == 0 {
        return Err(AddressError::PortZero);
    }
    Ok(addr)
}

/// A pair's backup side: what `ftvm ft backup` takes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackupConfig {
    /// Where to accept the primary's logging channel.
    pub listen: SocketAddr,
    /// The TAP for each of the VM's NICs once live, in order (the MAC
    /// stays the guest's): the names the primary used are not taken from
    /// the wire.
    #[serde(default)]
    pub nets: Vec<BackupNic>,
    /// The control socket: `status` while waiting for the primary and
    /// while following it, every request once live.
    pub control: Option<PathBuf>,
    /// Show the guest's console output as it is replayed (and once live).
    #[serde(default)]
    pub show_console: bool,
    /// This host's path of each of the VM's disks, in order. With separate
    /// disks each copy must be given; a shared disk not given is the file
    /// of the primary's disk's name on the shared storage.
    #[serde(default)]
    pub disks: Vec<PathBuf>,
    /// Firmware, kernel, initrd or snapshot files the primary's VM may
    /// start from, taken if their hash is the one the primary recorded.
    #[serde(default)]
    pub start_files: Vec<PathBuf>,
    /// Hold each acknowledgement this many milliseconds after receipt.
    #[serde(default)]
    pub ack_delay: u64,
    /// What both sides take.
    pub pair: PairConfig,
}

/// A backup's NIC on this host: its TAP, and the bridge to put it on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackupNic {
    pub tap: String,
    #[serde(default)]
    pub bridge: Option<String>,
}

impl std::str::FromStr for BackupNic {
    type Err = String;

    /// `tap=NAME[,bridge=BR]`, as `--net` writes it.
    fn from_str(s: &str) -> Result<BackupNic, String> {
        let (mut tap, mut bridge) = (None, None);
        for opt in s.split(',') {
            match opt.split_once('=') {
                Some(("tap", v)) if !v.is_empty() => tap = Some(v.to_string()),
                Some(("bridge", v)) if !v.is_empty() => bridge = Some(v.to_string()),
                _ => return Err(format!("invalid --net option '{opt}' (use tap=NAME[,bridge=BR])")),
            }
        }
        let tap = tap.ok_or_else(|| format!("--net {s} names no TAP (use tap=NAME)"))?;
        Ok(BackupNic { tap, bridge })
    }
}
