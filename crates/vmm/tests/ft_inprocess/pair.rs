//! What the in-process fault-tolerance tests are made of: the guest
//! program, a site (a temporary shared directory for the arbiter and the
//! pair's key, a loopback "network" between the two hosts that a test can
//! cut), the backup (`vmm::ft::backup::follow` on a thread, as `ftvm ft
//! backup` runs it up to going live), the primary's host loop (the live
//! loop's turn over a `Primary`, with an in-memory network instead of a
//! TAP), a client on that network, and the checks a failover must pass.
//!
//! The primary's loop is the test's own, not `vmm::live`'s: it runs the
//! same turn (`before_run`, run to `run_target`, `after_run`, `gate`,
//! `after_slice`, the channel's news, `input`) through the same
//! `Primary` interface, but in fixed slices, with no pacing to the wall
//! clock, and it can stop the primary between any two steps (a cut). Its
//! outputs leave as `host_io` lets them: in order, and only while the
//! fence allows.

use ftvm_machine::{DeviceSpec, Event, IoCompletion, IoRequest, Machine, MachineConfig, RunExit};
use ftvm_protection::pair::Mode;
use ftvm_protection::primary::{Alone, Primary};
use ftvm_replay::recorder::{self, Start};
use ftvm_replication::arbiter::{Arbiter, SharedDir, Verdict};
use ftvm_replication::channel::{Failure, PrimaryEvent};
use ftvm_replication::fence::Fence;
use ftvm_vmm::ft::backup::{GoingLive, Outcome};
use ftvm_vmm::ft::{BackupConfig, BackupNic, PairConfig, PairSetup, ProtectConfig};
use ftvm_vmm::host_io::{Backend, HostEvent};
use std::collections::{BTreeMap, HashMap};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Instructions the host loop lets the guest run between two looks at the
/// host: small, so a round of the guest (about 150,000 instructions of
/// work) spans several turns and a cut can fall inside it.
pub const SLICE: u64 = 20_000;
const RAM: u64 = 16 << 20;
const MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
/// The virtio slot of the guest's NIC.
const NIC: usize = 0;
/// The guest's rounds (ROUNDS in guest.c): two frames each, sequence
/// numbers 2 * round (its data) and 2 * round + 1 (the echo of the reply).
pub const ROUNDS: u64 = 12;
/// The last frame's sequence number.
pub const LAST_SEQ: u64 = 2 * ROUNDS + 1;
/// How long anything here waits for the other side before the test
/// fails: generous, the host is shared and loaded.
pub const PATIENCE: Duration = Duration::from_secs(120);
/// The pair's failure timeout: a cut closes the channel, which either
/// side sees at once, so this only bounds a host's stall; long, so that
/// a loaded host never makes a failover of its own.
const TIMEOUT_MS: u64 = 5000;

/// The guest program, built once per test process.
pub struct Guest {
    pub path: PathBuf,
    pub bytes: Vec<u8>,
}

/// Builds `guest.c` with the RISC-V cross compiler (as the ISA tests do).
pub fn guest() -> &'static Guest {
    static GUEST: OnceLock<Guest> = OnceLock::new();
    GUEST.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ft_inprocess");
        // Into the target's directory for tests, built under a name of
        // this process's and renamed: the same bytes every time, so a
        // concurrent run's rename is harmless, and nothing piles up.
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let building = tmp.join(format!("ft-inprocess-guest.{}.elf", std::process::id()));
        let out = tmp.join("ft-inprocess-guest.elf");
        let status = std::process::Command::new("riscv64-linux-gnu-gcc")
            .args(["-O2", "-march=rv64gc", "-mabi=lp64d", "-mcmodel=medany", "-nostdlib", "-ffreestanding"])
            .args(["-fno-pic", "-static", "-Wl,--build-id=none", "-T"])
            .arg(src.join("link.ld"))
            .arg(src.join("start.S"))
            .arg(src.join("guest.c"))
            .arg("-o")
            .arg(&building)
            .status()
            .expect("riscv64-linux-gnu-gcc (scripts/install-deps.sh installs it)");
        assert!(status.success(), "building the guest failed");
        let bytes = std::fs::read(&building).unwrap();
        std::fs::rename(&building, &out).unwrap();
        // The file stays: each test's backup finds the program by hash
        // among its --start-file files.
        Guest { path: out, bytes }
    })
}

fn config(g: &Guest) -> MachineConfig {
    let mut cfg = MachineConfig::bare_metal(g.bytes.clone(), RAM);
    cfg.devices = vec![DeviceSpec::Net { mac: MAC }];
    cfg
}

/// A free port on the loopback (for the heartbeats, which take a fixed
/// port on the backup's address).
fn free_udp_port() -> u16 {
    UdpSocket::bind((BACKUP_HOST, 0)).unwrap().local_addr().unwrap().port()
}

/// The backup's host, on the loopback: 127.0.0.2, the primary's being
/// 127.0.0.1. Two addresses, not one: a backup beats first to its
/// primary's address at the heartbeat port, and answers wherever a beat
/// of the pair's comes from; on one address that is its own socket, which
/// would hear its own beats and answer only itself.
const BACKUP_HOST: &str = "127.0.0.2";

fn free_tcp_addr() -> SocketAddr {
    TcpListener::bind((BACKUP_HOST, 0)).unwrap().local_addr().unwrap()
}

/// The network between the two hosts: the primary's logging channel
/// goes through here to the backup, each byte `LATENCY` late each way,
/// so an acknowledgement comes a round trip after the log it covers (on
/// bare loopback it can come before the run that made an output ends,
/// and an output released too early would go unseen). A cut closes both
/// ends at once, as a dead host's kernel (or a partition noticed by
/// both) would; what was on its way is lost.
pub struct Link {
    pub addr: SocketAddr,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    cut: Arc<AtomicBool>,
}

/// The link's one-way delay.
const LATENCY: Duration = Duration::from_millis(10);

impl Link {
    fn start(to: SocketAddr) -> Link {
        // On the backup's address: the primary beats to the address it
        // connects to.
        let listener = TcpListener::bind((BACKUP_HOST, 0)).unwrap();
        let addr = listener.local_addr().unwrap();
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let cut: Arc<AtomicBool> = Arc::default();
        let (c, k) = (conns.clone(), cut.clone());
        std::thread::spawn(move || {
            for a in listener.incoming() {
                let Ok(a) = a else { return };
                if k.load(Ordering::SeqCst) {
                    return;
                }
                // The backup's thread may not listen yet.
                let deadline = Instant::now() + PATIENCE;
                let b = loop {
                    match TcpStream::connect(to) {
                        Ok(b) => break b,
                        Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                        Err(e) => panic!("the backup does not listen: {e}"),
                    }
                };
                let _ = a.set_nodelay(true);
                let _ = b.set_nodelay(true);
                let mut conns = c.lock().unwrap();
                conns.push(a.try_clone().unwrap());
                conns.push(b.try_clone().unwrap());
                for (from, into) in [(a.try_clone().unwrap(), b.try_clone().unwrap()), (b, a)] {
                    forward(from, into, k.clone());
                }
            }
        });
        Link { addr, conns, cut }
    }

    /// Cuts the link: both sides see their channel close.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for c in self.conns.lock().unwrap().iter() {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

/// Carries what `from` reads to `into`, `LATENCY` late, until either end
/// closes or the link is cut.
fn forward(mut from: TcpStream, mut into: TcpStream, cut: Arc<AtomicBool>) {
    let (tx, rx) = channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 16];
        loop {
            match std::io::Read::read(&mut from, &mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tx.send((Instant::now() + LATENCY, buf[..n].to_vec())).is_err() {
                        return;
                    }
                }
            }
        }
    });
    std::thread::spawn(move || {
        while let Ok((due, bytes)) = rx.recv() {
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            if cut.load(Ordering::SeqCst) || std::io::Write::write_all(&mut into, &bytes).is_err() {
                break;
            }
        }
        let _ = into.shutdown(Shutdown::Both);
    });
}

/// Two hosts' worth of setting: the shared directory (arbiter, pair key),
/// the backup's address and heartbeat port, the link between them, and
/// each side's journal of events.
pub struct Site {
    pub dir: PathBuf,
    pub listen: SocketAddr,
    pub heartbeat_port: u16,
    pub link: Link,
}

impl Site {
    pub fn new(name: &str) -> Site {
        // Removed when dropped; a failed test's may stay, in the target.
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("ft-inprocess-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("shared")).unwrap();
        let listen = free_tcp_addr();
        Site { link: Link::start(listen), dir, listen, heartbeat_port: free_udp_port() }
    }

    pub fn shared(&self) -> PathBuf {
        self.dir.join("shared")
    }

    fn pair_args(&self, side: &str) -> PairConfig {
        PairConfig {
            shared: Some(self.shared()),
            etcd: None,
            etcd_credentials: None,
            vm_name: None,
            timeout: TIMEOUT_MS,
            min_timeout: TIMEOUT_MS,
            heartbeat_port: self.heartbeat_port,
            events: Some(self.journal(side)),
            pair_key: None,
            isolation_addresses: Vec::new(),
            isolation_defer: 3000,
            host_id: Some(format!("ft-inprocess-{side}")),
            no_isolation_check: true,
        }
    }

    fn journal(&self, side: &str) -> PathBuf {
        self.dir.join(format!("{side}.events"))
    }

    /// The events a side emitted, by name, in order.
    pub fn events(&self, side: &str) -> Vec<String> {
        let text = std::fs::read_to_string(self.journal(side)).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| v.get("event").and_then(|e| e.as_str()).map(str::to_string))
            .collect()
    }

    pub fn primary_args(&self, mode: Mode) -> ProtectConfig {
        ProtectConfig {
            backup: self.link.addr,
            lag_threshold: 1000,
            connect_wait: PATIENCE.as_secs(),
            disk_sharing: None,
            backup_reads: false,
            mode,
            epoch_length: None,
            epoch_protocol: None,
            interval: (mode == Mode::Checkpoint).then_some(5),
            no_idle_checkpoints: false,
            pair: self.pair_args("primary"),
        }
    }

    /// The backup, following on a thread of its own until it goes live
    /// (or the VM ends, or it halts).
    pub fn start_backup(&self) -> JoinHandle<Result<Outcome, String>> {
        // The key first, so the two sides do not race to make it.
        self.pair_args("primary").key().unwrap();
        let args = BackupConfig {
            listen: self.listen,
            // One TAP name per NIC is required; it is opened only when
            // going live, which these tests do themselves.
            nets: vec![BackupNic { tap: "ftvm-test0".into(), bridge: None }],
            control: None,
            show_console: false,
            disks: Vec::new(),
            start_files: vec![guest().path.clone()],
            ack_delay: 0,
            pair: self.pair_args("backup"),
        };
        std::thread::spawn(move || ftvm_vmm::ft::backup::follow(&args).map_err(|e| e.to_string()))
    }

    /// The arbiter of generation `generation` on this site's storage.
    pub fn arbiter(&self, generation: u64) -> Arbiter {
        Arbiter::new(SharedDir::store(&self.shared()), generation)
    }
}

impl Drop for Site {
    fn drop(&mut self) {
        self.link.cut();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The client on the guest's network: it answers every data frame it
/// sees (an even sequence number) with a frame carrying a nonce it never
/// used before (a new request), and keeps every frame it saw. A frame the
/// guest sends depends on the nonce it last received, so a client that
/// saw two different frames of one sequence number saw a state of the VM
/// that the side still running does not have.
#[derive(Default)]
pub struct Client {
    /// Every frame the client received, in order, with where it came from.
    pub seen: Vec<(&'static str, Vec<u8>)>,
    /// Replies not yet delivered.
    pub inbox: Vec<Vec<u8>>,
    replies: u64,
    last: Option<Vec<u8>>,
}

/// A guest frame's sequence number (its payload's first word).
pub fn seq_of(frame: &[u8]) -> u64 {
    u64::from_le_bytes(frame[14..22].try_into().unwrap())
}

impl Client {
    /// Sends the last reply again (a retransmission: the same nonce).
    fn retransmit(&mut self) {
        let last = self.last.clone().expect("the client has replied before");
        self.inbox.push(last);
    }

    fn receive(&mut self, from: &'static str, frame: Vec<u8>) {
        if seq_of(&frame) % 2 == 1 {
            // An echo: nothing to answer.
            self.seen.push((from, frame));
            return;
        }
        self.replies += 1;
        let mut reply = vec![0u8; 60];
        reply[..6].copy_from_slice(&MAC);
        reply[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 1]);
        reply[12..14].copy_from_slice(&[0x88, 0xb5]);
        let nonce = 0x5eed_0000_0000_0000 | (self.replies << 16) | seq_of(&frame);
        reply[14..22].copy_from_slice(&nonce.to_le_bytes());
        self.last = Some(reply.clone());
        self.inbox.push(reply);
        self.seen.push((from, frame));
    }

    /// The conversation as the client saw it holds together: all frames
    /// of one sequence number are the same (a side going live may send
    /// again what the other sent, never something else), they come in
    /// order up to `last_seq`, and one is missing only if it is in `lost`: made and
    /// held by a primary that died, which a backup going live past it
    /// does not send (a frame is a network's to lose; a guest's TCP would
    /// send it again).
    pub fn check_conversation(&self, last_seq: u64, lost: &[u64]) {
        let mut by_seq: BTreeMap<u64, &Vec<u8>> = BTreeMap::new();
        let mut last = 0;
        for (from, f) in &self.seen {
            let r = seq_of(f);
            let skipped: Vec<u64> = (last.max(1) + 1..r).filter(|s| !lost.contains(s)).collect();
            assert!(r >= 2 && skipped.is_empty(), "frame {r} from the {from} after frame {last}: {}", self.describe());
            if let Some(before) = by_seq.insert(r, f) {
                assert_eq!(
                    before,
                    f,
                    "the client saw two different frames {r}: the {from} sent one the other side had \
                     not covered (the Output Rule broken): {}",
                    self.describe()
                );
            }
            last = last.max(r);
        }
        assert_eq!(last, last_seq, "the conversation ended at frame {last}: {}", self.describe());
    }

    fn describe(&self) -> String {
        let seqs: Vec<String> = self.seen.iter().map(|(from, f)| format!("{}:{}", &from[..1], seq_of(f))).collect();
        seqs.join(" ")
    }
}

/// The primary's host: its machine, its side of the pair, the network
/// its outputs go to, and what the test records to check against the
/// backup (the machine's state at every point a go-live point or a
/// checkpoint may fall on, and every frame released).
pub struct PrimaryHost {
    pub m: Machine,
    pub primary: Option<Box<dyn Primary<Machine>>>,
    fence: Fence,
    host_events: Receiver<HostEvent>,
    /// Outputs the pair let go, waiting for the fence (as in `host_io`).
    outbox: Vec<Vec<u8>>,
    pub client: Client,
    /// Frames the guest made, and those that left the host, as
    /// (instruction count, round): where the run that made it ended, and
    /// where the machine stood when it left.
    pub made: Vec<(u64, u64)>,
    pub released: Vec<(u64, u64)>,
    /// Frames from the client the guest was given.
    pub delivered: u64,
    /// The state hash at each instruction count where the loop stood
    /// between runs (several where inputs went in there).
    states: HashMap<u64, Vec<[u8; 32]>>,
    pub console: Vec<u8>,
    /// The arbiter's verdict when this side declared its backup failed.
    pub lost_backup: Option<Result<(), String>>,
    pub exit: Option<RunExit>,
    /// The pair's generation.
    pub generation: u64,
}

impl PrimaryHost {
    /// A primary that boots the guest protected from its first
    /// instruction (`ftvm ft primary`: `vmm::ft::start_primary`).
    pub fn boot(site: &Site, mode: Mode) -> PrimaryHost {
        let g = guest();
        let m = Machine::new(&config(g)).unwrap();
        let (tx, host_events) = channel();
        let fence = Fence::leased();
        let args = site.primary_args(mode);
        let mut header = recorder::header(
            &m,
            RAM,
            ftvm_machine::DEFAULT_GUEST_IPS,
            &backends(),
            Start::Boot { firmware: None, kernel: (&g.path, &g.bytes), initrd: None, cmdline: "", seed: None },
        );
        let events = ftvm_protection::events::Events::with_file(&site.journal("primary")).unwrap();
        let primary = ftvm_vmm::ft::start_primary(&args, &mut header, tx, &events, fence.clone()).unwrap();
        let mut host = PrimaryHost::new(m, fence, host_events);
        host.primary = Some(primary);
        host.generation = generation(&mut host);
        host
    }

    /// A VM that runs alone, booted.
    pub fn alone() -> PrimaryHost {
        let (_, host_events) = channel();
        PrimaryHost::new(Machine::new(&config(guest())).unwrap(), Fence::alone(), host_events)
    }

    fn new(m: Machine, fence: Fence, host_events: Receiver<HostEvent>) -> PrimaryHost {
        PrimaryHost {
            m,
            primary: None,
            fence,
            host_events,
            outbox: Vec::new(),
            client: Client::default(),
            made: Vec::new(),
            released: Vec::new(),
            delivered: 0,
            states: HashMap::new(),
            console: Vec::new(),
            lost_backup: None,
            exit: None,
            generation: 0,
        }
    }

    /// `protect` on a VM that runs alone: the pair set up as
    /// `vmm::ft::protect` sets it up (a new generation, the channel, the
    /// header with the machine streamed after it), and the transfer that
    /// sends the machine across while the guest runs.
    pub fn protect(&mut self, site: &Site, mode: Mode) {
        let (tx, host_events) = channel();
        self.host_events = host_events;
        self.fence = Fence::leased();
        let args = site.primary_args(mode);
        let mut header = recorder::header(&self.m, RAM, ftvm_machine::DEFAULT_GUEST_IPS, &backends(), Start::Streamed);
        let events = ftvm_protection::events::Events::with_file(&site.journal("primary")).unwrap();
        let transfer = ftvm_vmm::ft::protect::connect(&args, &mut header, tx, &events, self.fence.clone()).unwrap();
        self.primary = Some(transfer as Box<dyn Primary<Machine>>);
    }

    fn note_state(&mut self) {
        let hashes = self.states.entry(self.m.icount()).or_default();
        let h = self.m.state_hash();
        if !hashes.contains(&h) {
            hashes.push(h);
        }
    }

    /// Whether the machine was in the state `hash` at instruction `icount`
    /// between two runs.
    pub fn was_in(&self, icount: u64, hash: [u8; 32]) -> bool {
        self.states.get(&icount).is_some_and(|h| h.contains(&hash))
    }

    /// One turn of the host loop (see `vmm::live`'s main loop). `stop`
    /// is asked right after the pair gated the run's requests (where an
    /// output is held, before any acknowledgement is taken in) and at the
    /// turn's end; the turn stops there when it says so.
    fn turn(&mut self, stop: &mut dyn FnMut(&PrimaryHost) -> bool) -> Turn {
        if self.exit.is_some() || matches!(self.lost_backup, Some(Err(_))) {
            return Turn::Ended;
        }
        if let Some(p) = &mut self.primary {
            p.before_run(&mut self.m, false).unwrap();
        }
        self.note_state();
        let look_at = self.m.icount() + SLICE;
        let target = self.primary.as_ref().map_or(look_at, |p| p.run_target(self.m.icount(), look_at));
        let started = Instant::now();
        let exit = self.m.run_until(target);
        let busy = started.elapsed();
        let due = self.primary.as_mut().map_or_else(Vec::new, |p| p.after_run(&self.m, &exit));
        if !due.is_empty() {
            // An epoch's end, with the inputs that waited for it: a backup
            // whose primary died before the frame that carries them goes
            // live here, before them.
            self.note_state();
        }
        for ev in due {
            self.inject(ev);
        }
        let requests = self.m.take_io_requests();
        self.dispatch(requests);
        if stop(self) {
            // Where the run ended (an epoch's end, say) may be where the
            // backup goes live.
            self.note_state();
            return Turn::Stopped;
        }
        if let Some(p) = &mut self.primary {
            // The pause the lag control asks for is not taken: the
            // backup runs on the same host and keeps up.
            let _pause = p.after_slice(&mut self.m, busy, matches!(exit, RunExit::Idle { .. })).unwrap();
        }
        self.note_state();
        if self.primary.as_ref().is_some_and(|p| p.successor_due()) {
            self.succeed();
        }
        self.console.extend(self.m.take_console_output());
        while let Ok(ev) = self.host_events.try_recv() {
            match ev {
                HostEvent::Replication(PrimaryEvent::Acked) => self.dispatch(Vec::new()),
                // Lost at the arbiter: this side halts.
                HostEvent::Replication(PrimaryEvent::BackupLost(failure)) if !self.backup_lost(&failure) => {
                    return Turn::Ended;
                }
                _ => {}
            }
        }
        self.feed_inputs();
        self.flush();
        if let RunExit::PowerOff(_) = exit {
            self.exit = Some(exit);
            return Turn::Ended;
        }
        if stop(self) {
            return Turn::Stopped;
        }
        Turn::On
    }

    /// The backup is declared failed: this side asks the arbiter.
    /// Returns false if it lost (it halts: nothing it held may leave).
    fn backup_lost(&mut self, failure: &Failure) -> bool {
        let Some(p) = &mut self.primary else { return true };
        if !p.stream_failed() {
            return true;
        }
        match p.peer_lost(failure) {
            Ok(alone) => {
                self.lost_backup = Some(Ok(()));
                self.run_alone(alone);
                true
            }
            Err(e) => {
                self.lost_backup = Some(Err(e.to_string()));
                self.primary = None;
                self.outbox.clear();
                false
            }
        }
    }

    /// Waits, the machine stopped, for the news that the backup failed
    /// and asks the arbiter at once (the loop takes it only between two
    /// runs, by when the backup has usually claimed).
    pub fn contend_at_once(&mut self) {
        let deadline = Instant::now() + PATIENCE;
        while self.lost_backup.is_none() {
            let wait = deadline.saturating_duration_since(Instant::now());
            match self.host_events.recv_timeout(wait) {
                Ok(HostEvent::Replication(PrimaryEvent::BackupLost(failure))) => {
                    self.backup_lost(&failure);
                }
                // Acknowledgements: what they let go waits in the gate.
                Ok(_) => {}
                Err(e) => panic!("no news of the backup's failure: {e}"),
            }
        }
    }

    fn run_alone(&mut self, alone: Alone) {
        self.primary = None;
        self.take_released(alone.outputs);
        for ev in alone.inputs {
            self.inject(ev);
        }
    }

    fn inject(&mut self, ev: Event) {
        if let Event::Io { completion: IoCompletion::NetRx { .. }, .. } = &ev {
            self.delivered += 1;
        }
        self.m.inject(ev);
    }

    /// The client's replies go in where the pair accepts inputs and the
    /// guest has a buffer for them.
    fn feed_inputs(&mut self) {
        while !self.client.inbox.is_empty()
            && self.m.input_ready(NIC)
            && self.primary.as_ref().is_none_or(|p| p.accepts_inputs())
        {
            let frame = self.client.inbox.remove(0);
            let ev = Event::Io { slot: NIC, completion: IoCompletion::NetRx { frame } };
            let ev = match &mut self.primary {
                Some(p) => p.input(self.m.icount(), ev),
                None => Some(ev),
            };
            if let Some(ev) = ev {
                self.inject(ev);
            }
        }
    }

    fn dispatch(&mut self, requests: Vec<(usize, IoRequest)>) {
        for (_, r) in &requests {
            if let IoRequest::NetTx { frame } = r {
                self.made.push((self.m.icount(), seq_of(frame)));
            }
        }
        let out = match &mut self.primary {
            Some(p) => p.gate(requests, self.m.icount()),
            None => requests,
        };
        self.take_released(out);
    }

    fn take_released(&mut self, out: Vec<(usize, IoRequest)>) {
        for (_, r) in out {
            match r {
                IoRequest::NetTx { frame } => self.outbox.push(frame),
                other => panic!("the guest made a request it has no device for: {other:?}"),
            }
        }
        self.flush();
    }

    /// Outputs leave in order while the fence allows (`host_io`).
    fn flush(&mut self) {
        while !self.outbox.is_empty() && self.fence.allows() {
            let frame = self.outbox.remove(0);
            self.released.push((self.m.icount(), seq_of(&frame)));
            self.client.receive("primary", frame);
        }
    }

    /// A transfer's final pause (`Live::succeed`): nothing is in flight
    /// (a NIC's transmit completes at once), so the transfer hands over
    /// to the pair it starts.
    fn succeed(&mut self) {
        let requests = self.m.take_io_requests();
        self.dispatch(requests);
        assert!(!self.m.io_pending());
        let transfer = self.primary.take().unwrap();
        let (pair, _) = transfer.succeed(&mut self.m, &mut |_| Ok(())).unwrap();
        self.primary = Some(pair);
        self.generation = generation(self);
    }

    /// Runs turns until `stop` says so (true) or the VM ends (false).
    pub fn run_until(&mut self, mut stop: impl FnMut(&PrimaryHost) -> bool) -> bool {
        let deadline = Instant::now() + PATIENCE;
        loop {
            match self.turn(&mut stop) {
                Turn::On => {}
                Turn::Stopped => return true,
                Turn::Ended => return false,
            }
            assert!(Instant::now() < deadline, "the primary's run took over {PATIENCE:?}");
        }
    }

    /// A planned handover (`Live::hand_over`): at a point where inputs may
    /// be delivered, the held outputs go once the backup has what
    /// produced them, then the stream ends with the handover and this
    /// side waits for the backup's claim.
    pub fn hand_over(&mut self) {
        let deadline = Instant::now() + PATIENCE;
        while !self.primary.as_ref().unwrap().accepts_inputs() {
            assert!(matches!(self.turn(&mut |_| false), Turn::On) && Instant::now() < deadline);
        }
        let p = self.primary.as_mut().unwrap();
        let out = p.hand_over(&mut self.m).unwrap();
        self.take_released(out);
        // The client's answer to what just left goes into the stream
        // before it ends (the live loop takes in what comes meanwhile).
        self.feed_inputs();
        self.note_state();
        let p = self.primary.as_mut().unwrap();
        match p.hand_over_end(&mut self.m) {
            Ok(ftvm_protection::primary::HandOver::Done { .. }) => {
                self.primary = None;
                // Nothing more leaves this side.
                self.outbox.clear();
            }
            Ok(ftvm_protection::primary::HandOver::Kept(_)) => panic!("the backup failed during the handover"),
            Err(e) => panic!("the handover failed: {e}"),
        }
    }

    /// The primary dies where it stands: the network to its backup goes
    /// first (nothing it had not sent yet gets through), then the side
    /// itself, which neither contends nor releases anything more.
    pub fn crash(&mut self, site: &Site) -> u64 {
        site.link.cut();
        drop(self.primary.take());
        self.outbox.clear();
        self.m.icount()
    }
}

/// How a turn of the primary's loop ended.
enum Turn {
    On,
    /// The test's condition held: the loop stops there.
    Stopped,
    /// The guest powered off, or this side halted.
    Ended,
}

fn generation(host: &mut PrimaryHost) -> u64 {
    let status = host.primary.as_mut().and_then(|p| p.status());
    match status {
        Some(ftvm_protection::status::PairStatus::Primary(p)) => p.generation,
        _ => 0,
    }
}

/// The backends as the header names them (a TAP for the NIC: the backup
/// counts them; no test opens it).
fn backends() -> String {
    ftvm_vmm::host_io::describe(&[Backend::Tap { name: "ftvm-test0".into(), mac: MAC, bridge: None }])
}

/// Waits for the backup's thread and returns the VM it goes live with.
pub fn went_live(backup: JoinHandle<Result<Outcome, String>>) -> GoingLive {
    match join(backup) {
        Ok(Outcome::Live(live)) => *live,
        Ok(Outcome::Ended(status)) => panic!("the backup saw the VM end ({status:?}) instead of going live"),
        Err(e) => panic!("the backup did not go live: {e}"),
    }
}

pub fn join<T>(h: JoinHandle<T>) -> T {
    let deadline = Instant::now() + PATIENCE;
    while !h.is_finished() {
        assert!(Instant::now() < deadline, "the backup's run took over {PATIENCE:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    h.join().expect("the backup's thread panicked")
}

/// Turns of silence from the guest after which the client sends its
/// last reply again (a million instructions: the guest computes a round
/// in about 150,000).
const RETRANSMIT_TURNS: u32 = 50;

/// The backup, live: its machine runs on as the live loop would run it
/// (the frames its primary never delivered given first), serving the same
/// client, until the guest powers off.
pub fn run_live(live: GoingLive, client: &mut Client) -> (Machine, Vec<u8>) {
    let GoingLive { mut machine, setup, .. } = live;
    let mut inbox: Vec<Vec<u8>> = setup.undelivered.into_iter().map(|(_, f)| f).collect();
    inbox.append(&mut client.inbox);
    let mut console = Vec::new();
    let deadline = Instant::now() + PATIENCE;
    let mut quiet = 0;
    loop {
        assert!(Instant::now() < deadline, "the live backup's run took over {PATIENCE:?}");
        let exit = machine.run_until(machine.icount() + SLICE);
        quiet += 1;
        for (_, r) in machine.take_io_requests() {
            if let IoRequest::NetTx { frame } = r {
                client.receive("backup", frame);
                quiet = 0;
            }
        }
        if quiet == RETRANSMIT_TURNS && inbox.is_empty() && client.inbox.is_empty() {
            // The guest waits for a reply the client sent to the dead
            // primary: the client sends it again, as TCP would.
            client.retransmit();
            quiet = 0;
        }
        inbox.append(&mut client.inbox);
        while !inbox.is_empty() && machine.input_ready(NIC) {
            let frame = inbox.remove(0);
            machine.inject(Event::Io { slot: NIC, completion: IoCompletion::NetRx { frame } });
        }
        console.extend(machine.take_console_output());
        if let RunExit::PowerOff(code) = exit {
            assert_eq!(code, 0, "the guest's exit status");
            return (machine, console);
        }
    }
}

/// What every failover must show. `cut`: the instruction count the
/// primary stopped at. Returns where the backup went live.
pub fn check_failover(site: &Site, mut host: PrimaryHost, live: GoingLive, cut: u64, mode: Mode) -> u64 {
    let at = live.machine.icount();
    let hash = live.machine.state_hash();
    if at <= cut {
        // The backup goes live at a point the primary passed: the last
        // go-live point (or checkpoint) it had whole, in the very state
        // the primary was in there.
        assert!(host.was_in(at, hash), "the backup's state at instruction {at} is none the primary was in there");
    } else {
        // In epoch mode an input goes in only at an epoch's end, so a
        // backup whose primary died inside an epoch runs the rest of it
        // (nothing can come in before its end) and goes live there: the
        // state the dead primary's machine, run on alone, reaches there.
        assert_eq!(mode, Mode::Epoch, "the backup went live at {at}, past the primary's cut at {cut}");
        assert_eq!(host.m.run_until(at), RunExit::Reached);
        host.m.take_io_requests();
        assert!(host.m.state_hash() == hash, "the backup's state at the epoch's end {at} is not the primary's");
    }
    if mode == Mode::Checkpoint {
        // The Output Rule in checkpoint mode: a frame leaves only once the
        // checkpoint after it is acknowledged, so the backup's checkpoint
        // is past every frame released.
        for &(_, seq) in &host.released {
            let made = host.made.iter().find(|(_, r)| *r == seq).expect("a frame released was made").0;
            assert!(made <= at, "frame {seq}, made by {made}, left before the checkpoint after it ({at})");
        }
    }
    // Exactly one side went live: the backup won the generation, and the
    // primary, were it to come back and contend, loses.
    let arbiter = site.arbiter(host.generation);
    let winner = arbiter.winner().expect("a winner at the arbiter");
    assert!(winner.starts_with("backup on"), "the arbiter's winner is {winner}");
    match arbiter.go_live("primary on the cut host", |_| {}) {
        Verdict::Lost(w) => assert_eq!(w, winner),
        Verdict::Won => panic!("the cut primary won the arbiter after its backup went live"),
    }
    let backup_events = site.events("backup");
    assert!(backup_events.iter().any(|e| e == "arbiter_won"), "backup events: {backup_events:?}");
    assert!(!site.events("primary").iter().any(|e| e == "arbiter_won"));
    // The VM lives on: the backup finishes the guest's conversation with
    // the client, which must hold together across the failover (the
    // Output Rule: nothing the client saw is missing from the backup).
    let (_, console) = run_live(live, &mut host.client);
    // Only in epoch mode may the backup go live past an output its
    // primary held (at the end of the epoch the primary died in).
    let lost: Vec<u64> = match mode {
        Mode::Epoch => {
            let made = host.made.iter().map(|&(_, r)| r);
            made.filter(|r| !host.released.iter().any(|(_, x)| x == r)).collect()
        }
        _ => Vec::new(),
    };
    host.client.check_conversation(LAST_SEQ, &lost);
    let console = String::from_utf8_lossy(&console);
    assert!(console.ends_with("guest: done\n"), "the live backup's console: {console}");
    at
}
