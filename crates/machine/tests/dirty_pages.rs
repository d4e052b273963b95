//! Dirty-page tracking on the real guest: a program that writes a known set
//! of pages shows exactly those pages (plus the kernel's own) as dirty.
//!
//! Boots the default Debian image in-process (one hart, 256 MiB, a private
//! sparse copy of the root disk, disk requests served inline, fast time)
//! with an exec command that prints marker lines between phases. The host
//! runs in steps and acts when a marker appears on the console; each marker
//! is followed by a `sleep`, so the guest idles (and the host has seen the
//! marker) before the next phase starts.
//!
//! From `MARK-A` on, the host *watches*: at every checkpoint (every step of
//! half a million instructions, each idle exit, and right before and right
//! after each disk completion it injects) it takes the dirty set and
//! compares guest RAM with a copy from the previous checkpoint: every page
//! whose contents changed must be in the set. That catches writes that go
//! unrecorded (a store through a translation cached before the set was
//! taken, DMA that does not mark) in every interval, not only in the union.
//!
//! * `MARK-A`: start watching.
//! * The guest writes 64 pages of a file in `/dev/shm` (tmpfs: the page
//!   cache is the file), page k filled with the 32-byte line
//!   `FTVM-DIRTY-PAGE-<k>-abcdefghijk`, k = 1000..1063, then spins in a
//!   shell loop (user-mode stores with no system calls, across many
//!   checkpoints).
//! * `MARK-B`: D1 = the dirty sets since `MARK-A`. Every pattern page is
//!   found in RAM by its contents, and every page holding one is in D1.
//! * `sleep 2`; `MARK-C`: D2 = the dirty sets since `MARK-B`. The pattern
//!   pages, which nobody wrote since, are not in it (the tracker does not
//!   just report everything). Then tracking is turned off.
//! * `sleep 1`; `MARK-D`; the guest spins in the shell loop again. Five
//!   million instructions into it, with tracking still off, the dirty set
//!   is empty although the guest changed RAM (negative control). Tracking
//!   is turned back on right there, in the middle of the loop, with no take
//!   in between (a take flushes cached store translations; turning tracking
//!   on must do so itself, or stores through translations cached while it
//!   was off would go unrecorded: the next checkpoints would see them).
//! * The guest reads ~5.7 MiB of files the boot did not touch (virtio-blk
//!   DMA into the page cache); `MARK-E`: the pages each completion changed
//!   were reported by the take right after it (nothing ran in between, so
//!   CPU stores cannot stand in for DMA: the kernel zeroes pages it
//!   allocates, init_on_alloc), at least 4 MiB worth, and tracking works
//!   again after being turned off.
//! * The guest exits with status 0 and powers off.
//!
//! Needs the built image (`make image`); fails without it.

mod common;

use common::{image, Disk, TempDisk};
use ftvm_devices::virtio::blk::{execute, BlkOp};
use ftvm_machine::{
    DeviceSpec, Event, GuestRam, IoCompletion, IoRequest, Machine, MachineConfig, RunExit, DEFAULT_GUEST_IPS,
};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::Path;
use std::time::Instant;

const RAM: u64 = 256 << 20;
const PAGE: usize = 4096;
/// Steps per `run_until` call while booting.
const BOOT_STEP: u64 = 1_000_000;
/// Steps per `run_until` call while watching: each end is a checkpoint.
const WATCH_STEP: u64 = 500_000;
/// How far into the second shell loop tracking stays off.
const OFF_INTO_LOOP: u64 = 5_000_000;
/// Give up waiting for a marker after this many steps (the boot takes
/// about 4.1 billion).
const LIMIT: u64 = 30_000_000_000;

/// The pattern pages are numbered FIRST..FIRST+COUNT (four digits, so each
/// line is exactly 32 bytes).
const FIRST: u32 = 1000;
const COUNT: u32 = 64;
const PREFIX: &[u8] = b"FTVM-DIRTY-PAGE-";
/// Files the DMA phase reads (not touched by the boot), 2.97 MB each.
const DMA_FILES: &str = "/usr/bin/redis-check-aof /usr/bin/redis-check-rdb";
/// At least this much must reach guest RAM by disk DMA in the DMA phase.
const DMA_MIN_BYTES: usize = 4 << 20;

fn line(k: u32) -> String {
    let l = format!("FTVM-DIRTY-PAGE-{k}-abcdefghijk");
    assert_eq!(l.len(), 32);
    l
}

fn pattern_page(k: u32) -> Vec<u8> {
    line(k).repeat(PAGE / 32).into_bytes()
}

fn command() -> String {
    format!(
        "echo MARK-A; sleep 1; \
         i={FIRST}; while [ $i -lt {end} ]; do \
         l=FTVM-DIRTY-PAGE-$i-abcdefghijk; for j in 1 2 3 4 5 6 7; do l=$l$l; done; \
         printf %s \"$l\" >> /dev/shm/ftvm-dirty; i=$((i+1)); done; \
         j=0; while [ $j -lt 3000 ]; do j=$((j+1)); done; \
         echo MARK-B; sleep 2; echo MARK-C; sleep 1; echo MARK-D; \
         j=0; while [ $j -lt 3000 ]; do j=$((j+1)); done; \
         cat {DMA_FILES} > /dev/null && echo MARK-E || echo FAIL: cat; \
         ls -l /dev/shm/ftvm-dirty",
        end = FIRST + COUNT
    )
}

/// The host's record while watching.
struct Watch {
    /// Guest RAM as of the last checkpoint.
    snap: Vec<u8>,
    /// Instruction count of the last checkpoint.
    at: u64,
    /// Union of the dirty sets taken since the phase began.
    dirty: BTreeSet<u64>,
    /// Pages whose contents changed, since the phase began.
    changed: BTreeSet<u64>,
    checkpoints: usize,
    completions: usize,
    read_bytes: u64,
    /// Pages changed by injecting read completions.
    dma_pages: BTreeSet<u64>,
}

impl Watch {
    fn new(m: &Machine) -> Watch {
        Watch {
            snap: m.ram().as_slice().to_vec(),
            at: m.icount(),
            dirty: BTreeSet::new(),
            changed: BTreeSet::new(),
            checkpoints: 0,
            completions: 0,
            read_bytes: 0,
            dma_pages: BTreeSet::new(),
        }
    }

    /// Start a new phase: forget the unions and counters.
    fn phase(&mut self) {
        self.dirty.clear();
        self.changed.clear();
        self.checkpoints = 0;
        self.completions = 0;
        self.read_bytes = 0;
        self.dma_pages.clear();
    }
}

struct Vm {
    m: Machine,
    io: Disk,
    _disk: TempDisk,
    console: Vec<u8>,
    /// Complete console lines (without line ends) seen so far.
    lines: Vec<String>,
    /// Bytes of `console` already split into `lines`.
    parsed: usize,
    /// Index in `lines` of the line after `ftvm-exec-begin`.
    begin: Option<usize>,
    watch: Option<Watch>,
}

fn boot() -> Vm {
    let img = image();
    let read = |p: &Path| std::fs::read(p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
    let disk = TempDisk::copy_of(&img.rootfs, "dirty-pages");
    let cmd = command();
    let cmdline =
        format!("console=ttyS0 root=/dev/vda rw quiet ftvm.exec={}", ftvm_image::base64::encode(cmd.as_bytes()));
    assert!(cmdline.len() < 1024, "kernel command line is {} bytes, over 1023: shorten the command", cmdline.len());
    let cfg = MachineConfig {
        harts: 1,
        ram_size: RAM,
        firmware: Some(read(&img.firmware)),
        kernel: read(&img.kernel),
        initrd: Some(read(&img.initrd)),
        cmdline,
        devices: vec![DeviceSpec::Disk { size: disk.size(), readonly: false }],
        guest_ips: DEFAULT_GUEST_IPS,
        rtc_base_ns: 0,
        extensions: ftvm_machine::Extensions::ALL,
        seed: None,
    };
    let m = Machine::new(&cfg).unwrap_or_else(|e| panic!("building the machine: {e}"));
    let io = disk.open();
    Vm { m, io, _disk: disk, console: Vec::new(), lines: Vec::new(), parsed: 0, begin: None, watch: None }
}

fn pages_changed(before: &[u8], now: &[u8], base_pfn: u64) -> Vec<u64> {
    assert_eq!(before.len(), now.len());
    before
        .chunks_exact(PAGE)
        .zip(now.chunks_exact(PAGE))
        .enumerate()
        .filter(|(_, (a, b))| a != b)
        .map(|(i, _)| base_pfn + i as u64)
        .collect()
}

fn addrs<'a>(pages: impl IntoIterator<Item = &'a u64>) -> String {
    let pages: Vec<u64> = pages.into_iter().copied().collect();
    let shown: Vec<String> = pages.iter().take(16).map(|p| format!("{:#x}", p << 12)).collect();
    let more = if pages.len() > 16 { format!(" and {} more", pages.len() - 16) } else { String::new() };
    format!("{}{more}", shown.join(", "))
}

impl Vm {
    fn base_pfn(&self) -> u64 {
        self.m.ram().base() >> 12
    }

    fn console_text(&self) -> String {
        String::from_utf8_lossy(&self.console).into_owned()
    }

    fn take_dirty(&mut self) -> Vec<u64> {
        let d = self.m.take_dirty_pages();
        let (lo, hi) = (self.base_pfn(), self.m.ram().end() >> 12);
        assert!(d.windows(2).all(|w| w[0] < w[1]), "take_dirty_pages() is not sorted and unique");
        if let Some(p) = d.iter().find(|&&p| p < lo || p >= hi) {
            panic!("take_dirty_pages() returned page {p:#x}, outside RAM (pages {lo:#x}..{hi:#x})");
        }
        d
    }

    /// While watching: take the dirty set, check that every page changed
    /// since the previous checkpoint is in it, and bring the copy of RAM up
    /// to date. Returns the changed pages.
    fn checkpoint(&mut self, what: &str) -> Vec<u64> {
        let Some(mut w) = self.watch.take() else { return Vec::new() };
        let dirty = self.take_dirty();
        let base = self.base_pfn();
        let changed = pages_changed(&w.snap, self.m.ram().as_slice(), base);
        let set: HashSet<u64> = dirty.iter().copied().collect();
        let missed: Vec<u64> = changed.iter().copied().filter(|p| !set.contains(p)).collect();
        assert!(
            missed.is_empty(),
            "{what} (instructions {}..{}): {} of the {} pages whose contents changed are not in the dirty set \
             ({} pages): {}",
            w.at,
            self.m.icount(),
            missed.len(),
            changed.len(),
            dirty.len(),
            addrs(&missed)
        );
        // Every changed page is dirty, so copying the dirty ones makes the
        // copy equal to RAM again.
        let ram = self.m.ram().as_slice();
        for &p in &dirty {
            let off = ((p - base) as usize) * PAGE;
            w.snap[off..off + PAGE].copy_from_slice(&ram[off..off + PAGE]);
        }
        w.at = self.m.icount();
        w.checkpoints += 1;
        w.dirty.extend(dirty);
        w.changed.extend(changed.iter().copied());
        self.watch = Some(w);
        changed
    }

    fn serve_io(&mut self) {
        for (slot, req) in self.m.take_io_requests() {
            let (tag, op) = match req {
                IoRequest::Disk { tag, op } => (tag, op),
                other => panic!("unexpected request {other:?}"),
            };
            let result = execute(&op, &mut self.io);
            self.checkpoint("before a disk completion");
            self.m.inject(Event::Io { slot, completion: IoCompletion::Disk { tag, result } });
            let changed = self.checkpoint(&format!("injecting the completion of disk request {tag} ({op:?})"));
            if let Some(w) = self.watch.as_mut() {
                w.completions += 1;
                if let BlkOp::Read { len, .. } = op {
                    w.read_bytes += u64::from(len);
                    w.dma_pages.extend(changed);
                }
            }
        }
    }

    /// Split new console output into lines; fail on a `FAIL` line.
    fn parse_console(&mut self) {
        while let Some(nl) = self.console[self.parsed..].iter().position(|&b| b == b'\n') {
            let raw = &self.console[self.parsed..self.parsed + nl];
            let l = String::from_utf8_lossy(raw).trim_end_matches('\r').to_string();
            self.parsed += nl + 1;
            if l == ftvm_image::EXEC_BEGIN_MARKER && self.begin.is_none() {
                self.begin = Some(self.lines.len() + 1);
            }
            if self.begin.is_some() && l.starts_with("FAIL") {
                panic!("the guest reported {l:?}; console:\n{}", self.console_text());
            }
            self.lines.push(l);
        }
    }

    fn seen(&self, want: &str) -> bool {
        self.begin.is_some_and(|b| self.lines[b..].iter().any(|l| l == want))
    }

    /// Run (fast time, disk served inline) until the guest has printed the
    /// line `want` after the exec begin marker (None: until it powers off;
    /// returns the exit status). Returns as soon as the line shows up: an
    /// exit not yet handled is reported again by the next `run_until`.
    fn run(&mut self, want: Option<&str>) -> u32 {
        self.run_to(want, None)
    }

    /// Run exactly `n` more instructions (the guest must stay busy).
    fn run_for(&mut self, n: u64) {
        let end = self.m.icount() + n;
        self.run_to(None, Some(end));
        assert_eq!(self.m.icount(), end);
    }

    fn run_to(&mut self, want: Option<&str>, end: Option<u64>) -> u32 {
        let start = self.m.icount();
        let what = match (want, end) {
            (Some(w), _) => w.to_string(),
            (None, Some(e)) => format!("instruction {e}"),
            (None, None) => "power-off".to_string(),
        };
        loop {
            let step = if self.watch.is_some() { WATCH_STEP } else { BOOT_STEP };
            let mut target = self.m.icount() + step;
            if let Some(e) = end {
                if self.m.icount() >= e {
                    return 0;
                }
                target = target.min(e);
            }
            let exit = self.m.run_until(target);
            self.checkpoint(&format!("running towards {what}"));
            self.console.extend(self.m.take_console_output());
            self.parse_console();
            if want.is_some_and(|w| self.seen(w)) {
                return 0;
            }
            match exit {
                RunExit::Reached => {}
                RunExit::Io => self.serve_io(),
                RunExit::Idle { wake_at: Some(t) } => {
                    self.m.inject(Event::ClockAdvance(t));
                }
                RunExit::PowerOff(code) if want.is_none() && end.is_none() => return code,
                other => panic!(
                    "waiting for {what}, the guest stopped at instruction {} ({other:?}); console:\n{}",
                    self.m.icount(),
                    self.console_text()
                ),
            }
            assert!(
                self.m.icount() - start < LIMIT,
                "no {what} after {LIMIT} instructions; console:\n{}",
                self.console_text()
            );
        }
    }

    /// Pages holding exactly pattern page k, for each k found; and how many
    /// pages start like a pattern page without being one.
    fn find_patterns(&self) -> (BTreeMap<u32, Vec<u64>>, usize) {
        let expected: Vec<Vec<u8>> = (FIRST..FIRST + COUNT).map(pattern_page).collect();
        let mut found: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        let mut partial = 0;
        for (i, page) in self.m.ram().as_slice().chunks_exact(PAGE).enumerate() {
            if !page.starts_with(PREFIX) {
                continue;
            }
            let k = std::str::from_utf8(&page[PREFIX.len()..PREFIX.len() + 4]).ok().and_then(|s| s.parse::<u32>().ok());
            match k {
                Some(k) if (FIRST..FIRST + COUNT).contains(&k) && page == expected[(k - FIRST) as usize] => {
                    found.entry(k).or_default().push(self.base_pfn() + i as u64)
                }
                _ => partial += 1,
            }
        }
        (found, partial)
    }

    fn watch(&mut self) -> &mut Watch {
        self.watch.as_mut().expect("watching")
    }
}

#[test]
fn guest_writes_show_up_as_dirty_pages() {
    let started = Instant::now();
    let mut vm = boot();
    let total_pages = (RAM as usize) / PAGE;

    // Phase 1: the guest writes the pattern pages.
    vm.run(Some("MARK-A"));
    eprintln!("MARK-A at instruction {} ({:.1} s)", vm.m.icount(), started.elapsed().as_secs_f64());
    let (before, _) = vm.find_patterns();
    assert!(before.is_empty(), "pattern pages in RAM before the guest wrote them: {before:?}");
    vm.take_dirty();
    vm.watch = Some(Watch::new(&vm.m));

    vm.run(Some("MARK-B"));
    vm.checkpoint("at MARK-B");
    let w = vm.watch();
    let (d1, changed1, checkpoints1) = (w.dirty.clone(), w.changed.len(), w.checkpoints);
    w.phase();
    let (found, partial) = vm.find_patterns();
    let missing: Vec<u32> = (FIRST..FIRST + COUNT).filter(|k| !found.contains_key(k)).collect();
    assert!(
        missing.is_empty(),
        "pattern pages not found in guest RAM at MARK-B: {missing:?} (found {}); console:\n{}",
        found.len(),
        vm.console_text()
    );
    let not_dirty: Vec<String> = found
        .iter()
        .flat_map(|(k, pages)| pages.iter().map(move |p| (k, p)))
        .filter(|(_, p)| !d1.contains(p))
        .map(|(k, p)| format!("page {k} at {:#x}", p << 12))
        .collect();
    assert!(
        not_dirty.is_empty(),
        "{} pattern page(s) the guest wrote after MARK-A are missing from the dirty set D1 ({} pages): {}",
        not_dirty.len(),
        d1.len(),
        not_dirty.join(", ")
    );
    assert!(
        d1.len() < total_pages / 2,
        "D1 has {} of {total_pages} pages: the tracker reports nearly everything",
        d1.len()
    );
    let copies: usize = found.values().map(Vec::len).sum();
    eprintln!(
        "MARK-B: D1 = {} pages dirty ({changed1} with changed contents, {checkpoints1} checkpoints); \
         the {COUNT} pattern pages found in {copies} page(s), all dirty; {partial} other page(s) start with the \
         pattern prefix",
        d1.len()
    );

    // Phase 2: quiet interval; nobody writes the pattern pages.
    vm.run(Some("MARK-C"));
    vm.checkpoint("at MARK-C");
    let w = vm.watch();
    let (d2, changed2, checkpoints2) = (w.dirty.clone(), w.changed.len(), w.checkpoints);
    w.phase();
    let (found_c, _) = vm.find_patterns();
    let missing: Vec<u32> = (FIRST..FIRST + COUNT).filter(|k| !found_c.contains_key(k)).collect();
    assert!(missing.is_empty(), "pattern pages gone from guest RAM at MARK-C: {missing:?}");
    let mut kept = 0;
    let mut rewritten = Vec::new();
    for (k, pages) in &found {
        for p in pages {
            // A page that still holds its pattern was not reused.
            if found_c.get(k).is_some_and(|c| c.contains(p)) {
                kept += 1;
                if d2.contains(p) {
                    rewritten.push(format!("page {k} at {:#x}", p << 12));
                }
            }
        }
    }
    assert!(kept >= COUNT as usize, "only {kept} pattern pages stayed in place from MARK-B to MARK-C");
    assert!(
        rewritten.is_empty(),
        "{} pattern page(s) nobody wrote after MARK-B are in the dirty set D2 ({} pages): {}",
        rewritten.len(),
        d2.len(),
        rewritten.join(", ")
    );
    eprintln!(
        "MARK-C: D2 = {} pages dirty ({changed2} with changed contents, {checkpoints2} checkpoints), none of the \
         pattern pages",
        d2.len()
    );

    // A checkpoint as a backup holds it: the state without RAM, and a copy
    // of RAM kept up to date with the dirty pages alone. The machine built
    // from them is this one.
    vm.serve_io();
    vm.checkpoint("before the checkpoint restore");
    let state = vm.m.checkpoint_state().unwrap_or_else(|e| panic!("checkpoint state at MARK-C: {e}"));
    let mut ram = GuestRam::new(vm.m.ram().base(), vm.m.ram().size()).unwrap();
    ram.as_mut_slice_untracked().copy_from_slice(&vm.watch().snap);
    let restored = Machine::from_checkpoint(&state, ram).unwrap_or_else(|e| panic!("from_checkpoint: {e}"));
    assert_eq!(restored.icount(), vm.m.icount());
    assert!(restored.ram().as_slice() == vm.m.ram().as_slice(), "the dirty-page copy of RAM differs from RAM");
    assert!(restored.checkpoint_state().unwrap() == state, "the rebuilt machine's state differs from the checkpoint's");
    assert!(restored.state_hash() == vm.m.state_hash(), "the rebuilt machine's state hash differs from the original's");
    let small = GuestRam::new(vm.m.ram().base(), vm.m.ram().size() / 2).unwrap();
    assert!(Machine::from_checkpoint(&state, small).is_err(), "a checkpoint took RAM of the wrong size");
    eprintln!("MARK-C: the machine rebuilt from its checkpoint state ({} bytes) has the same state hash", state.len());

    // Phase 3 (negative control): tracking off records nothing.
    let mut w = vm.watch.take().unwrap();
    vm.m.set_dirty_tracking(false);
    vm.run(Some("MARK-D"));
    vm.run_for(OFF_INTO_LOOP);
    // Not take_dirty_pages(): it would flush the cached store translations
    // that turning tracking on must flush by itself.
    let off = vm.m.ram().dirty_count();
    let changed_off = pages_changed(&w.snap, vm.m.ram().as_slice(), vm.base_pfn()).len();
    assert!(off == 0, "with tracking off, {off} pages are marked dirty");
    assert!(
        changed_off >= 16,
        "the guest changed only {changed_off} pages while tracking was off: the control proves nothing"
    );
    eprintln!(
        "MARK-D + {OFF_INTO_LOOP}: tracking off: 0 pages dirty while the guest changed {changed_off}; tracking back on \
         at instruction {}",
        vm.m.icount()
    );
    vm.m.set_dirty_tracking(true);
    w.snap.copy_from_slice(vm.m.ram().as_slice());
    w.at = vm.m.icount();
    vm.watch = Some(w);

    // Phase 4: disk DMA into the page cache.
    vm.run(Some("MARK-E"));
    vm.checkpoint("at MARK-E");
    let w = vm.watch.take().unwrap();
    assert!(
        w.read_bytes >= DMA_MIN_BYTES as u64,
        "the guest read only {} bytes from disk reading {DMA_FILES}: were they cached already?",
        w.read_bytes
    );
    assert!(
        w.dma_pages.len() >= DMA_MIN_BYTES / PAGE,
        "disk reads of {} bytes changed only {} pages of guest RAM (want at least {})",
        w.read_bytes,
        w.dma_pages.len(),
        DMA_MIN_BYTES / PAGE
    );
    eprintln!(
        "MARK-E: D3 = {} pages dirty ({} with changed contents, {} checkpoints); {} disk completions, {} bytes \
         read, {} pages changed by read DMA, each reported by the take right after its completion",
        w.dirty.len(),
        w.changed.len(),
        w.checkpoints,
        w.completions,
        w.read_bytes,
        w.dma_pages.len()
    );

    let code = vm.run(None);
    let out = vm.console_text();
    assert_eq!(code, 0, "the guest powered off with status {code}; console:\n{out}");
    assert!(out.contains("ftvm-exec-status=0"), "no ftvm-exec-status=0 line; console:\n{out}");
    let ls = vm.lines.iter().find(|l| l.contains("/dev/shm/ftvm-dirty")).cloned().unwrap_or_default();
    eprintln!("{ls}");
    eprintln!("done at instruction {} in {:.1} s", vm.m.icount(), started.elapsed().as_secs_f64());
}
