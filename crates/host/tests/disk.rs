//! Disk images, the file backend and the disk worker pool, against real
//! files in a scratch directory.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use ftvm_devices::virtio::blk::{
    BlkDevice, BlkOp, BlkResult, BlockBackend, MemBackend, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK,
};
use ftvm_devices::IoCompletion;
use ftvm_host::disk::{DiskError, DiskImage, DiskWorkers, FileBackend, DEFAULT_DISK_THREADS};

const WAIT: Duration = Duration::from_secs(20);

/// A directory of its own per test, removed at the end.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("ftvm-host-{}-{test}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn file(&self, name: &str, data: &[u8]) -> PathBuf {
        let p = self.0.join(name);
        fs::write(&p, data).unwrap();
        p
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A fixed pseudo-random sequence (64-bit LCG), so a failure reproduces.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed).wrapping_add((i >> 8) as u8)).collect()
}

type Completions = Receiver<(usize, u32, BlkResult)>;

fn workers_with_channel(image: &DiskImage, slot: usize, threads: usize) -> (DiskWorkers, Completions) {
    slow_workers_with_channel(image, slot, threads, Duration::ZERO)
}

fn slow_workers_with_channel(
    image: &DiskImage,
    slot: usize,
    threads: usize,
    latency: Duration,
) -> (DiskWorkers, Completions) {
    let (tx, rx) = channel();
    let tx = Mutex::new(tx);
    let w = DiskWorkers::spawn(image, slot, threads, latency, move |slot, c| {
        let IoCompletion::Disk { tag, result } = c else { panic!("not a disk completion: {c:?}") };
        tx.lock().unwrap().send((slot, tag, result)).unwrap();
    })
    .unwrap();
    (w, rx)
}

fn path_str(p: &Path) -> String {
    p.display().to_string()
}

#[test]
fn open_errors_name_the_disk() {
    let s = Scratch::new("open-errors");
    let missing = s.0.join("missing.img");
    assert_eq!(
        DiskImage::open(&missing, false).unwrap_err().to_string(),
        format!("cannot open disk {}: No such file or directory", path_str(&missing))
    );
    assert_eq!(
        DiskImage::open(&missing, true).unwrap_err().to_string(),
        format!("cannot open disk {}: No such file or directory", path_str(&missing))
    );
    for ro in [false, true] {
        assert_eq!(
            DiskImage::open(&s.0, ro).unwrap_err().to_string(),
            format!("cannot use disk {}: it is a directory", path_str(&s.0)),
            "readonly={ro}"
        );
    }
    let small = s.file("small.img", &[0u8; 511]);
    assert_eq!(
        DiskImage::open(&small, false).unwrap_err().to_string(),
        format!("disk {} is too small: 511 bytes, at least 512 needed", path_str(&small))
    );
    let empty = s.file("empty.img", &[]);
    assert!(DiskImage::open(&empty, true).unwrap_err().to_string().contains("is too small: 0 bytes"));
    // Not a file: a FIFO must be refused, not hang in open(2).
    let fifo = s.0.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    assert_eq!(
        DiskImage::open(&fifo, true).unwrap_err().to_string(),
        format!("cannot use disk {}: not a regular file or block device", path_str(&fifo))
    );
    let ok = s.file("ok.img", &[0u8; 512]);
    let img = DiskImage::open(&ok, false).unwrap();
    assert_eq!((img.size(), img.readonly(), img.path()), (512, false, ok.as_path()));
}

#[test]
fn a_writable_image_is_locked_against_other_vms() {
    let s = Scratch::new("flock");
    let p = s.file("d.img", &[0u8; 4096]);
    let in_use = format!("disk {} is in use by another VM", path_str(&p));
    // Refused by type, with the disk's path, and in words.
    let refused = |readonly: bool| match DiskImage::open(&p, readonly).unwrap_err() {
        e @ DiskError::InUse { .. } => {
            assert!(matches!(&e, DiskError::InUse { path } if *path == p), "{e:?}");
            e.to_string()
        }
        e => panic!("not refused as in use: {e:?}"),
    };

    let rw = DiskImage::open(&p, false).unwrap();
    assert_eq!(refused(false), in_use);
    assert_eq!(refused(true), in_use, "a reader must not see a disk being written");
    // A backend shares the image's file, so it holds the lock too.
    let backend = rw.backend().unwrap();
    drop(rw);
    assert_eq!(refused(false), in_use);
    drop(backend);
    let rw = DiskImage::open(&p, false).unwrap();
    drop(rw);

    let ro1 = DiskImage::open(&p, true).unwrap();
    let ro2 = DiskImage::open(&p, true).unwrap();
    assert!(ro1.readonly() && ro2.readonly());
    assert_eq!(refused(false), in_use, "a writer must not change a disk being read");
    drop((ro1, ro2));
    DiskImage::open(&p, false).unwrap();
}

#[test]
fn file_backend_positioned_io() {
    let s = Scratch::new("backend");
    let p = s.file("d.img", &pattern(8192, 1));
    let img = DiskImage::open(&p, false).unwrap();
    let mut a = img.backend().unwrap();
    let mut b = img.backend().unwrap();
    assert_eq!(a.size(), 8192);

    let mut buf = vec![0u8; 1024];
    a.read_at(1536, &mut buf).unwrap();
    assert_eq!(buf, pattern(8192, 1)[1536..2560]);

    // Positioned: no shared seek offset between clones of one file.
    let data = pattern(512, 9);
    a.write_at(4096, &data).unwrap();
    b.write_at(0, &pattern(512, 5)).unwrap();
    let mut got = vec![0u8; 512];
    b.read_at(4096, &mut got).unwrap();
    assert_eq!(got, data);
    a.flush().unwrap();
    b.flush().unwrap();

    let on_disk = fs::read(&p).unwrap();
    assert_eq!(on_disk.len(), 8192);
    assert_eq!(&on_disk[4096..4608], &data[..]);
    assert_eq!(&on_disk[0..512], &pattern(512, 5)[..]);
    assert_eq!(&on_disk[512..4096], &pattern(8192, 1)[512..4096]);

    // Outside the disk: errors, and the file never grows.
    assert!(a.read_at(8192, &mut got).is_err());
    assert!(a.read_at(u64::MAX - 10, &mut got).is_err());
    assert!(a.write_at(7680 + 1, &data).is_err());
    assert!(a.write_at(u64::MAX - 10, &data).is_err());
    assert_eq!(fs::metadata(&p).unwrap().len(), 8192);
}

#[test]
fn a_partial_trailing_sector_is_never_read_or_written_past() {
    let s = Scratch::new("partial");
    let content = pattern(1000, 3);
    let p = s.file("d.img", &content);
    let img = DiskImage::open(&p, false).unwrap();
    assert_eq!(img.size(), 1000);
    // The guest sees whole sectors only.
    assert_eq!(BlkDevice::new(img.size(), false, "x").capacity_sectors(), 1);

    let mut be = img.backend().unwrap();
    let mut tail = vec![0u8; 488];
    be.read_at(512, &mut tail).unwrap();
    assert_eq!(tail, content[512..]);
    let mut sector = vec![0u8; 512];
    let e = be.read_at(512, &mut sector).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    assert!(be.write_at(512, &[7u8; 512]).is_err());
    assert_eq!(fs::read(&p).unwrap(), content, "a refused write must leave the image as it was");
}

#[test]
fn a_slow_disk_completes_each_request_after_its_latency_and_runs_them_side_by_side() {
    const LATENCY: Duration = Duration::from_millis(200);
    let s = Scratch::new("latency");
    let initial = pattern(64 * 512, 3);
    let p = s.file("d.img", &initial);
    let img = DiskImage::open(&p, false).unwrap();
    let (w, rx) = slow_workers_with_channel(&img, 0, 2, LATENCY);

    // One request: no sooner than the latency, and with the right data.
    let t = Instant::now();
    w.submit(1, BlkOp::Read { offset: 512, len: 512 });
    let (_, tag, result) = rx.recv_timeout(WAIT).unwrap();
    assert!(t.elapsed() >= LATENCY, "completed after {:?}", t.elapsed());
    assert_eq!((tag, result.status), (1, VIRTIO_BLK_S_OK));
    assert!(result.data == initial[512..1024]);

    // Two workers serve two requests at once: both done in about one
    // latency; one after the other would take two.
    let t = Instant::now();
    w.submit(2, BlkOp::Write { offset: 0, data: vec![9; 512] });
    w.submit(3, BlkOp::Read { offset: 1024, len: 512 });
    for _ in 0..2 {
        rx.recv_timeout(WAIT).unwrap();
    }
    let both = t.elapsed();
    assert!(both >= LATENCY && both < LATENCY * 2, "two requests took {both:?}");
    w.drain();
    assert_eq!(fs::read(&p).unwrap()[..512], [9; 512]);
}

#[test]
fn sixty_four_mixed_requests_all_complete_once_with_the_right_data() {
    const SECTORS: u64 = 1024;
    let s = Scratch::new("mixed");
    let initial = pattern((SECTORS * 512) as usize, 7);
    let p = s.file("d.img", &initial);
    let img = DiskImage::open(&p, false).unwrap();
    let (w, rx) = workers_with_channel(&img, 3, DEFAULT_DISK_THREADS);
    assert_eq!(w.slot(), 3);

    // Writes go to the first half, each to a region of its own, so the
    // final image is known whatever the order; reads come from the second
    // half, which nobody writes, so each read's data is known too.
    let mut rng = Lcg(0x5eed);
    let mut expected_image = initial.clone();
    let mut expected_reads: HashMap<u32, Vec<u8>> = HashMap::new();
    for tag in 0..64u32 {
        let sectors = 1 + rng.next() % 8;
        let len = (sectors * 512) as usize;
        if rng.next() & 1 == 0 {
            let offset = tag as u64 * 8 * 512;
            let data = pattern(len, tag as u8 ^ 0xa5);
            expected_image[offset as usize..offset as usize + len].copy_from_slice(&data);
            w.submit(tag + 1000, BlkOp::Write { offset, data });
        } else {
            let offset = (SECTORS / 2 + rng.next() % (SECTORS / 2 - 8)) * 512;
            expected_reads.insert(tag + 1000, initial[offset as usize..offset as usize + len].to_vec());
            w.submit(tag + 1000, BlkOp::Read { offset, len: len as u32 });
        }
    }
    assert!((10..54).contains(&expected_reads.len()), "the pattern should mix reads and writes");

    let mut seen: HashMap<u32, usize> = HashMap::new();
    for _ in 0..64 {
        let (slot, tag, result) = rx.recv_timeout(WAIT).expect("a completion is missing");
        assert_eq!(slot, 3);
        *seen.entry(tag).or_default() += 1;
        assert_eq!(result.status, VIRTIO_BLK_S_OK, "tag {tag}");
        match expected_reads.get(&tag) {
            Some(data) => assert!(result.data == *data, "tag {tag} read the wrong data"),
            None => assert!(result.data.is_empty(), "a write returns no data"),
        }
    }
    w.drain();
    assert_eq!(w.pending(), 0);
    assert!(rx.try_recv().is_err(), "more completions than requests");
    assert_eq!(seen.len(), 64);
    assert!(seen.iter().all(|(t, &n)| n == 1 && (1000..1064).contains(t)), "{seen:?}");
    assert!(fs::read(&p).unwrap() == expected_image, "the image does not hold what was written");
}

/// A backend that records what happens and can hold operations at a gate.
#[derive(Clone, Default)]
struct Probe {
    inner: Arc<ProbeInner>,
}

#[derive(Default)]
struct ProbeInner {
    disk: Mutex<MemBackendCell>,
    log: Mutex<Vec<String>>,
    gate: Mutex<bool>,
    gate_cv: Condvar,
    running: AtomicUsize,
    max_running: AtomicUsize,
    write_delay_ms: AtomicUsize,
}

struct MemBackendCell(MemBackend);

impl Default for MemBackendCell {
    fn default() -> Self {
        MemBackendCell(MemBackend::new(vec![0; 1 << 20]))
    }
}

impl Probe {
    fn open_gate(&self, open: bool) {
        *self.inner.gate.lock().unwrap() = open;
        self.inner.gate_cv.notify_all();
    }

    fn enter(&self, what: String) {
        let i = &self.inner;
        let now = i.running.fetch_add(1, Ordering::SeqCst) + 1;
        i.max_running.fetch_max(now, Ordering::SeqCst);
        i.log.lock().unwrap().push(format!("start {what}"));
        let mut open = i.gate.lock().unwrap();
        while !*open {
            open = i.gate_cv.wait(open).unwrap();
        }
    }

    fn leave(&self, what: String) {
        self.inner.log.lock().unwrap().push(format!("end {what}"));
        self.inner.running.fetch_sub(1, Ordering::SeqCst);
    }

    fn log(&self) -> Vec<String> {
        self.inner.log.lock().unwrap().clone()
    }
}

impl BlockBackend for Probe {
    fn size(&self) -> u64 {
        self.inner.disk.lock().unwrap().0.size()
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.enter(format!("read {offset}"));
        let r = self.inner.disk.lock().unwrap().0.read_at(offset, buf);
        self.leave(format!("read {offset}"));
        r
    }

    fn write_at(&mut self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.enter(format!("write {offset}"));
        std::thread::sleep(Duration::from_millis(self.inner.write_delay_ms.load(Ordering::SeqCst) as u64));
        let r = self.inner.disk.lock().unwrap().0.write_at(offset, data);
        self.leave(format!("write {offset}"));
        r
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.enter("flush".into());
        self.leave("flush".into());
        Ok(())
    }
}

fn probe_workers(probe: &Probe, threads: usize) -> (DiskWorkers, Receiver<(u32, BlkResult)>) {
    let (tx, rx) = channel();
    let tx = Mutex::new(tx);
    let w = DiskWorkers::spawn_with(0, vec![probe.clone(); threads], Duration::ZERO, move |_, c| {
        if let IoCompletion::Disk { tag, result } = c {
            tx.lock().unwrap().send((tag, result)).unwrap();
        }
    })
    .unwrap();
    (w, rx)
}

fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < WAIT, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn submit_never_blocks_and_requests_run_concurrently() {
    let probe = Probe::default();
    let (w, rx) = probe_workers(&probe, 4);
    // Every worker is held inside the backend; submitting must still
    // return at once.
    for tag in 0..64 {
        w.submit(tag, BlkOp::Read { offset: tag as u64 * 512, len: 512 });
    }
    assert_eq!(w.pending(), 64);
    wait_for("four requests in the backend at once", || probe.inner.running.load(Ordering::SeqCst) == 4);
    assert!(rx.try_recv().is_err(), "nothing can have completed behind a closed gate");
    probe.open_gate(true);
    let mut tags: Vec<u32> = (0..64).map(|_| rx.recv_timeout(WAIT).unwrap().0).collect();
    tags.sort();
    assert_eq!(tags, (0..64).collect::<Vec<_>>());
    assert_eq!(probe.inner.max_running.load(Ordering::SeqCst), 4);
}

#[test]
fn a_flush_starts_only_after_earlier_writes_completed() {
    let probe = Probe::default();
    probe.open_gate(true);
    probe.inner.write_delay_ms.store(50, Ordering::SeqCst);
    let (w, rx) = probe_workers(&probe, 4);
    // Writes 1..=6 before the flush, 7..=8 after it; with four threads
    // and slow writes, the flush is taken off the queue while earlier
    // writes still run, so it has to wait for them.
    for tag in 1..=6u32 {
        w.submit(tag, BlkOp::Write { offset: tag as u64 * 4096, data: vec![tag as u8; 512] });
    }
    w.submit(100, BlkOp::Flush);
    for tag in 7..=8u32 {
        w.submit(tag, BlkOp::Write { offset: tag as u64 * 4096, data: vec![tag as u8; 512] });
    }
    let order: Vec<u32> = (0..9).map(|_| rx.recv_timeout(WAIT).unwrap().0).collect();
    w.drain();

    let log = probe.log();
    let flush_start = log.iter().position(|e| e == "start flush").unwrap();
    for tag in 1..=6u64 {
        let end = log.iter().position(|e| *e == format!("end write {}", tag * 4096)).unwrap();
        assert!(end < flush_start, "write {tag} ended after the flush started: {log:?}");
    }
    let flush_done = order.iter().position(|&t| t == 100).unwrap();
    for tag in 1..=6 {
        assert!(order.iter().position(|&t| t == tag).unwrap() < flush_done, "completion order {order:?}");
    }
    // Later writes were not held back behind the flush.
    let later_start = log.iter().position(|e| *e == format!("start write {}", 7 * 4096)).unwrap();
    assert!(later_start < flush_start, "write 7 should have overtaken the waiting flush: {log:?}");
}

#[test]
fn drain_waits_for_everything_and_drop_stops_the_threads() {
    let probe = Probe::default();
    probe.inner.write_delay_ms.store(5, Ordering::SeqCst);
    probe.open_gate(true);
    let (w, rx) = probe_workers(&probe, 2);
    for tag in 0..20 {
        w.submit(tag, BlkOp::Write { offset: tag as u64 * 512, data: vec![1; 512] });
    }
    w.drain();
    assert_eq!(w.pending(), 0);
    assert_eq!(rx.try_iter().count(), 20, "drain returned before every completion was delivered");

    // Dropping with work held in the backend: running work finishes,
    // queued work is discarded, the threads are joined.
    probe.open_gate(false);
    for tag in 0..10 {
        w.submit(tag, BlkOp::Read { offset: 0, len: 512 });
    }
    wait_for("two reads in the backend", || probe.inner.running.load(Ordering::SeqCst) == 2);
    let opener = {
        let probe = probe.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            probe.open_gate(true);
        })
    };
    drop(w);
    opener.join().unwrap();
    // The callback (and its sender) went with the pool: the channel ends
    // after the completions of the two reads that were running.
    let after: Vec<_> = rx.iter().collect();
    assert_eq!(after.len(), 2, "{after:?}");
    assert_eq!(probe.inner.running.load(Ordering::SeqCst), 0);
}

#[test]
fn a_read_only_image_serves_reads_and_refuses_writes() {
    let s = Scratch::new("readonly");
    let content = pattern(64 * 1024, 4);
    let p = s.file("d.img", &content);
    let img = DiskImage::open(&p, true).unwrap();
    let (w, rx) = workers_with_channel(&img, 0, 2);
    w.submit(1, BlkOp::Read { offset: 4096, len: 8192 });
    w.submit(2, BlkOp::Write { offset: 0, data: vec![0xff; 4096] });
    w.submit(3, BlkOp::Flush);
    w.drain();
    let mut got: HashMap<u32, BlkResult> = rx.try_iter().map(|(_, t, r)| (t, r)).collect();
    assert_eq!(got.len(), 3);
    let read = got.remove(&1).unwrap();
    assert_eq!(read.status, VIRTIO_BLK_S_OK);
    assert!(read.data == content[4096..12288]);
    assert_eq!(got.remove(&2).unwrap(), BlkResult { status: VIRTIO_BLK_S_IOERR, data: Vec::new() });
    assert_eq!(got.remove(&3).unwrap().status, VIRTIO_BLK_S_OK);
    assert!(fs::read(&p).unwrap() == content, "a read-only image was modified");

    // Directly, too: the backend refuses even though nothing else would.
    let mut be: FileBackend = img.backend().unwrap();
    assert!(be.readonly());
    assert_eq!(be.write_at(0, &[1; 512]).unwrap_err().kind(), std::io::ErrorKind::PermissionDenied);
}

#[test]
fn spawning_with_no_backends_is_an_error() {
    let e = DiskWorkers::spawn_with::<MemBackend>(0, Vec::new(), Duration::ZERO, |_, _| {}).err().unwrap();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
}

/// A fenced disk: a write waits in its worker until the permit allows it
/// (a primary whose lease ran out waits for a renewal or the arbiter),
/// fails if the permit says never (deposed), and reads never wait.
#[test]
fn writes_wait_for_the_permit_and_fail_when_it_says_never() {
    let s = Scratch::new("permit");
    let path = s.0.join("d.img");
    fs::write(&path, vec![0u8; 1 << 16]).unwrap();
    let image = DiskImage::open(&path, false).unwrap();
    let (w, rx) = workers_with_channel(&image, 0, 2);
    // 0: not yet, 1: yes, 2: never.
    let verdict = Arc::new((Mutex::new(0u8), Condvar::new()));
    let v = verdict.clone();
    w.fence_with(Arc::new(move || {
        let (lock, cv) = &*v;
        let mut g = lock.lock().unwrap();
        while *g == 0 {
            g = cv.wait(g).unwrap();
        }
        *g == 1
    }));
    w.submit(1, BlkOp::Write { offset: 0, data: vec![0xaa; 512] });
    w.submit(2, BlkOp::Read { offset: 4096, len: 512 });
    let (_, tag, r) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!((tag, r.status), (2, VIRTIO_BLK_S_OK), "the read went first");
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err(), "the write did not wait");
    assert_eq!(fs::read(&path).unwrap()[0], 0);
    let set = |x: u8| {
        *verdict.0.lock().unwrap() = x;
        verdict.1.notify_all();
    };
    set(1);
    let (_, tag, r) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!((tag, r.status), (1, VIRTIO_BLK_S_OK));
    assert_eq!(fs::read(&path).unwrap()[0], 0xaa);
    set(2);
    w.submit(3, BlkOp::Write { offset: 0, data: vec![0xbb; 512] });
    let (_, tag, r) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!((tag, r.status), (3, VIRTIO_BLK_S_IOERR));
    assert_eq!(fs::read(&path).unwrap()[0], 0xaa, "a write landed after the permit said never");
}
