//! The VMs of one host, each an `ftvm` child process of the agent (a plain
//! `ftvm run`, or an `ftvm ft backup` waiting for its primary), with its
//! files in a directory of its own under the agent's state directory:
//! `config.json` (its configuration, `ftvm_api`'s `VmConfig` or
//! `BackupConfig`, which its only option `--config` names: no field of a
//! request reaches a command line), `disk.img` (a sparse copy of the root
//! disk of the image its spec names, from this host's images, grown to the
//! spec's size; a backup's is the primary's, sent block by block), the
//! control socket `control.sock`, the
//! journal `events.jsonl`, the output `console.log`. The agent speaks to
//! each through its control socket (the typed API of `ftvm_api`), never
//! by reading its output.
//!
//! Child processes, not threads of the agent: a VM outlives an agent that
//! crashes or is killed to be upgraded, and one VM's fault stays its own.
//! Each VM's directory keeps what an agent started again needs to adopt
//! it ([`Vms::adopt`]): `vm.json` (its spec, part and pid) and
//! `published` (the last of its events in the cluster's log), so the VM
//! is this host's again, and the events it had while no agent listened
//! reach the log, each once.

use crate::model::{ApiError, HostImage, HostVm, NetworkSpec, Role, VmInfo, VmSpec};
use ftvm_api::events::EventRecord;
use ftvm_api::pair_config::BackupNic;
use ftvm_api::vm_config::{DiskConfig, Firmware, MacAddress, NetConfig};
use ftvm_api::{BackupConfig, PairConfig, Reply, Request, Response, VmConfig};
use ftvm_image::seed::check_hostname;
use ftvm_image::GuestImage;
use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;
use tokio::process::{Child, Command};

/// How long a VM's control socket has to answer a status request.
const STATUS_WAIT: Duration = Duration::from_secs(3);
/// How long a VM has to stop after SIGTERM before it is killed: its
/// guest's power-off, or a primary's handover (ftvm's own --stop-timeout
/// is 30 s).
const STOP_WAIT: Duration = Duration::from_secs(40);

/// What a request to a VM of this host needs of it: its control socket,
/// spec, process id, how it ended (if it did) and the part it started as.
type Handle = (PathBuf, VmSpec, Option<u32>, Option<String>, Role);

/// A VM's process.
enum Process {
    /// Started by this agent.
    Child(Child),
    /// Started by an agent before this one, and adopted; known by a
    /// pidfd, which (unlike its pid) can never name another process once
    /// this one has gone. Its exit status goes to whoever reaps it now.
    Adopted(OwnedFd),
    /// It had ended before this agent started.
    Gone,
}

impl Process {
    /// How it ended, once it has.
    fn ended(&mut self) -> Option<String> {
        match self {
            Process::Child(child) => child.try_wait().ok().flatten().map(describe_exit),
            Process::Adopted(fd) => {
                // A pidfd polls readable once its process has ended.
                let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
                // SAFETY: one valid pollfd, no wait.
                let ready = unsafe { libc::poll(&mut p, 1, 0) };
                (ready > 0).then(|| "ended (adopted: its exit status went to its new parent)".into())
            }
            Process::Gone => Some("ended while no agent ran on this host".into()),
        }
    }

    /// Sends `signal` to it, if it runs.
    fn signal(&mut self, signal: i32) {
        match self {
            Process::Child(child) => {
                if let (Some(pid), Ok(None)) = (child.id(), child.try_wait()) {
                    // SAFETY: kill(2) on the pid of a child not reaped yet
                    // (try_wait said so): the pid is still this child's.
                    unsafe { libc::kill(pid as i32, signal) };
                }
            }
            Process::Adopted(fd) => {
                // SAFETY: pidfd_send_signal(2) on a pidfd we own; no info.
                unsafe {
                    libc::syscall(libc::SYS_pidfd_send_signal, fd.as_raw_fd(), signal, std::ptr::null::<u8>(), 0)
                };
            }
            Process::Gone => {}
        }
    }
}

/// What a VM's directory keeps for an agent that adopts it.
#[derive(serde::Serialize, serde::Deserialize)]
struct Adoptable {
    spec: VmSpec,
    started_as: Role,
    pid: u32,
}

/// One VM's process on this host.
struct Vm {
    spec: VmSpec,
    dir: PathBuf,
    process: Process,
    pid: Option<u32>,
    /// Set once the process has ended: how.
    ended: Option<String>,
    /// The part it was started for (a backup, or the VM itself).
    started_as: Role,
    /// It was sent SIGTERM (a second would stop it at once: never sent).
    terminated: bool,
}

impl Vm {
    fn socket(&self) -> PathBuf {
        self.dir.join("control.sock")
    }

    /// Notes whether the process has ended.
    fn reap(&mut self) {
        if self.ended.is_none() {
            self.ended = self.process.ended();
        }
    }
}

fn describe_exit(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => "ended".into(),
    }
}

/// A VM process's pair event, with what names it in the cluster's log.
pub struct VmEvent {
    pub vm: String,
    pub pid: u32,
    pub record: EventRecord,
}

/// How long a new VM's process has to make its control socket before its
/// events are given up on.
const SOCKET_WAIT: Duration = Duration::from_secs(120);

/// Hands each event of the VM process behind `socket` after number
/// `published` to `events` until the process ends (its socket closes).
/// On a thread of its own: the control socket's event stream is a
/// blocking read.
fn follow(socket: PathBuf, vm: String, pid: u32, published: u64, events: tokio::sync::mpsc::Sender<VmEvent>) {
    let t0 = std::time::Instant::now();
    while !socket.exists() {
        if t0.elapsed() > SOCKET_WAIT || events.is_closed() {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut dropped = 0u64;
    let result = ftvm_api::client::follow_events(&socket, true, |line| {
        let Ok(record) = serde_json::from_str::<EventRecord>(line) else { return };
        if record.seq <= published || !crate::control::events::worth_keeping(&record.event) {
            return;
        }
        // Never wait for the publisher (etcd may be away): the VM's
        // stream must be read on. An event that finds the queue full is
        // lost, and counted.
        if events.try_send(VmEvent { vm: vm.clone(), pid, record }).is_err() {
            dropped += 1;
        }
    });
    if dropped > 0 {
        eprintln!("ftvm agent: {dropped} event(s) of VM {vm} dropped: the event log could not keep up");
    }
    if let Err(e) = result {
        eprintln!("ftvm agent: VM {vm}'s events: {e}");
    }
}

/// The VMs of this host.
pub struct Vms {
    /// This host's identity, as VMs' views name it.
    host: String,
    /// Where each VM's directory is made.
    dir: PathBuf,
    /// The ftvm binary the VMs run.
    ftvm: PathBuf,
    /// This host's guest images (`ftvm agent --images`).
    images: PathBuf,
    vms: Mutex<BTreeMap<String, Vm>>,
    /// The memory this host offers its VMs, bytes: a VM that would take
    /// more than is left unpromised is refused.
    memory: u64,
    /// Held through each start: the check of free memory and the VM's
    /// entry in `vms` are one step, so two starts at once cannot both
    /// take the last of it. Held too to forget a VM: a start makes the
    /// VM's directory afresh, at the path an ended process of the same VM
    /// had, and forgetting that one (its directory removed) in the midst
    /// of the start would take the new one's. (Taken before `vms`.)
    starting: Mutex<()>,
    /// Where the VMs' pair events go (the agent's publisher).
    events: tokio::sync::mpsc::Sender<VmEvent>,
}

/// FNV-1a of a VM's name, written out: the TAP's name and the NIC's MAC
/// need a hash that is the same on every host and in every build (a
/// primary and its backup on two hosts are one VM), which std's is not.
fn name_hash(vm: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in vm.bytes() {
        h ^= b as u32;
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// A TAP's name for a VM (Linux allows 15 bytes): `ftv` and a hash of its
/// name, so any VM name fits.
pub fn tap_name(vm: &str) -> String {
    format!("ftv{:08x}", name_hash(vm))
}

/// A VM's MAC address: locally administered, unicast (02:...), the rest
/// from its name, so the cluster's VMs on one bridge do not all have the
/// one default MAC, and both sides of a pair have the same.
pub fn mac_of(vm: &str) -> MacAddress {
    let [a, b, c, d] = name_hash(vm).to_be_bytes();
    MacAddress([0x02, 0x66, a, b, c, d])
}

/// The configuration of the process (`ftvm run --config`) that runs the
/// VM of `spec` in its directory `dir`, booting `image`'s firmware, kernel
/// and initrd (its root disk is the VM's copy, `disk.img`).
pub fn vm_config(spec: &VmSpec, dir: &Path, image: &GuestImage) -> VmConfig {
    let mut append = "console=ttyS0 root=/dev/vda rw quiet".to_string();
    if let Some(net) = &spec.network {
        append.push_str(&format!(" ftvm.ip={}", net.ip));
    }
    VmConfig {
        bios: Some(Firmware::File(image.firmware.clone())),
        kernel: Some(image.kernel.clone()),
        initrd: Some(image.initrd.clone()),
        // The guest's host name is the VM's where it can be one (its
        // seed); a name that cannot leaves the image's.
        hostname: check_hostname(&spec.name).is_ok().then(|| spec.name.clone()),
        ssh_keys: spec.ssh_keys.clone(),
        users: spec.users.clone(),
        memory_bytes: spec.memory_mib << 20,
        harts: spec.cpus as usize,
        disks: vec![DiskConfig { path: dir.join("disk.img"), readonly: false, latency_us: 0 }],
        control: Some(dir.join("control.sock")),
        append: Some(append),
        nets: nics(spec),
        exec: spec.command.clone(),
        ..VmConfig::default()
    }
}

/// The configuration of the process (`ftvm ft backup --config`) of a
/// backup of `spec`'s VM in `dir`, listening on `listen`, its arbiter the
/// cluster's etcd (`etcd`'s URLs, spoken to with the credentials in
/// `credentials`).
pub fn backup_config(
    spec: &VmSpec,
    dir: &Path,
    listen: SocketAddr,
    heartbeat_port: u16,
    etcd: &str,
    credentials: &Path,
    pair_key: &Path,
) -> BackupConfig {
    BackupConfig {
        listen,
        // A backup's NIC is the primary's, MAC and all, from the
        // machine it is sent: only its TAP and bridge are this host's.
        nets: nics(spec).into_iter().map(|n| BackupNic { tap: n.tap, bridge: n.bridge }).collect(),
        control: Some(dir.join("control.sock")),
        show_console: false,
        disks: vec![dir.join("disk.img")],
        start_files: Vec::new(),
        ack_delay: 0,
        pair: PairConfig {
            etcd: Some(etcd.into()),
            etcd_credentials: Some(credentials.to_path_buf()),
            vm_name: Some(spec.name.clone()),
            pair_key: Some(pair_key.to_path_buf()),
            heartbeat_port,
            events: Some(dir.join("events.jsonl")),
            ..PairConfig::default()
        },
    }
}

/// The VM's NIC, if it has one: its TAP on the bridge, and its MAC.
fn nics(spec: &VmSpec) -> Vec<NetConfig> {
    let nic = |NetworkSpec { bridge, .. }: &NetworkSpec| NetConfig {
        tap: tap_name(&spec.name),
        mac: Some(mac_of(&spec.name)),
        bridge: Some(bridge.clone()),
    };
    spec.network.iter().map(nic).collect()
}

fn internal(what: &str, e: impl std::fmt::Display) -> ApiError {
    ApiError::Internal(format!("{what}: {e}"))
}

impl Vms {
    /// The VMs of host `host`, their directories under `dir`, run by the
    /// binary `ftvm`, with `memory` bytes to share.
    pub fn new(
        host: &str,
        dir: &Path,
        ftvm: &Path,
        images: &Path,
        memory: u64,
        events: tokio::sync::mpsc::Sender<VmEvent>,
    ) -> Vms {
        Vms {
            host: host.into(),
            dir: dir.into(),
            ftvm: ftvm.into(),
            images: images.into(),
            vms: Mutex::default(),
            memory,
            starting: Mutex::default(),
            events,
        }
    }

    /// Refuses a VM named `name` that runs here already, or that needs
    /// more memory than is left. (Hold `starting` from this check to the
    /// VM's entry.)
    fn may_start(&self, spec: &VmSpec, what: &str) -> Result<(), ApiError> {
        if self.lock().get(&spec.name).is_some_and(|vm| vm.ended.is_none()) {
            return Err(ApiError::Conflict(format!("VM {} already {what} on this host", spec.name)));
        }
        let free = self.memory.saturating_sub(self.promised_memory());
        if spec.memory_mib << 20 > free {
            return Err(ApiError::Conflict(format!(
                "host {} has {} MiB free for VMs; VM {} needs {} MiB",
                self.host,
                free >> 20,
                spec.name,
                spec.memory_mib
            )));
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Vm>> {
        self.vms.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The images this host can boot a VM from, by name, for its record.
    pub fn images(&self) -> Vec<HostImage> {
        ftvm_image::list_in(&self.images)
            .into_iter()
            .filter_map(|i| Some(HostImage { name: i.name, disk_bytes: i.stamp.ok()?.rootfs_bytes() }))
            .collect()
    }

    /// The image `spec` boots, from this host's images: 409 if this host
    /// has none of that name (the controller places a VM only where its
    /// image is; a host asked directly may lack it).
    fn image(&self, spec: &VmSpec) -> Result<GuestImage, ApiError> {
        ftvm_image::locate_named_in(&self.images, spec.image_name())
            .map_err(|e| ApiError::Conflict(format!("host {}: {}", self.host, e.cause)))
    }

    /// The VM's directory, made afresh, with its root disk: a copy of
    /// `image`'s, grown to the spec's size (none for a backup whose host
    /// lacks the image: the primary's blocks make it).
    fn prepare(&self, spec: &VmSpec, image: Option<&GuestImage>) -> Result<PathBuf, ApiError> {
        let dir = self.dir.join("vms").join(&spec.name);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| internal("cannot clear the VM's old directory", e))?;
        }
        private_dir(&dir).map_err(|e| internal("cannot make the VM's directory", e))?;
        let Some(image) = image else { return Ok(dir) };
        let size = std::fs::metadata(&image.rootfs).map_err(|e| internal("cannot read the image", e))?.len();
        if let Some(mib) = spec.disk_mib.filter(|mib| mib << 20 < size) {
            return Err(ApiError::BadRequest(format!(
                "disk_mib {mib} is smaller than image {}'s root disk ({} MiB)",
                spec.image_name(),
                size >> 20
            )));
        }
        let disk = dir.join("disk.img");
        ftvm_image::sparse_copy(&image.rootfs, &disk).map_err(|e| internal("cannot copy the guest's root disk", e))?;
        // The copy may take the image's mode: the guest's disk is its own.
        std::fs::set_permissions(&disk, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| internal("cannot make the guest's disk private", e))?;
        if let Some(mib) = spec.disk_mib {
            ftvm_image::grow_disk(&disk, mib << 20).map_err(|e| internal("cannot grow the guest's root disk", e))?;
        }
        Ok(dir)
    }

    /// The files VMs boot from on this host (every image's firmware,
    /// kernel and initrd), for a backup to find its primary's by hash.
    fn boot_files(&self) -> Vec<PathBuf> {
        ftvm_image::list_in(&self.images)
            .into_iter()
            .filter_map(|i| ftvm_image::locate_named_in(&self.images, &i.name).ok())
            .flat_map(|image| [image.firmware, image.kernel, image.initrd])
            .collect()
    }

    /// Where a VM's process finds its configuration (`--config`).
    fn config_path(dir: &Path) -> PathBuf {
        dir.join("config.json")
    }

    /// Writes a process's configuration into the VM's directory (0600:
    /// it names the pair's key and the cluster's credentials), as the
    /// file its `--config` reads.
    fn write_config(dir: &Path, config: &impl serde::Serialize) -> Result<PathBuf, ApiError> {
        let path = Self::config_path(dir);
        let json = serde_json::to_vec_pretty(config).expect("a configuration serializes");
        private_file(&path)
            .and_then(|mut f| f.write_all(&json))
            .map_err(|e| internal("cannot write the VM's configuration", e))?;
        Ok(path)
    }

    /// Starts a VM (`ftvm run`) from its spec.
    pub fn create(&self, spec: VmSpec) -> Result<(), ApiError> {
        spec.check()?;
        let _one_at_a_time = self.starting.lock().unwrap_or_else(|e| e.into_inner());
        self.may_start(&spec, "runs")?;
        let image = self.image(&spec)?;
        let dir = self.prepare(&spec, Some(&image))?;
        let path = Self::write_config(&dir, &vm_config(&spec, &dir, &image))?;
        self.spawn(spec, dir, vec!["run".into(), "--config".into(), path.into()], Role::Unprotected)
    }

    /// Starts a backup of a VM (`ftvm ft backup`) listening on `listen`,
    /// its arbiter the cluster's etcd (`etcd`'s URLs, spoken to with the
    /// credentials in `credentials`).
    pub fn create_backup(
        &self,
        spec: VmSpec,
        listen: SocketAddr,
        heartbeat_port: u16,
        etcd: &str,
        credentials: &Path,
        pair_key: &Path,
    ) -> Result<(), ApiError> {
        spec.check()?;
        let _one_at_a_time = self.starting.lock().unwrap_or_else(|e| e.into_inner());
        self.may_start(&spec, "has a process")?;
        // The image's disk where this host has it: the primary then sends
        // only the blocks that differ.
        let dir = self.prepare(&spec, self.image(&spec).ok().as_ref())?;
        let config = BackupConfig {
            // The files the VM booted from, found by hash among this
            // host's images' (any image built by the same recipe has the
            // same firmware, kernel and initrd).
            start_files: self.boot_files(),
            ..backup_config(&spec, &dir, listen, heartbeat_port, etcd, credentials, pair_key)
        };
        let path = Self::write_config(&dir, &config)?;
        self.spawn(spec, dir, vec!["ft".into(), "backup".into(), "--config".into(), path.into()], Role::Backup)
    }

    fn spawn(
        &self,
        spec: VmSpec,
        dir: PathBuf,
        args: Vec<std::ffi::OsString>,
        started_as: Role,
    ) -> Result<(), ApiError> {
        let console =
            private_file(&dir.join("console.log")).map_err(|e| internal("cannot write the console log", e))?;
        let messages = private_file(&dir.join("ftvm.log")).map_err(|e| internal("cannot write ftvm's log", e))?;
        let mut cmd = Command::new(&self.ftvm);
        cmd.args(&args).stdin(Stdio::null()).stdout(console).stderr(messages);
        // Its own session: a signal to the agent's terminal or process
        // group is not one to its VMs.
        cmd.process_group(0);
        let child = cmd.spawn().map_err(|e| internal(&format!("cannot start {}", self.ftvm.display()), e))?;
        let pid = child.id();
        if let Some(pid) = pid {
            let adoptable = Adoptable { spec: spec.clone(), started_as, pid };
            let json = serde_json::to_vec(&adoptable).expect("a VM's record serializes");
            if let Err(e) = private_file(&dir.join("vm.json")).and_then(|mut f| f.write_all(&json)) {
                eprintln!(
                    "ftvm agent: VM {}: cannot keep its record ({e}); an agent started again will not adopt it",
                    spec.name
                );
            }
            let (socket, vm, events) = (dir.join("control.sock"), spec.name.clone(), self.events.clone());
            std::thread::spawn(move || follow(socket, vm, pid, 0, events));
        }
        let process = Process::Child(child);
        self.lock()
            .insert(spec.name.clone(), Vm { spec, dir, process, pid, ended: None, started_as, terminated: false });
        Ok(())
    }

    /// Takes back the VMs an agent before this one started on this host
    /// (their directories under the state directory): each one still
    /// running is this agent's again, its events after the last in the
    /// cluster's log followed; one that ended is shown as ended until
    /// deleted. Returns their names. Called once, before the host's record
    /// is first written.
    pub fn adopt(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.dir.join("vms")) else { return vec![] };
        let mut adopted = Vec::new();
        for dir in entries.flatten().map(|e| e.path()) {
            let Ok(json) = std::fs::read(dir.join("vm.json")) else { continue };
            let Ok(Adoptable { spec, started_as, pid }) = serde_json::from_slice::<Adoptable>(&json) else {
                eprintln!("ftvm agent: {} holds no VM record it can read; left alone", dir.display());
                continue;
            };
            let socket = dir.join("control.sock");
            // A VM's process names its configuration file (or, started by
            // an agent from before there was one, its control socket).
            let process = match pidfd_of(pid, &[Self::config_path(&dir), socket.clone()]) {
                Some(fd) => {
                    eprintln!("ftvm agent: VM {} (pid {pid}) runs on: adopted", spec.name);
                    let (vm, events, published) = (spec.name.clone(), self.events.clone(), read_published(&dir, pid));
                    std::thread::spawn(move || follow(socket, vm, pid, published, events));
                    Process::Adopted(fd)
                }
                None => {
                    eprintln!("ftvm agent: VM {}'s process (pid {pid}) ended while no agent ran", spec.name);
                    Process::Gone
                }
            };
            let name = spec.name.clone();
            let vm = Vm { spec, dir, process, pid: Some(pid), ended: None, started_as, terminated: false };
            self.lock().insert(name.clone(), vm);
            adopted.push(name);
        }
        adopted
    }

    /// Notes that VM `vm`'s process `pid` has its events up to number `seq`
    /// in the cluster's log (what [`Vms::adopt`] resumes after).
    pub fn published(&self, vm: &str, pid: u32, seq: u64) {
        let dir = match self.lock().get(vm) {
            Some(v) if v.pid == Some(pid) => v.dir.clone(),
            _ => return,
        };
        // Written whole then renamed: a crash never leaves half a number.
        let tmp = dir.join("published.new");
        if private_file(&tmp).and_then(|mut f| f.write_all(format!("{pid} {seq}\n").as_bytes())).is_ok() {
            let _ = std::fs::rename(&tmp, dir.join("published"));
        }
    }

    /// The names of this host's VMs.
    pub fn names(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    /// The control socket and spec of a VM, if this host has it.
    fn handle(&self, name: &str) -> Result<Handle, ApiError> {
        let mut vms = self.lock();
        let vm = vms.get_mut(name).ok_or_else(|| ApiError::NotFound(format!("no VM {name} on this host")))?;
        vm.reap();
        Ok((vm.socket(), vm.spec.clone(), vm.pid, vm.ended.clone(), vm.started_as))
    }

    /// The control socket of a VM whose process runs here, for its
    /// console: not found, or a conflict once its process has ended.
    pub fn console_socket(&self, name: &str) -> Result<PathBuf, ApiError> {
        let (socket, _, _, ended, _) = self.handle(name)?;
        match ended {
            Some(how) => Err(ApiError::Conflict(format!("VM {name}'s process on this host {how}: it has no console"))),
            None => Ok(socket),
        }
    }

    /// Asks a VM's process, on a thread of the blocking pool.
    pub async fn ask(&self, name: &str, request: Request, wait: Duration) -> Result<Reply, ApiError> {
        let (socket, ..) = self.handle(name)?;
        ask(socket, request, wait).await
    }

    /// A VM's view: its spec, part and status.
    pub async fn info(&self, name: &str) -> Result<VmInfo, ApiError> {
        let (socket, spec, pid, ended, started_as) = self.handle(name)?;
        let status = match &ended {
            Some(_) => None,
            None => match ask(socket.clone(), Request::Status, STATUS_WAIT).await {
                Ok(Reply::Status(s)) => Some(*s),
                _ => None,
            },
        };
        let role = match (&ended, &status) {
            (Some(_), _) => Role::Ended,
            (None, Some(s)) => Role::of(s),
            (None, None) if started_as == Role::Backup => Role::Backup,
            (None, None) => Role::Starting,
        };
        Ok(VmInfo {
            name: name.into(),
            host: self.host.clone(),
            spec,
            role,
            pid,
            control: socket.display().to_string(),
            status,
            ended,
        })
    }

    /// Every VM's view.
    pub async fn all(&self) -> Vec<VmInfo> {
        let mut out = Vec::new();
        for name in self.names() {
            if let Ok(info) = self.info(&name).await {
                out.push(info);
            }
        }
        out
    }

    /// The VMs and their parts, for the host's record.
    pub async fn summary(&self) -> Vec<HostVm> {
        self.all()
            .await
            .into_iter()
            .map(|v| HostVm { name: v.name, role: v.role, protect: v.spec.protect, memory_mib: v.spec.memory_mib })
            .collect()
    }

    /// Memory promised to the VMs that run, bytes.
    pub fn promised_memory(&self) -> u64 {
        let mut vms = self.lock();
        vms.values_mut()
            .map(|vm| {
                vm.reap();
                if vm.ended.is_none() {
                    vm.spec.memory_mib << 20
                } else {
                    0
                }
            })
            .sum()
    }

    /// Asks a VM's process to stop: SIGTERM, once (a plain VM's guest
    /// powers off, a protected primary hands over to its backup).
    fn terminate(&self, name: &str) -> Result<(), ApiError> {
        let mut vms = self.lock();
        let vm = vms.get_mut(name).ok_or_else(|| ApiError::NotFound(format!("no VM {name} on this host")))?;
        vm.reap();
        if let (None, false) = (&vm.ended, vm.terminated) {
            vm.process.signal(libc::SIGTERM);
            vm.terminated = true;
        }
        Ok(())
    }

    /// Waits for a VM's process to end, killing it after [`STOP_WAIT`],
    /// then forgets the VM with its directory. Returns how it ended.
    async fn reap_and_forget(&self, name: &str) -> Result<String, ApiError> {
        let deadline = tokio::time::Instant::now() + STOP_WAIT;
        let how = loop {
            let (_, _, pid, ended, _) = self.handle(name)?;
            if let Some(how) = ended {
                // Only the process waited for: a start since may have
                // put a new one in its place.
                let _no_start = self.starting.lock().unwrap_or_else(|e| e.into_inner());
                let mut vms = self.lock();
                if vms.get(name).is_some_and(|vm| vm.pid == pid && vm.ended.is_some()) {
                    forget(&mut vms, name);
                }
                break how;
            }
            if tokio::time::Instant::now() > deadline {
                if let Some(vm) = self.lock().get_mut(name) {
                    vm.process.signal(libc::SIGKILL);
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        Ok(how)
    }

    /// Stops a VM (see [`Vms::terminate`]), kills it if it has not ended
    /// within [`STOP_WAIT`], and forgets it with its directory.
    pub async fn delete(&self, name: &str) -> Result<String, ApiError> {
        self.terminate(name)?;
        self.reap_and_forget(name).await
    }

    /// Forgets a VM whose process has ended, with its directory; one that
    /// runs is refused (409), whatever the asker saw of it before.
    pub fn forget_ended(&self, name: &str) -> Result<String, ApiError> {
        let _no_start = self.starting.lock().unwrap_or_else(|e| e.into_inner());
        let mut vms = self.lock();
        let vm = vms.get_mut(name).ok_or_else(|| ApiError::NotFound(format!("no VM {name} on this host")))?;
        vm.reap();
        let Some(how) = vm.ended.clone() else {
            return Err(ApiError::Conflict(format!("VM {name}'s process on this host runs: not forgotten")));
        };
        forget(&mut vms, name);
        Ok(how)
    }

    /// The agent is stopping: every VM is asked to stop at once, then
    /// waited for.
    pub async fn stop_all(&self) {
        let names = self.names();
        for n in &names {
            let _ = self.terminate(n);
        }
        for n in &names {
            let _ = self.reap_and_forget(n).await;
        }
    }
}

/// Drops VM `name` from `vms`, with its directory (its disk and logs).
fn forget(vms: &mut BTreeMap<String, Vm>, name: &str) {
    if let Some(vm) = vms.remove(name) {
        let _ = std::fs::remove_dir_all(&vm.dir);
    }
}

/// A pidfd for process `pid` if it is still the VM whose files are
/// `names` (its command line names one of them: a pid can have been reused
/// by another process since the VM's agent went).
fn pidfd_of(pid: u32, names: &[PathBuf]) -> Option<OwnedFd> {
    // SAFETY: pidfd_open(2) with no flags; a non-negative result is a new
    // file descriptor that we own.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: as above: a fresh descriptor, owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // Read after the pidfd is open: if the pid is the VM's now, the
    // pidfd names the VM, and nothing else, from now on.
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let named = |arg: &[u8]| names.iter().any(|n| n.as_os_str().as_encoded_bytes() == arg);
    cmdline.split(|b| *b == 0).any(named).then_some(fd)
}

/// The number of the last event of process `pid` that is in the cluster's
/// log, as the VM's directory says (0: none).
fn read_published(dir: &Path, pid: u32) -> u64 {
    let text = std::fs::read_to_string(dir.join("published")).unwrap_or_default();
    match text.split_whitespace().collect::<Vec<_>>()[..] {
        [p, seq] if p.parse() == Ok(pid) => seq.parse().unwrap_or(0),
        _ => 0,
    }
}

/// Sends one request to a control socket on the blocking pool.
pub async fn ask(socket: PathBuf, request: Request, wait: Duration) -> Result<Reply, ApiError> {
    let answer = tokio::task::spawn_blocking(move || ftvm_api::client::send(&socket, &request, wait))
        .await
        .map_err(|e| internal("the request's thread failed", e))?;
    match answer {
        Ok((Response::Ok(reply), _)) => Ok(reply),
        Ok((Response::Error(e), _)) => Err(ApiError::Refused(e.to_string())),
        Err(e) => Err(ApiError::Unavailable(e.to_string())),
    }
}

/// Makes `dir` (and any parent missing) for the owner only (0700), and
/// makes it so if it was there, more open (an older agent's).
pub(crate) fn private_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// Creates (or empties) `path` for writing, readable by the owner only
/// (0600, also when it was there, more open).
fn private_file(path: &Path) -> std::io::Result<std::fs::File> {
    let f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_vm_has_its_own_tap_and_mac_the_same_on_every_host() {
        assert_eq!(tap_name("redis"), tap_name("redis"));
        assert_eq!(tap_name("redis").len(), 11);
        assert_ne!(mac_of("redis"), mac_of("redis-2"));
        assert_eq!(mac_of("redis"), mac_of("redis"));
        let mac = mac_of("redis").to_string();
        let bytes: Vec<u8> = mac.split(':').map(|b| u8::from_str_radix(b, 16).unwrap()).collect();
        assert_eq!(bytes.len(), 6, "{mac}");
        // Locally administered, unicast.
        assert_eq!(bytes[0] & 0b11, 0b10, "{mac}");
    }

    /// Issue 68: what an agent makes is its own, also where an older
    /// agent (or another umask) left a directory or file open.
    #[test]
    fn private_dirs_and_files_are_the_owners_only() {
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        let top = std::env::temp_dir().join(format!("ftvm-modes-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&top);
        let open = top.join("old");
        std::fs::DirBuilder::new().recursive(true).mode(0o755).create(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(open.join("console.log"), b"old").unwrap();
        std::fs::set_permissions(open.join("console.log"), std::fs::Permissions::from_mode(0o644)).unwrap();
        private_dir(&open).unwrap();
        private_dir(&top.join("new/vms/x")).unwrap();
        let mut f = private_file(&open.join("console.log")).unwrap();
        f.write_all(b"new").unwrap();
        private_file(&open.join("vm.json")).unwrap();
        assert_eq!(mode(&open), 0o700);
        assert_eq!(mode(&top.join("new/vms/x")), 0o700);
        assert_eq!(mode(&open.join("console.log")), 0o600);
        assert_eq!(std::fs::read(open.join("console.log")).unwrap(), b"new", "emptied first");
        assert_eq!(mode(&open.join("vm.json")), 0o600);
        std::fs::remove_dir_all(&top).unwrap();
    }
}
