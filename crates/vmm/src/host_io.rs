//! The outside world of one running VM: which host object serves each
//! virtio slot (a disk image with its I/O threads, a TAP, the host's
//! entropy), dispatching the machine's requests to them, and holding
//! received frames until the guest has a buffer for them.
//!
//! Everything a backend produces comes back to the live loop as a
//! [`HostEvent`] on one channel, so the loop has a single place to wait
//! and applies every input at an instruction boundary.

use crate::console::Input;
use crate::control::ControlRequest;
use ftvm_api::vm_config::MAX_DISK_LATENCY;
use ftvm_host::disk::{DiskError, DiskImage, DiskWorkers, DEFAULT_DISK_THREADS};
use ftvm_host::tap::{Tap, TapError};
use ftvm_machine::mac::{format_mac, parse_mac};
use ftvm_machine::{BlkOp, DeviceSpec, Engine, Event, IoCompletion, IoRequest};
use ftvm_replication::channel::PrimaryEvent;
use ftvm_replication::fence::{Fence, Standing};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::mpsc::Sender;
use std::time::Duration;

/// Received frames held per NIC while the guest has no buffer (a NIC's
/// ring): beyond this, new frames are dropped as real hardware does.
const RX_BACKLOG: usize = 256;

/// Something the live loop must look at.
pub enum HostEvent {
    Console(Input),
    /// A completion from a backend thread.
    Io(usize, IoCompletion),
    /// A frame that arrived on a TAP.
    Frame(usize, Vec<u8>),
    Control(ControlRequest),
    /// News from the logging channel of a protected VM.
    Replication(PrimaryEvent),
    /// The host asks the VM to go (SIGTERM or SIGINT, the signal's
    /// number): a protected VM hands over to its backup, a recording
    /// quits, a VM alone asks its guest to power off.
    Terminate(i32),
    /// A pair set up for the running VM (`protect`), or why not.
    Protection(crate::ft::protect::Setup),
    /// A checkpoint backup that went live has written its activation
    /// records (their paths), and its frames may go; or it could not, and
    /// nothing of this VM may ever leave the host.
    Activated(Result<Vec<PathBuf>, ftvm_protection::error::ProtectionError>),
}

/// How the host serves one virtio slot, as given on the command line and
/// kept in a snapshot so a restore can reattach the same things.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// `latency`: the least time each request takes (zero: as fast as the
    /// host's file), to model a slower disk.
    Disk {
        path: PathBuf,
        readonly: bool,
        latency: Duration,
    },
    Tap {
        name: String,
        mac: [u8; 6],
        bridge: Option<String>,
    },
    Rng,
}

enum Slot {
    Disk { workers: DiskWorkers, _image: DiskImage },
    Net { tap: Tap, backlog: VecDeque<Vec<u8>>, dropped: u64 },
    Rng,
}

/// Why the backends of a VM could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum HostIoError {
    #[error(transparent)]
    Disk(#[from] DiskError),
    #[error("cannot start I/O threads for disk {}: {source}", .path.display())]
    DiskThreads {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Tap(#[from] TapError),
    #[error("cannot read TAP {name}: {source}")]
    TapReader {
        name: String,
        #[source]
        source: std::io::Error,
    },
}

impl HostIoError {
    /// Whether a disk or TAP is held by another VM (or process), which may
    /// let go of it in a moment.
    pub fn in_use(&self) -> bool {
        matches!(self, HostIoError::Disk(DiskError::InUse { .. }) | HostIoError::Tap(TapError::InUse { .. }))
    }
}

pub struct HostIo {
    backends: Vec<Backend>,
    slots: Vec<Slot>,
    events: Sender<HostEvent>,
    control: bool,
    /// Whether outputs may leave now: always on a VM alone, while its
    /// lease runs on a protected primary (`ftvm_replication::fence`).
    fence: Fence,
    /// Outputs the fence held back, in order: they go once it allows,
    /// and never if this side is deposed.
    fenced: VecDeque<(usize, IoRequest)>,
    /// A checkpoint backup gone live: its activation records, which must
    /// be durable before anything of the VM leaves the host (Remus §2.5),
    /// are being written, and this says when they are (won: the frames
    /// go; deposed: they never do). The disk writes need not wait: the
    /// copies are this host's own, and a record never written leaves
    /// them unvouched for.
    activation: Option<Fence>,
    /// Frames the activation holds back, in order.
    unactivated: VecDeque<(usize, IoRequest)>,
    /// When this side last sent one of the VM's frames.
    last_frame_sent: Option<std::time::Instant>,
}

/// Whether a request is an output: something the world outside the VM
/// would see (a frame on the wire, a write or flush on the disk).
fn is_output(req: &IoRequest) -> bool {
    matches!(req, IoRequest::NetTx { .. } | IoRequest::Disk { op: BlkOp::Write { .. } | BlkOp::Flush, .. })
}

impl HostIo {
    /// Where news for the live loop goes (for a source of its own).
    pub fn events(&self) -> Sender<HostEvent> {
        self.events.clone()
    }

    /// Opens every backend, its outputs under `fence`. Returns the
    /// machine's device list, in slot order, as the guest will see it.
    pub fn open(
        backends: Vec<Backend>,
        events: Sender<HostEvent>,
        fence: Fence,
    ) -> Result<(HostIo, Vec<DeviceSpec>), HostIoError> {
        Self::open_with(backends, events, fence, false, Vec::new())
    }

    /// Opens the TAPs among `backends` (in their bridges) ahead of the
    /// rest, for a backup that may go live: a TAP forwards only some
    /// milliseconds after it is opened (`Tap::wait_forwarding`), so a
    /// backup opens its TAPs while it follows, and they forward by the
    /// time it announces the MAC. Nothing reads them until then: what
    /// queued is dropped when the backup goes live (`take_over`). One that
    /// cannot be opened now is left to `take_over`, which says why.
    pub fn open_taps(backends: &[Backend]) -> Vec<Tap> {
        backends
            .iter()
            .filter_map(|b| match b {
                Backend::Tap { name, bridge, .. } => {
                    let tap = Tap::open(name).ok()?;
                    match bridge {
                        Some(br) => tap.attach_to_bridge(br).ok().map(|_| tap),
                        None => Some(tap),
                    }
                }
                _ => None,
            })
            .collect()
    }

    /// Opens every backend for a backup that won the arbiter and goes
    /// live alone: its writable disks are taken over from the primary it
    /// replaces, which may still hold their locks but is fenced (see
    /// `DiskImage::open_taking_over`). `opened`: TAPs it opened ahead
    /// (`open_taps`), used for the backends of their names; `activation`:
    /// what its frames wait for, if anything. Also returns the disks whose
    /// lock was still held.
    pub fn take_over(
        backends: Vec<Backend>,
        events: Sender<HostEvent>,
        opened: Vec<Tap>,
        activation: Option<Fence>,
    ) -> Result<(HostIo, Vec<DeviceSpec>, Vec<PathBuf>), HostIoError> {
        let (mut io, specs) = Self::open_with(backends, events, Fence::alone(), true, opened)?;
        io.activation = activation;
        let held = io
            .slots
            .iter()
            .filter_map(|s| match s {
                Slot::Disk { _image: image, .. } if image.taken_over() => Some(image.path().to_path_buf()),
                _ => None,
            })
            .collect();
        Ok((io, specs, held))
    }

    fn open_with(
        backends: Vec<Backend>,
        events: Sender<HostEvent>,
        fence: Fence,
        take_over: bool,
        mut opened: Vec<Tap>,
    ) -> Result<(HostIo, Vec<DeviceSpec>), HostIoError> {
        let mut slots = Vec::new();
        let mut specs = Vec::new();
        for (slot, b) in backends.iter().enumerate() {
            match b {
                Backend::Disk { path, readonly, latency } => {
                    let image = match take_over && !*readonly {
                        true => DiskImage::open_taking_over(path)?,
                        false => DiskImage::open(path, *readonly)?,
                    };
                    let tx = events.clone();
                    let workers = DiskWorkers::spawn(&image, slot, DEFAULT_DISK_THREADS, *latency, move |slot, c| {
                        let _ = tx.send(HostEvent::Io(slot, c));
                    })
                    .map_err(|source| HostIoError::DiskThreads { path: path.clone(), source })?;
                    // Writes queued before a stall must not land after it
                    // unless this side may still act: asked in the worker,
                    // at the last moment.
                    let permit = fence.clone();
                    workers.fence_with(std::sync::Arc::new(move || permit.wait()));
                    specs.push(DeviceSpec::Disk { size: image.size(), readonly: *readonly });
                    slots.push(Slot::Disk { workers, _image: image });
                }
                Backend::Tap { name, mac, bridge } => {
                    let tap = match opened.iter().position(|t| t.name() == name) {
                        // `open_taps` kept it only once it was in its bridge.
                        Some(i) => {
                            let tap = opened.swap_remove(i);
                            let stale = tap.discard_queued();
                            if stale > 0 {
                                tracing::debug!(
                                    tap = name.as_str(),
                                    frames = stale,
                                    "dropped what queued while following"
                                );
                            }
                            tap
                        }
                        None => {
                            let tap = Tap::open(name)?;
                            if let Some(br) = bridge {
                                tap.attach_to_bridge(br)?;
                            }
                            tap
                        }
                    };
                    let tx = events.clone();
                    tap.spawn_reader(slot, move |slot, frame| {
                        let _ = tx.send(HostEvent::Frame(slot, frame));
                    })
                    .map_err(|source| HostIoError::TapReader { name: name.clone(), source })?;
                    specs.push(DeviceSpec::Net { mac: *mac });
                    slots.push(Slot::Net { tap, backlog: VecDeque::new(), dropped: 0 });
                }
                Backend::Rng => {
                    specs.push(DeviceSpec::Rng);
                    slots.push(Slot::Rng);
                }
            }
        }
        let io = HostIo {
            backends,
            slots,
            events,
            control: false,
            fence,
            fenced: VecDeque::new(),
            activation: None,
            unactivated: VecDeque::new(),
            last_frame_sent: None,
        };
        Ok((io, specs))
    }

    pub fn backends(&self) -> &[Backend] {
        &self.backends
    }

    /// The paths of the VM's disks.
    pub fn disk_paths(&self) -> impl Iterator<Item = &std::path::Path> {
        self.backends.iter().filter_map(|b| match b {
            Backend::Disk { path, .. } => Some(path.as_path()),
            _ => None,
        })
    }

    /// Whether frames can arrive (the VM has a NIC).
    pub fn has_network(&self) -> bool {
        self.slots.iter().any(|s| matches!(s, Slot::Net { .. }))
    }

    /// Whether commands can arrive.
    pub fn has_control(&self) -> bool {
        self.control
    }

    /// Note that a control socket is listening.
    pub fn set_control(&mut self, on: bool) {
        self.control = on;
    }

    /// Sends the machine's new requests to their backends: outputs only
    /// while the fence allows (held back, in order, until it does), the
    /// rest at once. Outputs held earlier go first, if they may now.
    pub fn dispatch(&mut self, requests: Vec<(usize, IoRequest)>) {
        let activated = self.activated();
        let requests = match activated {
            Some(frames) => frames.into_iter().chain(requests).collect(),
            None => requests,
        };
        self.release_fenced();
        for (slot, req) in requests {
            if is_output(&req) {
                if self.fence.standing() == Standing::Deposed {
                    continue;
                }
                if self.activation.is_some() && matches!(req, IoRequest::NetTx { .. }) {
                    self.unactivated.push_back((slot, req));
                    continue;
                }
                if !self.fenced.is_empty() || !self.fence.allows() {
                    self.fenced.push_back((slot, req));
                    continue;
                }
            }
            self.perform(slot, req);
        }
    }

    /// Once the activation has ended: the frames it held (none if it
    /// failed: nothing of this VM may leave), and it holds no more.
    fn activated(&mut self) -> Option<VecDeque<(usize, IoRequest)>> {
        let standing = self.activation.as_ref()?.standing();
        if standing == Standing::Leased {
            return None;
        }
        self.activation = None;
        let frames = std::mem::take(&mut self.unactivated);
        Some(if standing == Standing::Deposed { VecDeque::new() } else { frames })
    }

    /// Outputs the fence held back go, in order, while it allows; all are
    /// dropped once this side is deposed (the other side is live, and
    /// owns the world outside now).
    pub fn release_fenced(&mut self) {
        if self.fence.standing() == Standing::Deposed {
            self.fenced.clear();
            return;
        }
        while !self.fenced.is_empty() && self.fence.allows() {
            let (slot, req) = self.fenced.pop_front().expect("not empty");
            self.perform(slot, req);
        }
    }

    /// The fence the outputs wait for.
    pub fn fence(&self) -> Fence {
        self.fence.clone()
    }

    /// Whether a backup gone live is still writing its activation records
    /// (its frames wait; it is not given a backup of its own yet).
    pub fn activating(&self) -> bool {
        self.activation.as_ref().is_some_and(|a| a.standing() == Standing::Leased)
    }

    /// When this side last sent one of the VM's frames (None: never).
    pub fn last_frame_sent(&self) -> Option<std::time::Instant> {
        self.last_frame_sent
    }

    /// Outputs held back by the fence.
    pub fn fenced(&self) -> usize {
        self.fenced.len()
    }

    fn perform(&mut self, slot: usize, req: IoRequest) {
        {
            match (self.slots.get_mut(slot), req) {
                (Some(Slot::Disk { workers, .. }), IoRequest::Disk { tag, op }) => workers.submit(tag, op),
                (Some(Slot::Net { tap, .. }), IoRequest::NetTx { frame }) => {
                    // A frame the host cannot take (link down, queue full)
                    // is lost, as on a wire.
                    let _ = tap.send(&frame);
                    self.last_frame_sent = Some(std::time::Instant::now());
                }
                (Some(Slot::Rng), IoRequest::Entropy { tag, len }) => {
                    let mut data = vec![0u8; len as usize];
                    let completion = match ftvm_host::entropy::fill(&mut data) {
                        Ok(()) => IoCompletion::Entropy { tag, data },
                        // The device completes a request with no bytes.
                        Err(_) => IoCompletion::Entropy { tag, data: Vec::new() },
                    };
                    let _ = self.events.send(HostEvent::Io(slot, completion));
                }
                // A request a backend cannot serve means the machine and the
                // host disagree about the slot; the device would wait for
                // ever, so it is a bug worth hearing about in debug builds.
                (_, req) => debug_assert!(false, "slot {slot} cannot serve {req:?}"),
            }
        }
    }

    /// Tells the network that each NIC's MAC is now here, as VMware FT does
    /// when a backup goes live: a broadcast RARP request from the MAC
    /// makes every switch (bridge) on the way learn its new port, without
    /// the guest's help and whatever its IP addresses.
    ///
    /// Each TAP is first given up to [`ANNOUNCE_WAIT`] to forward (its
    /// carrier up, its bridge port forwarding: see `Tap::wait_forwarding`),
    /// since one opened just now drops what is written into it at first.
    pub fn announce(&mut self) {
        for (b, s) in self.backends.iter().zip(&self.slots) {
            if let (Backend::Tap { mac, .. }, Slot::Net { tap, .. }) = (b, s) {
                let waiting = std::time::Instant::now();
                let forwards = tap.wait_forwarding(ANNOUNCE_WAIT);
                tracing::debug!(tap = tap.name(), waited_us = waiting.elapsed().as_micros() as u64, "announcing");
                if !forwards {
                    eprintln!(
                        "ftvm: TAP {} does not forward yet after {} ms (its carrier or bridge port); announcing anyway",
                        tap.name(),
                        ANNOUNCE_WAIT.as_millis()
                    );
                }
                let _ = tap.send(&rarp_announcement(mac));
            }
        }
    }

    /// Sends `frames` (NIC slot, frame) again, in order, as outputs like
    /// any other: held back while the fence does not allow them yet (a
    /// backup still writing its activation records), never sent by a
    /// deposed side.
    pub fn resend(&mut self, frames: &[(usize, Vec<u8>)]) {
        let net = |slot: usize| matches!(self.slots.get(slot), Some(Slot::Net { .. }));
        let frames: Vec<_> = frames
            .iter()
            .filter(|(slot, _)| net(*slot))
            .map(|(slot, frame)| (*slot, IoRequest::NetTx { frame: frame.clone() }))
            .collect();
        self.dispatch(frames);
    }

    /// Holds a received frame for its NIC.
    pub fn receive(&mut self, slot: usize, frame: Vec<u8>) {
        if let Some(Slot::Net { backlog, dropped, .. }) = self.slots.get_mut(slot) {
            if backlog.len() < RX_BACKLOG {
                backlog.push_back(frame);
            } else {
                *dropped += 1;
            }
        }
    }

    /// The next held frame whose NIC has a buffer for it now, as the
    /// event that hands it to the guest.
    pub fn next_frame(&mut self, m: &impl Engine) -> Option<Event> {
        for (slot, s) in self.slots.iter_mut().enumerate() {
            if let Slot::Net { backlog, .. } = s {
                if !backlog.is_empty() && m.input_ready(slot) {
                    let frame = backlog.pop_front().expect("checked");
                    return Some(Event::Io { slot, completion: IoCompletion::NetRx { frame } });
                }
            }
        }
        None
    }

    /// Waits until every disk request handed out has finished (its
    /// completion is then on the channel).
    pub fn drain(&self) {
        for s in &self.slots {
            if let Slot::Disk { workers, .. } = s {
                workers.drain();
            }
        }
    }

    /// The backends as text for a snapshot file: one line per slot.
    pub fn describe(&self) -> String {
        describe(&self.backends)
    }
}

/// Longest a backup going live waits for a TAP it just opened to forward
/// before it announces the MAC there.
pub const ANNOUNCE_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// A RARP "request reverse" frame from `mac` (RFC 903), padded to the
/// Ethernet minimum.
pub fn rarp_announcement(mac: &[u8; 6]) -> Vec<u8> {
    let mut f = Vec::with_capacity(60);
    f.extend_from_slice(&[0xff; 6]);
    f.extend_from_slice(mac);
    f.extend_from_slice(&0x8035u16.to_be_bytes());
    // Ethernet hardware, IPv4 protocol, address lengths 6 and 4, opcode 3.
    f.extend_from_slice(&[0, 1, 0x08, 0x00, 6, 4, 0, 3]);
    f.extend_from_slice(mac);
    f.extend_from_slice(&[0; 4]);
    f.extend_from_slice(mac);
    f.extend_from_slice(&[0; 4]);
    f.resize(60, 0);
    f
}

/// Backends as text, one line per slot (read back by [`parse_description`]).
pub fn describe(backends: &[Backend]) -> String {
    let mut out = String::new();
    for b in backends {
        match b {
            Backend::Disk { path, readonly, latency } => {
                let mode = if *readonly { "ro" } else { "rw" };
                match latency.as_micros() {
                    0 => out += &format!("disk {mode} {}\n", path.display()),
                    us => out += &format!("disk {mode},latency={us}us {}\n", path.display()),
                }
            }
            Backend::Tap { name, mac, bridge } => {
                out += &format!("tap {} {} {}\n", format_mac(mac), bridge.as_deref().unwrap_or("-"), name)
            }
            Backend::Rng => out += "rng\n",
        }
    }
    out
}

/// A line of a device list (a snapshot's) that [`HostIo::describe`]
/// did not write.
#[derive(Debug, thiserror::Error)]
pub enum DeviceLineError {
    #[error("unreadable device line '{0}'")]
    Line(String),
    #[error(transparent)]
    Latency(#[from] LatencyError),
}

/// A disk latency that is not one.
#[derive(Debug, thiserror::Error)]
pub enum LatencyError {
    #[error("invalid disk latency '{0}': use a whole number of us, ms or s (26ms)")]
    Unreadable(String),
    #[error("disk latency '{given}' is over the limit of {} s", MAX_DISK_LATENCY.as_secs())]
    TooLong { given: String },
}

/// Reads what [`HostIo::describe`] wrote.
pub fn parse_description(text: &str) -> Result<Vec<Backend>, DeviceLineError> {
    let mut out = Vec::new();
    for line in text.lines() {
        let w: Vec<&str> = line.splitn(4, ' ').collect();
        let b = match w.as_slice() {
            ["disk", mode, ..] if w.len() >= 3 => {
                // Paths may contain spaces: the path is the rest of the line.
                let path = line.splitn(3, ' ').nth(2).unwrap_or_default();
                let (access, latency) = match mode.split_once(",latency=") {
                    Some((access, l)) => (access, parse_latency(l)?),
                    None => (*mode, Duration::ZERO),
                };
                if !matches!(access, "ro" | "rw") {
                    return Err(DeviceLineError::Line(line.to_string()));
                }
                Backend::Disk { path: PathBuf::from(path), readonly: access == "ro", latency }
            }
            ["tap", mac, bridge, name] => Backend::Tap {
                name: name.to_string(),
                mac: parse_mac(mac).map_err(|_| DeviceLineError::Line(line.to_string()))?,
                bridge: (*bridge != "-").then(|| bridge.to_string()),
            },
            ["rng"] => Backend::Rng,
            _ => return Err(DeviceLineError::Line(line.to_string())),
        };
        out.push(b);
    }
    Ok(out)
}

/// A disk latency: a whole number of `us`, `ms` or `s` (`26ms`).
pub fn parse_latency(s: &str) -> Result<Duration, LatencyError> {
    let bad = || LatencyError::Unreadable(s.to_string());
    let (num, unit) = s.find(|c: char| !c.is_ascii_digit()).map(|i| s.split_at(i)).ok_or_else(bad)?;
    let n: u64 = num.parse().map_err(|_| bad())?;
    let d = match unit {
        "us" => Duration::from_micros(n),
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        _ => return Err(bad()),
    };
    if d > MAX_DISK_LATENCY {
        return Err(LatencyError::TooLong { given: s.to_string() });
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch directory named after `test`, a 64 KiB zeroed disk image
    /// in it, and the backends of a VM with that disk alone.
    fn one_disk(test: &str) -> (PathBuf, PathBuf, Vec<Backend>) {
        let dir = std::env::temp_dir().join(format!("ftvm-host-io-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let disk = dir.join("disk.img");
        std::fs::write(&disk, vec![0u8; 1 << 16]).unwrap();
        let backends = vec![Backend::Disk { path: disk.clone(), readonly: false, latency: Duration::ZERO }];
        (dir, disk, backends)
    }

    /// A protected primary whose lease ran out (it stalled) holds every
    /// output, here a disk write and a flush, behind its fence, in order,
    /// while reads go on; they go once the lease is renewed or the
    /// arbiter is won, and never once it is lost.
    #[test]
    fn outputs_wait_for_the_fence_and_die_with_a_lost_arbiter() {
        let (dir, disk, backends) = one_disk("fence");
        let recv = |rx: &std::sync::mpsc::Receiver<HostEvent>| match rx.recv_timeout(Duration::from_millis(300)) {
            Ok(HostEvent::Io(0, IoCompletion::Disk { tag, result })) => Some((tag, result.status)),
            Ok(_) => panic!("another event"),
            Err(_) => None,
        };
        let write =
            |tag: u32, byte: u8| (0, IoRequest::Disk { tag, op: BlkOp::Write { offset: 0, data: vec![byte; 512] } });
        let read = |tag: u32| (0, IoRequest::Disk { tag, op: BlkOp::Read { offset: 4096, len: 512 } });

        // The lease ran out: the write and the flush wait, the read does not.
        let fence = Fence::leased();
        let (tx, rx) = std::sync::mpsc::channel();
        let (mut io, _) = HostIo::open(backends.clone(), tx, fence.clone()).unwrap();
        io.dispatch(vec![write(1, 0xaa), (0, IoRequest::Disk { tag: 2, op: BlkOp::Flush }), read(3)]);
        assert_eq!(recv(&rx), Some((3, 0)), "the read waits for nothing");
        assert_eq!(recv(&rx), None, "an output left without a lease");
        assert_eq!(io.fenced(), 2);
        assert_eq!(std::fs::read(&disk).unwrap()[0], 0);
        // A renewal lets them go, in order.
        fence.renew(ftvm_replication::fence::now_ns(), Duration::from_secs(5));
        io.release_fenced();
        let mut done: Vec<u32> = [recv(&rx), recv(&rx)].into_iter().map(|r| r.expect("released").0).collect();
        done.sort();
        assert_eq!(done, [1, 2]);
        assert_eq!(std::fs::read(&disk).unwrap()[0], 0xaa);
        drop(io);

        // Deposed: what was held is dropped, and nothing more leaves.
        let fence = Fence::leased();
        let (tx, rx) = std::sync::mpsc::channel();
        let (mut io, _) = HostIo::open(backends, tx, fence.clone()).unwrap();
        io.dispatch(vec![write(4, 0xbb)]);
        fence.deposed();
        io.dispatch(vec![write(5, 0xcc)]);
        assert_eq!(recv(&rx), None);
        assert_eq!(io.fenced(), 0);
        assert_eq!(std::fs::read(&disk).unwrap()[0], 0xaa, "a deposed side wrote the disk");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A checkpoint backup going live holds its frames until its
    /// activation records are durable, not its disk writes: they go to
    /// this host's own copy, and the guest's first request (an AOF write
    /// and its flush) goes on beside the records' fsyncs.
    #[test]
    fn a_going_live_backups_disk_writes_do_not_wait_for_its_activation() {
        let (dir, disk, backends) = one_disk("activation");
        let activation = Fence::leased();
        let (tx, rx) = std::sync::mpsc::channel();
        let (mut io, _, _) = HostIo::take_over(backends, tx, Vec::new(), Some(activation.clone())).unwrap();
        let write = IoRequest::Disk { tag: 1, op: BlkOp::Write { offset: 0, data: vec![0xaa; 512] } };
        io.dispatch(vec![(0, write), (0, IoRequest::Disk { tag: 2, op: BlkOp::Flush })]);
        let mut done = Vec::new();
        for _ in 0..2 {
            match rx.recv_timeout(Duration::from_secs(5)) {
                Ok(HostEvent::Io(0, IoCompletion::Disk { tag, result })) => done.push((tag, result.status)),
                _ => panic!("a disk write waited for the activation"),
            }
        }
        done.sort();
        assert_eq!(done, [(1, 0), (2, 0)]);
        assert_eq!(io.fenced(), 0);
        assert_eq!(std::fs::read(&disk).unwrap()[0], 0xaa);
        drop(io);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn descriptions_round_trip() {
        let backends = vec![
            Backend::Disk { path: "/tmp/a b.img".into(), readonly: false, latency: Duration::ZERO },
            Backend::Disk { path: "/x.img".into(), readonly: true, latency: Duration::ZERO },
            Backend::Disk { path: "/slow disk.img".into(), readonly: false, latency: Duration::from_millis(26) },
            Backend::Tap { name: "tap0".into(), mac: [0x52, 0x54, 0, 1, 2, 3], bridge: Some("br0".into()) },
            Backend::Tap { name: "t1".into(), mac: [2, 0, 0, 0, 0, 9], bridge: None },
            Backend::Rng,
        ];
        let io = HostIo {
            backends: backends.clone(),
            slots: Vec::new(),
            events: std::sync::mpsc::channel().0,
            control: false,
            fence: Fence::alone(),
            fenced: VecDeque::new(),
            activation: None,
            unactivated: VecDeque::new(),
            last_frame_sent: None,
        };
        assert_eq!(parse_description(&io.describe()).unwrap(), backends);
        assert!(parse_description("floppy /dev/fd0").is_err());
    }
}
