//! Recording: the inputs of a running VM written to a replay log, and the
//! log header that names the machine and its starting state.
//!
//! Every event the host loop injects is logged at the instruction count
//! where it took effect. Before each run of the machine the recorder closes
//! the frame of entries with a go-live point, and about every 100 ms of
//! guest time it logs the machine's chained state digest for replay to
//! check against. The log goes to any byte stream: a file (`ftvm record`)
//! or the logging channel to a backup (lockstep and epoch mode).

use crate::{Entry, Header, LogWriter, Record};
use ftvm_machine::layout::TIMEBASE_HZ;
use ftvm_machine::mac::{format_mac, parse_mac};
use ftvm_machine::{DeterministicEngine, DeviceSpec, Event, IoCompletion, Machine};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

/// Guest time between two state digests.
pub const DIGEST_TICKS: u64 = TIMEBASE_HZ / 10;

/// A log that could not be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot write log {log}: {source}")]
pub struct RecordError {
    /// The file, or the backup's address, as messages name it.
    pub log: String,
    #[source]
    pub source: std::io::Error,
}

pub struct Recorder<W: Write> {
    log: LogWriter<W>,
    /// The file, or the backup's address, for messages.
    name: String,
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
    /// Control entries waiting for the next frame's close.
    controls: Vec<Vec<u8>>,
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

impl<W: Write> Recorder<W> {
    /// A recorder writing to `sink`, the header first. `name` says where
    /// the log goes, for messages; `go_live_every`: see the field.
    pub fn new(sink: W, header: &Header, name: String, go_live_every: Option<Duration>) -> std::io::Result<Self> {
        Ok(Recorder::with_log(LogWriter::new(sink, header)?, name, go_live_every))
    }

    /// A recorder that goes on in a stream whose header (and, after it,
    /// the machine it starts from) is already in `sink`, `written` bytes
    /// of it: for a running VM given a backup, whose log starts where the
    /// transfer of the machine ended.
    pub fn resume(sink: W, written: u64, name: String, go_live_every: Option<Duration>) -> Self {
        Recorder::with_log(LogWriter::resume(sink, written), name, go_live_every)
    }

    fn with_log(log: LogWriter<W>, name: String, go_live_every: Option<Duration>) -> Self {
        Recorder {
            log,
            name,
            next_digest: 0,
            sizes: EntrySizes::default(),
            go_live_every,
            last_frame: Instant::now(),
            omit_read_data: false,
            controls: Vec::new(),
        }
    }

    /// Bytes of log written so far in complete frames: what an output
    /// produced now depends on.
    pub fn logged(&self) -> u64 {
        self.log.bytes_written()
    }

    /// Where the log goes, given up by a recorder that wrote only the
    /// header (checkpoint mode sends something else after it).
    pub fn into_sink(self) -> W {
        self.log.into_sink()
    }

    /// Where the log goes.
    pub fn sink(&self) -> &W {
        self.log.sink()
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

    /// Sends a frame received on NIC `slot` that waits for a point where
    /// inputs are delivered (an epoch's end) at once, beside the log
    /// (`log`'s doc): the next frame must deliver it.
    pub fn waiting(&mut self, slot: usize, frame: Vec<u8>) -> Result<(), RecordError> {
        self.log.waiting(slot, frame).map_err(|e| self.error(e))
    }

    /// Leaves the data of successful disk reads out of the log from now
    /// on: the backup reads it from the disk itself.
    pub fn omit_read_data(&mut self) {
        self.omit_read_data = true;
    }

    /// A control entry for the follower (opaque here), logged where the
    /// next frame closes: at a go-live point, where a follower that runs
    /// ahead to the end of an epoch stands too, never inside one.
    pub fn control(&mut self, payload: Vec<u8>) {
        self.controls.push(payload);
    }

    fn push(&mut self, r: Record) {
        let bytes = self.log.push(&r);
        self.sizes.add(&r.entry, bytes);
    }

    /// Called before the machine runs on: a digest when one is due, then
    /// a go-live point if anything was logged since the last one (or if
    /// none went out for `go_live_every`).
    pub fn close_frame(&mut self, m: &mut dyn DeterministicEngine) -> Result<(), RecordError> {
        let quiet = self.go_live_every.is_some_and(|k| self.last_frame.elapsed() >= k);
        self.close(m, quiet)
    }

    /// At the end of an epoch: a digest when one is due, then the epoch's
    /// end mark ([end, E]), a go-live point, whatever the epoch logged.
    pub fn end_epoch(&mut self, m: &mut dyn DeterministicEngine) -> Result<(), RecordError> {
        self.close(m, true)
    }

    fn close(&mut self, m: &mut dyn DeterministicEngine, always: bool) -> Result<(), RecordError> {
        if m.time() >= self.next_digest {
            let d = m.state_digest();
            self.push(Record { icount: m.icount(), entry: Entry::StateHash(d) });
            self.next_digest = m.time() + DIGEST_TICKS;
        }
        for payload in std::mem::take(&mut self.controls) {
            self.push(Record { icount: m.icount(), entry: Entry::Control(payload) });
        }
        if self.log.has_pending() || always {
            self.log.go_live(m.icount()).map_err(|e| self.error(e))?;
            self.last_frame = Instant::now();
        }
        Ok(())
    }

    /// Ends the log with the final state digest, so a replay proves it
    /// reached the same final state, and the end mark. `end` finishes
    /// with the sink (a file synced, a backup's acknowledgement awaited)
    /// and says how many bytes the log took. Prints what the log holds.
    pub fn finish(
        mut self,
        m: &mut dyn DeterministicEngine,
        status: Option<u32>,
        end: impl FnOnce(W) -> std::io::Result<u64>,
    ) -> Result<(), RecordError> {
        let d = m.state_digest();
        self.push(Record { icount: m.icount(), entry: Entry::StateHash(d) });
        let name = self.name.clone();
        let fail = |e: std::io::Error| RecordError { log: name.clone(), source: e };
        let out = self.log.finish(m.icount(), status).map_err(fail)?;
        let written = end(out).map_err(fail)?;
        let z = &self.sizes;
        eprintln!(
            "ftvm: recorded {} instructions, {written} bytes of log (disk completions {}, received frames {}, \
             clock {}, state digests {}, other entries and framing {}), {} state checks, in {name}",
            m.icount(),
            z.disk,
            z.network,
            z.clock,
            z.digests,
            written - z.disk - z.network - z.clock - z.digests,
            z.digest_count,
        );
        Ok(())
    }

    /// Ends the log where the machine stands with a hand-over entry (the
    /// VM goes on from there on the other side). Nothing may be logged
    /// after it; the caller waits for the sink to deliver it. No last
    /// state digest, unlike [`Recorder::finish`]: hashing a large guest's
    /// RAM on both sides would add tens of milliseconds to the client's
    /// pause, and the digests along the way have checked the replay.
    pub fn hand_over(&mut self, m: &mut dyn DeterministicEngine) -> Result<(), RecordError> {
        self.log.hand_over(m.icount()).map_err(|e| self.error(e))
    }

    fn error(&self, e: std::io::Error) -> RecordError {
        RecordError { log: self.name.clone(), source: e }
    }
}

/// The header's `start` of a machine streamed after it ([`Start::Streamed`]).
pub const STREAMED: &str = "streamed";

/// How the recorded machine started.
pub enum Start<'a> {
    Boot {
        firmware: Option<(&'a Path, &'a [u8])>,
        kernel: (&'a Path, &'a [u8]),
        initrd: Option<(&'a Path, &'a [u8])>,
        cmdline: &'a str,
        /// The machine's seed (`MachineConfig::seed`), kept in hex: it
        /// has lines, a header's value is one.
        seed: Option<&'a str>,
    },
    Snapshot {
        path: &'a Path,
        bytes: &'a [u8],
    },
    /// A running VM given a backup (its protection began mid-run): the
    /// stream carries the machine itself after the header, pre-copied
    /// while it ran and completed in a final pause (`protection::transfer`),
    /// and the log starts where that pause stopped it.
    Streamed,
}

fn file_field(path: &Path, bytes: &[u8]) -> String {
    format!("{} {}", blake3::hash(bytes).to_hex(), path.display())
}

/// The header of a log: machine, devices, backends (the host's
/// description of what serves each slot, a line each), start, state hash.
pub fn header(m: &Machine, ram_size: u64, guest_ips: u64, backends: &str, start: Start) -> Header {
    let mut h = Header::default();
    h.set("ftvm", env!("CARGO_PKG_VERSION"));
    // The RTC's base is the host's choice (its clock when the VM was
    // created, or when a snapshot was restored): the replay or the backup
    // takes it from here, never from its own clock.
    let rtc = m.rtc_base_ns();
    // The optional CPU extensions (`ext=`, see `Extensions::text`), which
    // the replay must build the machine with: a header without them is
    // from a build before them.
    let ext = m.extensions().text();
    h.set("machine", format!("harts={} ram={ram_size} ips={guest_ips} rtc_base_ns={rtc} ext={ext}", m.harts().len()));
    h.set("devices", m.devices().iter().map(device_text).collect::<Vec<_>>().join(";"));
    h.set("backends", backends.trim_end().replace('\n', ";"));
    match start {
        Start::Boot { firmware, kernel, initrd, cmdline, seed } => {
            h.set("start", "boot");
            h.set("firmware", firmware.map_or("none".into(), |(p, b)| file_field(p, b)));
            h.set("kernel", file_field(kernel.0, kernel.1));
            h.set("initrd", initrd.map_or("none".into(), |(p, b)| file_field(p, b)));
            h.set("cmdline", cmdline);
            // Only when there is one: a log without it reads in a build
            // before the seed, as one with it does not.
            if let Some(seed) = seed {
                h.set("seed", hex(seed.as_bytes()));
            }
        }
        Start::Snapshot { path, bytes } => {
            h.set("start", "snapshot");
            h.set("snapshot", file_field(path, bytes));
        }
        // The machine's state is known only at the end of the transfer,
        // which checks it whole (its record's checksum, then the state
        // digests of the log that follows).
        Start::Streamed => {
            h.set("start", STREAMED);
            return h;
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
        DeviceSpec::Net { mac } => format!("net:{}", format_mac(mac)),
        DeviceSpec::Rng => "rng".into(),
    }
}

/// A device in a log header that is not one [`device_text`] writes.
#[derive(Debug, thiserror::Error)]
#[error("unreadable device '{0}'")]
pub struct DeviceTextError(pub String);

pub fn parse_device(s: &str) -> Result<DeviceSpec, DeviceTextError> {
    let bad = || DeviceTextError(s.to_string());
    let mut p = s.splitn(2, ':');
    match (p.next(), p.next()) {
        (Some("disk"), Some(rest)) => {
            let (size, mode) = rest.split_once(':').ok_or_else(bad)?;
            Ok(DeviceSpec::Disk { size: size.parse().map_err(|_| bad())?, readonly: mode == "ro" })
        }
        (Some("net"), Some(mac)) => Ok(DeviceSpec::Net { mac: parse_mac(mac).map_err(|_| bad())? }),
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
