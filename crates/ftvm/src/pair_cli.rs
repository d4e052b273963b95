//! The command line of a pair's sides (`ftvm ft primary`, `ftvm ft
//! backup`, and `protect` given to `ftvm control`): clap's structs, turned
//! into the API's configurations (`ftvm_api::pair_config`) here, at the
//! edge; the library never sees a command line.

use crate::run_cli::{read_config, ConfigFileError};
use clap::builder::TypedValueParser;
use clap::Args;
use ftvm_api::mode::{DiskSharing, EpochProtocol, Mode};
use ftvm_api::pair_config::{
    host_port, BackupConfig, BackupNic, PairConfig, ProtectConfig, DEFAULT_CONNECT_WAIT_S, DEFAULT_HEARTBEAT_PORT,
    DEFAULT_LAG_THRESHOLD_MS, DEFAULT_TIMEOUT_MS,
};
use ftvm_replication::isolation::DEFAULT_DEFER;
use ftvm_replication::DEFAULT_MIN_TIMEOUT;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;

/// `ftvm control SOCKET protect --help`: the help of `ftvm ft primary`'s
/// pair options, which `protect` takes.
pub fn protect_help() -> String {
    #[derive(clap::Parser)]
    #[command(name = "protect", about = "Give the running VM a backup")]
    struct Protect {
        #[command(flatten)]
        args: PrimaryArgs,
    }
    <Protect as clap::CommandFactory>::command().render_help().to_string()
}

/// A value parser for one of the API's choices: its names as the
/// possible values (`--help` lists them), read by its `FromStr`.
pub(crate) fn choice<T: std::str::FromStr + Clone + Send + Sync + 'static>(
    names: &'static [&'static str],
) -> impl TypedValueParser<Value = T> {
    clap::builder::PossibleValuesParser::new(names.iter().copied())
        .map(|name| name.parse::<T>().unwrap_or_else(|_| unreachable!("{name} is one of the listed names")))
}

/// Options both sides take (also the `protect` request's, as JSON, where
/// each option left out takes its command-line default).
#[derive(Args, Clone, Debug)]
pub struct PairArgs {
    /// The shared storage both hosts reach: holds the arbiter's records
    /// and, unless --disk is given, the VM's disk (disk.img) and the
    /// pair's key. One of --shared and --etcd.
    #[arg(long, value_name = "DIR", required_unless_present = "etcd")]
    pub shared: Option<PathBuf>,
    /// The cluster's etcd as the arbiter instead of a shared directory
    /// (endpoints, comma-separated: http://HOST:PORT,... or https://
    /// with --etcd-credentials); the VM's records go under its --vm-name.
    /// Each host then keeps its own disk (--disk) and the pair's key is
    /// given (--pair-key).
    #[arg(long, value_name = "URLS", conflicts_with = "shared", requires = "vm_name")]
    pub etcd: Option<String>,
    /// The credentials directory (`ftvm cluster issue`) whose ca.pem,
    /// cert.pem and key.pem etcd is spoken to with, over TLS.
    #[arg(long, value_name = "DIR", requires = "etcd")]
    pub etcd_credentials: Option<PathBuf>,
    /// The VM's name in the cluster: its pairs' generations are recorded
    /// under it at the arbiter (with --etcd).
    #[arg(long, value_name = "NAME", requires = "etcd")]
    pub vm_name: Option<String>,
    /// Silence, in milliseconds, after which the other side is declared
    /// failed: the channel's, and the heartbeats' until a shorter timeout
    /// is learned from their arrivals.
    #[arg(long, value_name = "MS", default_value_t = DEFAULT_TIMEOUT_MS)]
    pub timeout: u64,
    /// The shortest heartbeat silence, in milliseconds, declared a failure.
    /// Each side learns its heartbeat timeout from the other's beats: four
    /// times the longest gap between two of them in the last minute, at
    /// least this, at most --timeout (which this may equal, to learn
    /// nothing). Heartbeats go every sixth of it.
    #[arg(long, value_name = "MS", default_value_t = DEFAULT_MIN_TIMEOUT.as_millis() as u64)]
    pub min_timeout: u64,
    /// UDP port of the heartbeats on the backup's logging-channel address
    /// (the primary beats from a port of its own, which the backup
    /// answers once it has heard it).
    #[arg(long, value_name = "PORT", default_value_t = DEFAULT_HEARTBEAT_PORT,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub heartbeat_port: u16,
    /// Append every event of this side's life (protected, failure
    /// declared, arbiter won, going live, ...) to FILE, a JSON object a
    /// line; the control socket's `events` streams them too.
    #[arg(long, value_name = "FILE")]
    pub events: Option<PathBuf>,
    /// The pair's key (`ftvm ft keygen FILE` makes one), which both sides
    /// must hold: it authenticates and encrypts the channel and the
    /// heartbeats. Default: pair.key on the shared storage, made by the
    /// side that comes first.
    #[arg(long, value_name = "FILE")]
    pub pair_key: Option<PathBuf>,
    /// An address this host must reach to count itself on the network
    /// (repeat for more; IPv4). After declaring the other side failed, a
    /// side that reaches none of them may be the one cut off: it leaves
    /// the arbiter to the other side for --isolation-defer ms, so the side
    /// clients can reach wins. Default: this host's default gateway.
    #[arg(long = "isolation-address", value_name = "IP")]
    pub isolation_addresses: Vec<Ipv4Addr>,
    /// How long, in milliseconds, a side that reaches no isolation address
    /// waits for the other side to claim the arbiter before it contends.
    #[arg(long, value_name = "MS", default_value_t = DEFAULT_DEFER.as_millis() as u64)]
    pub isolation_defer: u64,
    /// This host's identity, which the two sides of a pair compare (a
    /// backup on its primary's own host is refused). Default: the
    /// environment's FTVM_HOST_ID, else /etc/machine-id.
    #[arg(long, value_name = "ID")]
    pub host_id: Option<String>,
    /// Contend at the arbiter without checking the isolation addresses.
    #[arg(long, conflicts_with = "isolation_addresses")]
    pub no_isolation_check: bool,
}

/// What `ftvm ft primary` adds to the run options.
#[derive(Args, Clone, Debug)]
pub struct PrimaryArgs {
    /// The backup's logging-channel address (it must be listening): an
    /// IP address or a host name (its first IPv4 address), and a port.
    #[arg(long, value_name = "HOST:PORT", value_parser = host_port)]
    pub backup: SocketAddr,
    /// Execution lag, in milliseconds, past which the primary is slowed
    /// until the backup follows; below it, a lag that stays over 3/40 of it
    /// (75 ms by default) for two seconds trims the primary's CPU share by at
    /// most 10 %.
    #[arg(long, value_name = "MS", default_value_t = DEFAULT_LAG_THRESHOLD_MS)]
    pub lag_threshold: u64,
    /// How long to wait, in seconds, for the backup to accept the channel
    /// and to be ready to follow.
    #[arg(long, value_name = "S", default_value_t = DEFAULT_CONNECT_WAIT_S)]
    pub connect_wait: u64,
    /// shared: one disk on the shared storage, written by the primary
    /// alone under the Output Rule; separate: each host has its own copy
    /// (identical when protection starts, or it is refused) and the backup
    /// performs the writes on its copy (VMware FT §4.1). Default: shared (separate with --etcd, which has no shared storage);
    /// checkpoint mode always uses separate disks (Remus §2.5).
    #[arg(long, value_parser = choice::<DiskSharing>(DiskSharing::NAMES))]
    pub disk_sharing: Option<DiskSharing>,
    /// The backup performs the guest's disk reads itself instead of
    /// receiving their data in the log: less log, a slower backup (§4.2).
    #[arg(long)]
    pub backup_reads: bool,
    /// lockstep: inputs delivered at the instruction they arrive (VMware
    /// FT); epoch: inputs buffered and delivered at the end of each epoch
    /// (Bressoud & Schneider); checkpoint: whole-VM checkpoints (Remus).
    #[arg(long, value_parser = choice::<Mode>(Mode::NAMES), default_value = "lockstep")]
    pub mode: Mode,
    /// With --mode epoch: instructions per epoch [default: 65536].
    // Options of one mode are Options, not defaults: given with another
    // mode they are refused (`check_mode_options`), not silently ignored.
    #[arg(long, value_name = "N")]
    pub epoch_length: Option<u64>,
    /// With --mode epoch: original waits for the backup's acknowledgement
    /// at every epoch end (P2); revised only before an output leaves
    /// (§4.3) [default: revised].
    #[arg(long, value_parser = choice::<EpochProtocol>(EpochProtocol::NAMES))]
    pub epoch_protocol: Option<EpochProtocol>,
    /// With --mode checkpoint: time between checkpoints, in milliseconds
    /// (Remus: 25, i.e. 40 per second) [default: 25].
    #[arg(long, value_name = "MS")]
    pub interval: Option<u64>,
    /// With --mode checkpoint: take checkpoints only on the beat of
    /// --interval, as Remus does. By default a checkpoint is also taken
    /// as soon as the guest idles with frames waiting to leave (at most
    /// one every 2 ms), so a reply does not wait out the interval.
    #[arg(long)]
    pub no_idle_checkpoints: bool,
    #[command(flatten)]
    pub pair: PairArgs,
}

/// `ftvm ft backup`'s options.
#[derive(Args)]
pub struct BackupArgs {
    /// Read the backup's configuration from FILE (JSON,
    /// `ftvm_api::BackupConfig`) instead of these options, as a program
    /// that starts backups gives it.
    #[arg(long, value_name = "FILE", exclusive = true)]
    pub config: Option<PathBuf>,
    /// Where to accept the primary's logging channel: an IP address or a
    /// host name (its first IPv4 address), and a port.
    // An Option only so that `--config` can stand alone.
    #[arg(long, value_name = "HOST:PORT", value_parser = host_port, required = true)]
    pub listen: Option<SocketAddr>,
    /// The TAP for each of the VM's NICs once live, in order:
    /// tap=NAME[,bridge=BR] (the MAC stays the guest's). One is needed per
    /// NIC: the names the primary used are not taken from the wire.
    #[arg(long = "net", value_parser = |s: &str| s.parse::<BackupNic>())]
    pub nets: Vec<BackupNic>,
    /// The control socket: `status` while waiting for the primary and
    /// while following it, every request once live.
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// Show the guest's console output as it is replayed (and once live).
    #[arg(long)]
    pub show_console: bool,
    /// This host's path of each of the VM's disks, in order. With separate
    /// disks each copy must be given; a shared disk not given is the file
    /// of the primary's disk's name on the shared storage.
    #[arg(long = "disk", value_name = "PATH")]
    pub disks: Vec<PathBuf>,
    /// A firmware, kernel, initrd or snapshot file the primary's VM may
    /// start from, taken if its hash is the one the primary recorded
    /// (besides the files of the images this host has built and those of
    /// the same name on the shared storage).
    #[arg(long = "start-file", value_name = "FILE")]
    pub start_files: Vec<PathBuf>,
    /// The old spelling of --start-file, refused with a hint: everywhere
    /// else `--image` is a named image (`ftvm run --image NAME`), and a
    /// backup already takes the files of every image this host has built.
    #[arg(long = "image", value_name = "FILE", hide = true, value_parser = refuse_old_image)]
    pub old_image: Vec<String>,
    /// Hold each acknowledgement this many milliseconds after receipt: a
    /// slow way back, to watch the Output Rule hold the primary's outputs.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub ack_delay: u64,
    #[command(flatten)]
    pub pair: PairArgs,
}

/// `--image FILE`, refused while the command line is parsed (a usage
/// error, exit status 2), with the option to use instead.
fn refuse_old_image(_: &str) -> Result<String, String> {
    Err("--image is a named image elsewhere and a backup takes every image this host has built; \
         give a firmware, kernel, initrd or snapshot file with --start-file FILE"
        .to_string())
}

impl From<PairArgs> for PairConfig {
    fn from(a: PairArgs) -> PairConfig {
        PairConfig {
            shared: a.shared,
            etcd: a.etcd,
            etcd_credentials: a.etcd_credentials,
            vm_name: a.vm_name,
            timeout: a.timeout,
            min_timeout: a.min_timeout,
            heartbeat_port: a.heartbeat_port,
            events: a.events,
            pair_key: a.pair_key,
            isolation_addresses: a.isolation_addresses,
            isolation_defer: a.isolation_defer,
            host_id: a.host_id,
            no_isolation_check: a.no_isolation_check,
        }
    }
}

impl From<PrimaryArgs> for ProtectConfig {
    fn from(a: PrimaryArgs) -> ProtectConfig {
        ProtectConfig {
            backup: a.backup,
            lag_threshold: a.lag_threshold,
            connect_wait: a.connect_wait,
            disk_sharing: a.disk_sharing,
            backup_reads: a.backup_reads,
            mode: a.mode,
            epoch_length: a.epoch_length,
            epoch_protocol: a.epoch_protocol,
            interval: a.interval,
            no_idle_checkpoints: a.no_idle_checkpoints,
            pair: a.pair.into(),
        }
    }
}

impl TryFrom<BackupArgs> for BackupConfig {
    type Error = ConfigFileError;

    fn try_from(a: BackupArgs) -> Result<BackupConfig, ConfigFileError> {
        if let Some(path) = &a.config {
            return read_config(path);
        }
        Ok(BackupConfig {
            listen: a.listen.expect("clap requires --listen without --config"),
            nets: a.nets,
            control: a.control,
            show_console: a.show_console,
            disks: a.disks,
            start_files: a.start_files,
            ack_delay: a.ack_delay,
            pair: a.pair.into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The agent started its backups with these options; it now writes
    /// their configuration to a file: the same backup either way.
    #[test]
    fn the_agents_backup_configuration_is_the_one_its_old_options_made() {
        use ftvm_cluster::agent::vms::{backup_config, tap_name};
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            backup: BackupArgs,
        }
        let spec = r#"{"name": "redis", "network": {"bridge": "br0", "ip": "10.0.0.5/24"}}"#;
        let spec: ftvm_cluster::model::VmSpec = serde_json::from_str(spec).unwrap();
        let dir = std::path::Path::new("/srv/ftvm/vms/redis");
        let (etcd, credentials, key) = ("https://10.0.0.1:2379", "/srv/ftvm/credentials", "/srv/ftvm/keys/redis.key");
        let net = format!("tap={},bridge=br0", tap_name("redis"));
        let options = [
            "backup",
            "--listen",
            "10.0.0.2:7700",
            "--heartbeat-port",
            "7788",
            "--etcd",
            etcd,
            "--etcd-credentials",
            credentials,
            "--vm-name",
            "redis",
            "--pair-key",
            key,
            "--disk",
            "/srv/ftvm/vms/redis/disk.img",
            "--control",
            "/srv/ftvm/vms/redis/control.sock",
            "--events",
            "/srv/ftvm/vms/redis/events.jsonl",
            "--net",
            &net,
        ];
        let from_options = BackupConfig::try_from(<Cli as clap::Parser>::parse_from(options).backup).unwrap();
        let listen = "10.0.0.2:7700".parse().unwrap();
        let written = backup_config(&spec, dir, listen, 7788, etcd, credentials.as_ref(), key.as_ref());
        assert_eq!(from_options, written);
    }
}
