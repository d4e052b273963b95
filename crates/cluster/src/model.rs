//! The cluster's typed data: what a host's agent records in etcd, what a
//! VM is to be (its spec), what the agents' HTTP API takes and answers,
//! and its errors. The agent, the `ftvm cluster` command line and the
//! tests speak these; the JSON is their serde form (docs/api/openapi.json
//! describes it).

use ftvm_api::vm_config::UserConfig;
use ftvm_api::{BackupMode, Mode, PairStatus, VmStatus};
use serde::{Deserialize, Serialize};

/// A host, as its agent records it in etcd (under a lease: it disappears
/// when the agent stops renewing it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostRecord {
    /// The host's identity in the cluster (unique; `--host-id`).
    pub id: String,
    /// Its agent's API, `https://IP:PORT` (nothing else is called).
    pub api: String,
    /// Its address on the cluster's network: backups on it listen there.
    pub address: String,
    /// CPUs.
    pub cores: u32,
    /// Memory (RAM and swap), bytes.
    pub memory_bytes: u64,
    /// Memory not yet promised to a VM of this host, bytes.
    pub free_memory_bytes: u64,
    /// The VMs it runs, and their part.
    pub vms: Vec<HostVm>,
    /// The agent's version.
    pub version: String,
    /// The guest images it can boot a VM from (`ftvm agent --images`),
    /// by name: a VM is started only on a host that has its image (a
    /// backup needs none: protection copies the disk and finds the boot
    /// files by hash).
    #[serde(default)]
    pub images: Vec<HostImage>,
}

/// A guest image a host has, as its record lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostImage {
    /// Its name (`ftvm image list`).
    pub name: String,
    /// Its root disk's size, bytes: a VM's disk is at least that.
    pub disk_bytes: u64,
}

impl HostRecord {
    /// This host's image called `name`, if it has it.
    pub fn image(&self, name: &str) -> Option<&HostImage> {
        self.images.iter().find(|i| i.name == name)
    }
}

/// A VM on a host, by name, with its part there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostVm {
    pub name: String,
    pub role: Role,
    /// The protection its spec wants (a mode), if any.
    #[serde(default)]
    pub protect: Option<Mode>,
    /// Its memory, MiB.
    #[serde(default)]
    pub memory_mib: u64,
}

/// What a VM's process on a host is to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// It runs the VM, with no backup.
    Unprotected,
    /// It runs the VM, and a backup follows it.
    Primary,
    /// It follows the VM's primary (or waits for it).
    Backup,
    /// Its process started and has not answered yet.
    Starting,
    /// Its process has ended.
    Ended,
}

impl Role {
    /// The word a person reads and metrics label with.
    pub fn word(self) -> &'static str {
        match self {
            Role::Unprotected => "unprotected",
            Role::Primary => "primary",
            Role::Backup => "backup",
            Role::Starting => "starting",
            Role::Ended => "ended",
        }
    }

    /// The part a status says a process has.
    pub fn of(status: &VmStatus) -> Role {
        use ftvm_api::{PairStatus, RunState};
        match (&status.state, &status.pair) {
            (RunState::Waiting { .. } | RunState::Replaying | RunState::Following | RunState::TakingOver, _) => {
                Role::Backup
            }
            (_, Some(PairStatus::Primary(_))) => Role::Primary,
            (_, Some(PairStatus::Backup(_))) => Role::Backup,
            _ => Role::Unprotected,
        }
    }
}

/// What a VM is to be: given when it is created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmSpec {
    /// Its name in the cluster: 1 to 64 of `A-Z a-z 0-9 . _ -`.
    pub name: String,
    /// Guest memory, MiB.
    #[serde(default = "VmSpec::default_memory")]
    pub memory_mib: u64,
    /// Harts.
    #[serde(default = "VmSpec::default_cpus")]
    pub cpus: u32,
    /// The command the guest runs (`/bin/sh -c`) once booted; the VM
    /// ends when it does. None: the guest boots to its init and stays.
    #[serde(default)]
    pub command: Option<String>,
    /// Its NIC, if it has one.
    #[serde(default)]
    pub network: Option<NetworkSpec>,
    /// The protection wanted: checkpoint (the one mode that protects a
    /// running VM on each host's own disk). The
    /// cluster's controller keeps the VM protected so, on another host,
    /// and protects it again after a failover. None: left unprotected.
    #[serde(default)]
    pub protect: Option<Mode>,
    /// The guest image it boots (`ftvm image list` on the hosts; the
    /// hosts' records list theirs). None: the default image.
    #[serde(default)]
    pub image: Option<String>,
    /// Its root disk's size, MiB, if larger than the image's: the copy of
    /// the image's disk is grown, and its filesystem with it, before the
    /// VM first boots. None: the image's size.
    #[serde(default)]
    pub disk_mib: Option<u64>,
    /// Public keys root may log in with over ssh (`authorized_keys`
    /// lines), in the VM's seed.
    #[serde(default)]
    pub ssh_keys: Vec<String>,
    /// Accounts the guest makes at its first boot, in its seed.
    #[serde(default)]
    pub users: Vec<UserConfig>,
}

impl VmSpec {
    /// The image it boots, by name.
    pub fn image_name(&self) -> &str {
        self.image.as_deref().unwrap_or(ftvm_image::IMAGE_NAME)
    }

    fn default_memory() -> u64 {
        512
    }

    fn default_cpus() -> u32 {
        1
    }

    /// Whether the spec can be run: Err says why in one line.
    pub fn check(&self) -> Result<(), ApiError> {
        let bad = |m: String| Err(ApiError::BadRequest(m));
        check_vm_name(&self.name)?;
        if !(16..=65536).contains(&self.memory_mib) {
            return bad(format!("memory_mib {} is out of range (16 to 65536)", self.memory_mib));
        }
        if !(1..=8).contains(&self.cpus) {
            return bad(format!("cpus {} is out of range (1 to 8)", self.cpus));
        }
        if let Some(image) = &self.image {
            ftvm_image::check_name(image).map_err(|e| ApiError::BadRequest(format!("image: {}", e.cause)))?;
        }
        if let Some(mib) = self.disk_mib {
            if !DISK_MIB.contains(&mib) {
                return bad(format!("disk_mib {mib} is out of range ({} to {})", DISK_MIB.start(), DISK_MIB.end()));
            }
        }
        self.check_seed()?;
        if let Some(net) = &self.network {
            if !valid_interface_name(&net.bridge) {
                return bad(format!(
                    "{:?} is not a bridge's name (1 to 15 of A-Z a-z 0-9 . _ -, not starting with -)",
                    net.bridge
                ));
            }
            let (ip, len) = net.ip.split_once('/').unwrap_or((&net.ip, ""));
            if ip.parse::<std::net::Ipv4Addr>().is_err() || len.parse::<u8>().map_or(true, |l| l > 32) {
                return bad(format!("network ip {:?} is not IPv4/LEN", net.ip));
            }
        }
        Ok(())
    }

    /// The seed's part of the spec (root's keys, the accounts) checked as
    /// `ftvm run`'s are ([`ftvm_image::seed::Seed::new`]: a key of one
    /// line, adduser's names, root and a name twice refused), and bounded:
    /// a spec is kept in etcd and sent to the guest in its device tree.
    fn check_seed(&self) -> Result<(), ApiError> {
        let keys = self.ssh_keys.len() + self.users.iter().map(|u| u.ssh_keys.len()).sum::<usize>();
        let longest = self.ssh_keys.iter().chain(self.users.iter().flat_map(|u| &u.ssh_keys)).map(String::len).max();
        if keys > SEED_KEYS || self.users.len() > SEED_USERS || longest.unwrap_or(0) > SEED_KEY_BYTES {
            return Err(ApiError::BadRequest(format!(
                "the seed may hold {SEED_USERS} users and {SEED_KEYS} keys of {SEED_KEY_BYTES} bytes at most"
            )));
        }
        let users = self.users.iter().map(Into::into).collect();
        ftvm_image::seed::Seed::new(None, self.ssh_keys.clone(), users)
            .map(drop)
            .map_err(|e| ApiError::BadRequest(format!("seed: {}", e.cause)))
    }
}

/// At most so many accounts, public keys (root's and the accounts'
/// together) and bytes a key in a spec's seed.
pub const SEED_USERS: usize = 32;
pub const SEED_KEYS: usize = 64;
pub const SEED_KEY_BYTES: usize = 16 << 10;

/// The root disk sizes a spec may ask for, MiB: from the smallest a
/// Debian system fits in to 16 TiB (ext4's limit with 4 KiB blocks).
pub const DISK_MIB: std::ops::RangeInclusive<u64> = 256..=(16 << 20);

/// A VM name from a request (a spec, a URL's path): 400 in one line if it
/// is not one ([`ftvm_etcd::arbiter::valid_vm_name`], the one grammar).
/// Checked before anything (a key, a file, a process) is made from it.
pub fn check_vm_name(name: &str) -> Result<(), ApiError> {
    if ftvm_etcd::arbiter::valid_vm_name(name) {
        return Ok(());
    }
    Err(ApiError::BadRequest(format!(
        "{:?} is not a VM name (1 to 64 of A-Z a-z 0-9 . _ -, not starting with -)",
        name.chars().take(80).collect::<String>()
    )))
}

/// Whether `name` can name a Linux network interface (a bridge) and pass
/// as one argument of a command line: 1 to 15 (IFNAMSIZ - 1) of
/// `[A-Za-z0-9._-]`, not starting with `-`, not `.` or `..`. Stricter than
/// the kernel (which takes any byte but `/`, `:`, NUL and whitespace), so
/// that no shell or option parser reads anything into it (issue 68: `b;id`
/// and `b$(touch)` were accepted and failed later at the TAP).
pub fn valid_interface_name(name: &str) -> bool {
    (1..=15).contains(&name.len())
        && !name.starts_with('-')
        && name != "."
        && name != ".."
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A VM's NIC: a TAP the agent makes on the host's bridge, and the
/// guest's address on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkSpec {
    /// The host's bridge the VM's TAP joins.
    pub bridge: String,
    /// The guest's address, IPv4/LEN (the guest's init sets it).
    pub ip: String,
}

/// A VM as an agent's API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmInfo {
    pub name: String,
    /// The host whose agent answers.
    pub host: String,
    pub spec: VmSpec,
    pub role: Role,
    /// Its process.
    pub pid: Option<u32>,
    /// Its control socket on the host.
    pub control: String,
    /// What its control socket answered (None: it did not).
    pub status: Option<VmStatus>,
    /// How its process ended, once it has.
    pub ended: Option<String>,
}

impl VmInfo {
    /// Its pair's mode as its status says ("none": not in a pair).
    pub fn mode(&self) -> String {
        match self.status.as_ref().and_then(|s| s.pair.as_ref()) {
            Some(PairStatus::Primary(p)) => p.mode.name().to_string(),
            Some(PairStatus::Backup(b)) => match b.mode {
                BackupMode::Lockstep { .. } => "lockstep",
                BackupMode::Epoch { .. } => "epoch",
                BackupMode::Checkpoint { .. } => "checkpoint",
            }
            .to_string(),
            _ => "none".into(),
        }
    }
}

/// Give a VM of this host a backup: `ftvm ft primary`'s pair on the
/// cluster's etcd.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProtectRequest {
    /// The backup's logging-channel address, `IP:PORT` (from the backup
    /// host's agent: [`BackupStarted`]).
    pub backup: String,
    /// lockstep, epoch or checkpoint.
    #[serde(default = "ProtectRequest::default_mode")]
    pub mode: Mode,
    /// The UDP port of the backup's heartbeats (from [`BackupStarted`]);
    /// none: ftvm's default, 7701.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_port: Option<u16>,
}

impl ProtectRequest {
    fn default_mode() -> Mode {
        Mode::Lockstep
    }

    /// The backup's address, if the request is one to act on: a socket
    /// address, else 400 in one line (the mode is one of the three, or
    /// the body did not parse). The agent builds the VM's typed request
    /// from what this returns, so no field reaches a parser (issue 68: a
    /// backup `"IP:PORT --events /tmp/x"` made the VM write /tmp/x).
    pub fn check(&self) -> Result<std::net::SocketAddr, ApiError> {
        let bad = |m: String| ApiError::BadRequest(m);
        // Port 0 would connect to a port picked at random.
        if self.heartbeat_port == Some(0) {
            return Err(bad("heartbeat_port 0 is no port: give the port (1 to 65535)".into()));
        }
        self.backup
            .parse()
            .ok()
            .filter(|a: &std::net::SocketAddr| a.port() != 0)
            .ok_or_else(|| bad(format!("backup {:?} is not an address (IP:PORT, the port not 0)", self.backup)))
    }
}

/// Start a backup of a VM on this host, waiting for its primary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackupRequest {
    /// The VM's spec (its primary's).
    pub spec: VmSpec,
}

/// A backup started: where its primary connects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupStarted {
    /// `IP:PORT` of its logging channel.
    pub listen: String,
    /// The UDP port of its heartbeats, on the same address: a port of its
    /// own, so that a host can hold the backups of several VMs.
    pub heartbeat_port: u16,
}

/// What a request did, when it is no VM's view.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Done {
    /// What the VM's process answered, in its words.
    pub message: String,
}

/// Why the API refused a request: the HTTP status says the kind, the body
/// is this, as JSON (`{"error": "not_found", "message": "..."}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "error", content = "message", rename_all = "snake_case")]
pub enum ApiError {
    /// 400: the request is malformed or asks for the impossible.
    #[error("{0}")]
    BadRequest(String),
    /// 401: no token, or the wrong one.
    #[error("{0}")]
    Unauthorized(String),
    /// 404: no such VM on this host.
    #[error("{0}")]
    NotFound(String),
    /// 409: it exists already, or is not in a state for this.
    #[error("{0}")]
    Conflict(String),
    /// 422: the VM's process refused (its control API's error).
    #[error("{0}")]
    Refused(String),
    /// 503: the VM's process, or etcd, does not answer.
    #[error("{0}")]
    Unavailable(String),
    /// 500: the agent failed (a file it could not write, a process it
    /// could not start).
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    /// The HTTP status of this error.
    pub fn http_status(&self) -> u16 {
        match self {
            ApiError::BadRequest(_) => 400,
            ApiError::Unauthorized(_) => 401,
            ApiError::NotFound(_) => 404,
            ApiError::Conflict(_) => 409,
            ApiError::Refused(_) => 422,
            ApiError::Unavailable(_) => 503,
            ApiError::Internal(_) => 500,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: &str) -> Result<VmSpec, String> {
        let s: VmSpec = serde_json::from_str(json).map_err(|e| e.to_string())?;
        s.check().map_err(|e| e.to_string())?;
        Ok(s)
    }

    #[test]
    fn a_spec_takes_defaults_and_refuses_in_one_line() {
        let s = spec(r#"{"name": "redis-1"}"#).unwrap();
        assert_eq!((s.memory_mib, s.cpus, s.command, s.network, s.protect), (512, 1, None, None, None));
        for bad in [
            r#"{"name": "a/b"}"#,
            r#"{"name": ""}"#,
            r#"{"name": "x", "memory_mib": 1}"#,
            r#"{"name": "x", "cpus": 0}"#,
            r#"{"name": "x", "protect": "mirror"}"#,
            r#"{"name": "x", "colour": "red"}"#,
            r#"{"name": "x", "network": {"bridge": "br0", "ip": "10.0.0.300/24"}}"#,
            r#"{"name": "x", "network": {"bridge": "br0,x", "ip": "10.0.0.3/24"}}"#,
            r#"{"name": "-ci"}"#,
            r#"{"name": "../../victim"}"#,
            r#"{"name": "x", "network": {"bridge": "b;id", "ip": "10.0.0.3/24"}}"#,
            r#"{"name": "x", "network": {"bridge": "b$(touch)", "ip": "10.0.0.3/24"}}"#,
            r#"{"name": "x", "network": {"bridge": "-br", "ip": "10.0.0.3/24"}}"#,
            r#"{"name": "x", "network": {"bridge": "bridge-name-too-long", "ip": "10.0.0.3/24"}}"#,
        ] {
            let e = spec(bad).unwrap_err();
            assert!(!e.contains('\n'), "{e}");
        }
    }

    /// A spec's seed is checked as `ftvm run --user/--ssh-key`'s, and
    /// bounded: nothing that could be a line of the seed of its own, an
    /// option of `useradd` or root.
    #[test]
    fn a_specs_seed_takes_accounts_and_keys_and_refuses_what_the_guest_must_not_see() {
        let key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE1 alice@host";
        let s = spec(&format!(
            r#"{{"name": "db", "ssh_keys": ["{key}"], "users": [{{"name": "alice", "groups": ["sudo"], "ssh_keys": ["{key}"]}}]}}"#
        ))
        .unwrap();
        assert_eq!(s.users[0].groups, ["sudo"]);
        assert_eq!(s.ssh_keys, [key]);
        let long = format!("ssh-ed25519 {}", "A".repeat(SEED_KEY_BYTES));
        let many: Vec<String> = (0..=SEED_USERS).map(|i| format!(r#"{{"name": "u{i}"}}"#)).collect();
        for bad in [
            r#"{"name": "x", "users": [{"name": "root"}]}"#.to_string(),
            r#"{"name": "x", "users": [{"name": "Alice"}]}"#.into(),
            r#"{"name": "x", "users": [{"name": "-o"}]}"#.into(),
            r#"{"name": "x", "users": [{"name": "a"}, {"name": "a"}]}"#.into(),
            r#"{"name": "x", "users": [{"name": "a", "groups": ["wheel;id"]}]}"#.into(),
            r#"{"name": "x", "users": [{"name": "a", "shell": "/bin/sh"}]}"#.into(),
            r#"{"name": "x", "ssh_keys": ["not a key"]}"#.into(),
            format!(r#"{{"name": "x", "ssh_keys": ["{key}\nuser=mallory"]}}"#),
            format!(r#"{{"name": "x", "ssh_keys": ["{long}"]}}"#),
            format!(r#"{{"name": "x", "users": [{}]}}"#, many.join(",")),
        ] {
            let e = spec(&bad).unwrap_err();
            assert!(!e.contains('\n'), "{e}");
        }
    }

    /// Issue 68: a protect request's fields are values, never options.
    #[test]
    fn a_protect_request_takes_an_address_and_a_mode_only() {
        // As the API reads a body: the mode is a `Mode`, so a mode with
        // more in it is refused as the body is read.
        let req = |backup: &str, mode: &str| {
            let body = serde_json::json!({ "backup": backup, "mode": mode });
            serde_json::from_value::<ProtectRequest>(body)
                .map_err(|e| e.to_string())
                .and_then(|r| r.check().map_err(|e| e.to_string()))
        };
        assert_eq!(req("10.0.0.1:9", "checkpoint").unwrap(), "10.0.0.1:9".parse().unwrap());
        assert!(req("[fd00::1]:7700", "lockstep").is_ok());
        for (backup, mode) in [
            ("10.0.0.1:9 --events /tmp/x", "lockstep"),
            ("10.0.0.1:9 --help", "lockstep"),
            ("--help", "lockstep"),
            ("10.0.0.1", "lockstep"),
            ("10.0.0.1:9", "checkpoint --bogus"),
            ("10.0.0.1:9", "-x"),
        ] {
            let e = req(backup, mode).unwrap_err();
            assert!(!e.contains('\n'), "{e}");
        }
        assert!(check_vm_name("redis-1").is_ok() && check_vm_name("a.b_c").is_ok());
        for bad in ["-ci", "", "..", "a b", "<img src=x", "vm-\u{e9}", "a\0b"] {
            assert!(check_vm_name(bad).is_err(), "{bad:?}");
        }
    }

    /// The mode became a type (`ftvm_api::Mode`); what etcd and the API
    /// hold from before reads the same: a spec's and a host record's
    /// `"protect": "checkpoint"`, a protect request's `"mode"`.
    #[test]
    fn records_stored_with_the_mode_as_a_string_still_read() {
        let spec: VmSpec = serde_json::from_str(r#"{"name": "redis", "protect": "checkpoint"}"#).unwrap();
        assert_eq!(spec.protect, Some(Mode::Checkpoint));
        assert!(serde_json::to_string(&spec).unwrap().contains(r#""protect":"checkpoint""#));
        let vm: HostVm =
            serde_json::from_str(r#"{"name": "redis", "role": "primary", "protect": "epoch", "memory_mib": 512}"#)
                .unwrap();
        assert_eq!(vm.protect, Some(Mode::Epoch));
        let req: ProtectRequest = serde_json::from_str(r#"{"backup": "10.0.0.2:7700", "mode": "lockstep"}"#).unwrap();
        assert_eq!(req.mode, Mode::Lockstep);
        let req: ProtectRequest = serde_json::from_str(r#"{"backup": "10.0.0.2:7700"}"#).unwrap();
        assert_eq!(req.mode, Mode::Lockstep);
        assert!(serde_json::from_str::<VmSpec>(r#"{"name": "redis", "protect": "remus"}"#).is_err());
    }

    #[test]
    fn errors_are_tagged_json_with_their_status() {
        let e = ApiError::NotFound("no VM x on this host".into());
        assert_eq!(serde_json::to_string(&e).unwrap(), r#"{"error":"not_found","message":"no VM x on this host"}"#);
        assert_eq!(e.http_status(), 404);
    }
}
