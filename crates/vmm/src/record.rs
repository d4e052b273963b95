//! `ftvm record`: the live loop's inputs written to a replay log, and the
//! log header that names the machine and its starting state.
//!
//! Every event the live loop injects is logged at the instruction count
//! where it took effect. Before each run of the machine the recorder closes
//! the group of entries with a go-live point, and about every 100 ms of
//! guest time it logs the machine's chained state digest for replay to
//! check against.

use crate::api::PairStatus;
use crate::ft::primary::{Alone, Primary, Request};
use crate::host_io::{self, Backend};
use ftvm_machine::layout::TIMEBASE_HZ;
use ftvm_machine::{DeviceSpec, Event, IoCompletion, Machine};
use ftvm_replay::{Entry, Header, LogWriter, Record};
use ftvm_replication::channel::{Failure, LogSender};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Guest time between two state digests.
pub const DIGEST_TICKS: u64 = TIMEBASE_HZ / 10;
/// How long a primary waits at the end for the backup to acknowledge the
/// end of the log.
const END_ACK_WAIT: Duration = Duration::from_secs(5);

/// Where the log goes: a file (`ftvm record`) or a backup (`ftvm ft primary`).
pub enum Sink {
    File(BufWriter<File>),
    Channel(LogSender),
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Sink::File(f) => f.write(buf),
            Sink::Channel(c) => c.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Sink::File(f) => f.flush(),
            Sink::Channel(c) => c.flush(),
        }
    }
}

pub struct Recorder {
    log: LogWriter<Sink>,
    /// The file, or the backup's address, for messages.
    path: PathBuf,
    next_digest: u64,
    sizes: EntrySizes,
    /// With a backup: a frame (and so a go-live point) goes out at least
    /// this often while the guest runs. The backup runs no further than
    /// the last go-live point it has, so a backup as fast as its primary
    /// trails it by about this much: the lag's floor for a guest that
    /// computes and logs nothing else.
    go_live_every: Option<Duration>,
    last_frame: Instant,
    /// The backup performs disk reads itself (VMware FT §4.2): their data
    /// stays out of the log, only their outcome goes in.
    omit_read_data: bool,
}

/// Encoded bytes by kind of entry, for the summary: where a log's size
/// comes from.
#[derive(Default)]
struct EntrySizes {
    disk: u64,
    network: u64,
    clock: u64,
    digests: u64,
    /// State digests logged: a replay that matches them all says so.
    digest_count: u64,
}

impl EntrySizes {
    fn add(&mut self, entry: &Entry, bytes: usize) {
        let bucket = match entry {
            Entry::Event(Event::Io { completion: IoCompletion::Disk { .. }, .. }) => &mut self.disk,
            Entry::Event(Event::Io { completion: IoCompletion::NetRx { .. }, .. }) => &mut self.network,
            Entry::Event(Event::ClockRate(_) | Event::ClockAdvance(_)) => &mut self.clock,
            Entry::StateHash(_) => {
                self.digest_count += 1;
                &mut self.digests
            }
            // The rest (console input, entropy, marks) and the framing are
            // what remains of the total.
            _ => return,
        };
        *bucket += bytes as u64;
    }
}

impl Recorder {
    pub fn create(path: &Path, header: &Header) -> Result<Recorder, String> {
        let f = File::create(path).map_err(|e| format!("cannot create log {}: {e}", path.display()))?;
        let log = LogWriter::new(Sink::File(BufWriter::new(f)), header)
            .map_err(|e| format!("cannot write log {}: {e}", path.display()))?;
        Ok(Recorder::with(log, path.to_path_buf(), None))
    }

    /// A recorder whose log streams to a backup over the logging channel.
    pub fn to_backup(sender: LogSender, header: &Header, go_live_every: Duration) -> Result<Recorder, String> {
        let peer = sender.peer();
        let log = LogWriter::new(Sink::Channel(sender), header).map_err(|e| format!("logging channel: {e}"))?;
        Ok(Recorder::with(log, PathBuf::from(format!("the backup at {peer}")), Some(go_live_every)))
    }

    fn with(log: LogWriter<Sink>, path: PathBuf, go_live_every: Option<Duration>) -> Recorder {
        Recorder {
            log,
            path,
            next_digest: 0,
            sizes: EntrySizes::default(),
            go_live_every,
            last_frame: Instant::now(),
            omit_read_data: false,
        }
    }

    /// Bytes of log written so far in complete frames: what an output
    /// produced now depends on.
    pub fn logged(&self) -> u64 {
        self.log.bytes_written()
    }

    /// The logging channel, given up by a recorder that wrote only the
    /// header (checkpoint mode sends something else after it).
    pub fn into_channel(self) -> Option<LogSender> {
        match self.log.into_sink() {
            Sink::Channel(c) => Some(c),
            Sink::File(_) => None,
        }
    }

    /// The logging channel, when recording for a backup.
    pub fn channel(&self) -> Option<&LogSender> {
        match self.log.sink() {
            Sink::Channel(c) => Some(c),
            Sink::File(_) => None,
        }
    }

    pub fn event(&mut self, icount: u64, ev: &Event) {
        let mut ev = ev.clone();
        if self.omit_read_data {
            if let Event::Io { completion: IoCompletion::Disk { result, .. }, .. } = &mut ev {
                if result.status == 0 {
                    result.data = Vec::new();
                }
            }
        }
        self.push(Record { icount, entry: Entry::Event(ev) });
    }

    /// Leaves the data of successful disk reads out of the log from now
    /// on: the backup reads it from the disk itself.
    pub fn omit_read_data(&mut self) {
        self.omit_read_data = true;
    }

    fn push(&mut self, r: Record) {
        let bytes = self.log.push(&r);
        self.sizes.add(&r.entry, bytes);
    }

    /// Called before the machine runs on: a digest when one is due, then
    /// a go-live point if anything was logged since the last one.
    pub fn checkpoint(&mut self, m: &mut Machine) -> Result<(), String> {
        let quiet = self.go_live_every.is_some_and(|k| self.last_frame.elapsed() >= k);
        self.close_frame(m, quiet)
    }

    /// At the end of an epoch: a digest when one is due, then the epoch's
    /// end mark ([end, E]), a go-live point, whatever the epoch logged.
    pub fn end_epoch(&mut self, m: &mut Machine) -> Result<(), String> {
        self.close_frame(m, true)
    }

    fn close_frame(&mut self, m: &mut Machine, always: bool) -> Result<(), String> {
        if m.time() >= self.next_digest {
            let d = m.state_digest();
            self.push(Record { icount: m.icount(), entry: Entry::StateHash(d) });
            self.next_digest = m.time() + DIGEST_TICKS;
        }
        if self.log.has_pending() || always {
            self.log.go_live(m.icount()).map_err(|e| self.write_error(e))?;
            self.last_frame = Instant::now();
        }
        Ok(())
    }

    /// Ends the log with the final state digest, so a replay proves it
    /// reached the same final state, and the end mark.
    pub fn finish(mut self, m: &mut Machine, status: Option<u32>) -> Result<(), String> {
        let d = m.state_digest();
        self.push(Record { icount: m.icount(), entry: Entry::StateHash(d) });
        let path = self.path.clone();
        let fail = |e: std::io::Error| format!("cannot write log {}: {e}", path.display());
        let out = self.log.finish(m.icount(), status).map_err(fail)?;
        let written = match out {
            Sink::File(f) => {
                let file = f.into_inner().map_err(|e| fail(e.into_error()))?;
                file.sync_all().map_err(fail)?;
                file.metadata().map_err(fail)?.len()
            }
            Sink::Channel(c) => {
                // The end must reach the backup, or it would take the
                // primary's exit for a failure and go live.
                let end = c.written();
                if !c.wait_acked(end, END_ACK_WAIT) {
                    eprintln!("ftvm: the backup did not acknowledge the end of the log");
                }
                end
            }
        };
        let z = &self.sizes;
        eprintln!(
            "ftvm: recorded {} instructions, {written} bytes of log (disk completions {}, received frames {}, \
             clock {}, state digests {}, other entries and framing {}), {} state checks, in {}",
            m.icount(),
            z.disk,
            z.network,
            z.clock,
            z.digests,
            written - z.disk - z.network - z.clock - z.digests,
            z.digest_count,
            path.display()
        );
        Ok(())
    }

    fn write_error(&self, e: std::io::Error) -> String {
        format!("cannot write log {}: {e}", self.path.display())
    }
}

/// `ftvm record`: the side that runs the VM for a replay to follow, from
/// a log file. Nothing is held and nobody is waited for.
pub struct Recording(pub Recorder);

impl Primary for Recording {
    fn before_run(&mut self, m: &mut Machine, _paused: bool) -> Result<(), String> {
        self.0.checkpoint(m)
    }

    fn input(&mut self, icount: u64, ev: Event) -> Option<Event> {
        self.0.event(icount, &ev);
        Some(ev)
    }

    fn gate(&mut self, requests: Vec<Request>, _icount: u64) -> Vec<Request> {
        requests
    }

    fn after_slice(&mut self, _m: &mut Machine, _busy: Duration, _idle: bool) -> Result<Duration, String> {
        Ok(Duration::ZERO)
    }

    fn may_pause(&self) -> bool {
        true
    }

    /// A log file has no peer to lose.
    fn peer_lost(&mut self, _failure: &Failure) -> Result<Alone, String> {
        Ok(Alone::default())
    }

    fn status(&mut self) -> Option<PairStatus> {
        None
    }

    fn finish(self: Box<Self>, m: &mut Machine, status: Option<u32>) -> Result<(), String> {
        self.0.finish(m, status)
    }
}

/// How the recorded machine started.
pub enum Start<'a> {
    Boot {
        firmware: Option<(&'a Path, &'a [u8])>,
        kernel: (&'a Path, &'a [u8]),
        initrd: Option<(&'a Path, &'a [u8])>,
        cmdline: &'a str,
    },
    Snapshot {
        path: &'a Path,
        bytes: &'a [u8],
    },
}

fn file_field(path: &Path, bytes: &[u8]) -> String {
    format!("{} {}", blake3::hash(bytes).to_hex(), path.display())
}

/// The header of a log: machine, devices, backends, start, state hash.
pub fn header(m: &Machine, ram_size: u64, guest_ips: u64, backends: &[Backend], start: Start) -> Header {
    let mut h = Header::default();
    h.set("ftvm", env!("CARGO_PKG_VERSION"));
    h.set("machine", format!("harts={} ram={ram_size} ips={guest_ips}", m.harts().len()));
    h.set("devices", m.devices().iter().map(device_text).collect::<Vec<_>>().join(";"));
    h.set("backends", host_io::describe(backends).trim_end().replace('\n', ";"));
    match start {
        Start::Boot { firmware, kernel, initrd, cmdline } => {
            h.set("start", "boot");
            h.set("firmware", firmware.map_or("none".into(), |(p, b)| file_field(p, b)));
            h.set("kernel", file_field(kernel.0, kernel.1));
            h.set("initrd", initrd.map_or("none".into(), |(p, b)| file_field(p, b)));
            h.set("cmdline", cmdline);
        }
        Start::Snapshot { path, bytes } => {
            h.set("start", "snapshot");
            h.set("snapshot", file_field(path, bytes));
        }
    }
    h.set("state", hex(&m.state_hash()));
    h
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn device_text(d: &DeviceSpec) -> String {
    match d {
        DeviceSpec::Disk { size, readonly } => format!("disk:{size}:{}", if *readonly { "ro" } else { "rw" }),
        DeviceSpec::Net { mac } => format!("net:{}", host_io::format_mac(mac)),
        DeviceSpec::Rng => "rng".into(),
    }
}

pub fn parse_device(s: &str) -> Result<DeviceSpec, String> {
    let bad = || format!("unreadable device '{s}'");
    let mut p = s.splitn(2, ':');
    match (p.next(), p.next()) {
        (Some("disk"), Some(rest)) => {
            let (size, mode) = rest.split_once(':').ok_or_else(bad)?;
            Ok(DeviceSpec::Disk { size: size.parse().map_err(|_| bad())?, readonly: mode == "ro" })
        }
        (Some("net"), Some(mac)) => Ok(DeviceSpec::Net { mac: host_io::parse_mac(mac)? }),
        (Some("rng"), None) => Ok(DeviceSpec::Rng),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_texts_round_trip() {
        for d in [
            DeviceSpec::Disk { size: 1 << 30, readonly: false },
            DeviceSpec::Disk { size: 4096, readonly: true },
            DeviceSpec::Net { mac: [0x52, 0x54, 0, 0x12, 0x34, 0x56] },
            DeviceSpec::Rng,
        ] {
            assert_eq!(parse_device(&device_text(&d)).unwrap(), d);
        }
        assert!(parse_device("floppy").is_err());
        assert!(parse_device("disk:x:rw").is_err());
    }
}
