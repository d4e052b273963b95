//! virtio-blk through the virtio-mmio transport, driven by a fake driver.

use std::sync::{Arc, Mutex};

use super::*;
use crate::io::{IoCompletion, IoRequest};
use crate::virtio::mmio::*;
use crate::virtio::queue::{VIRTQ_DESC_F_INDIRECT, VIRTQ_DESC_F_NEXT, VIRTQ_DESC_F_WRITE};
use crate::virtio::testdriver::{TestDriver, IRQ, RAM_BASE, RAM_SIZE};
use crate::virtio::{VirtioMmio, VIRTIO_F_RING_EVENT_IDX, VIRTIO_F_VERSION_1};
use crate::{DeviceCtx, MmioDevice};

const SECTORS: u64 = 64;

/// A memory disk the test can look into while the device owns it.
#[derive(Clone)]
struct Shared(Arc<Mutex<MemBackend>>);

impl BlockBackend for Shared {
    fn size(&self) -> u64 {
        self.0.lock().unwrap().size()
    }
    fn read_at(&mut self, o: u64, b: &mut [u8]) -> io::Result<()> {
        self.0.lock().unwrap().read_at(o, b)
    }
    fn write_at(&mut self, o: u64, d: &[u8]) -> io::Result<()> {
        self.0.lock().unwrap().write_at(o, d)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0.lock().unwrap().flush()
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn rig_with(read_only: bool, want: u64) -> (TestDriver, Shared) {
    let disk = Shared(Arc::new(Mutex::new(MemBackend::new(pattern((SECTORS * 512) as usize, 7)))));
    let dev = BlkDevice::new(SECTORS * 512, read_only, "ftvm-disk0");
    let mut d = TestDriver::new(VirtioMmio::new(Box::new(dev), IRQ));
    d.disk = Some(Box::new(disk.clone()));
    let st = d.init(want, 16);
    assert_eq!(st & STATUS_DRIVER_OK, STATUS_DRIVER_OK, "status {st:#x}");
    (d, disk)
}

fn rig() -> (TestDriver, Shared) {
    rig_with(false, TestDriver::all_features())
}

fn header(d: &mut TestDriver, ty: u32, sector: u64) -> u64 {
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&ty.to_le_bytes());
    h[8..16].copy_from_slice(&sector.to_le_bytes());
    d.alloc_with(&h)
}

/// Posts a request and returns (status byte, used len).
fn request(d: &mut TestDriver, ty: u32, sector: u64, data: &[(u64, u32, bool)], indirect: bool) -> (u8, u32) {
    let h = header(d, ty, sector);
    let st = d.alloc_with(&[0xff]);
    let mut bufs = vec![(h, 16, false)];
    bufs.extend_from_slice(data);
    bufs.push((st, 1, true));
    let head = d.post(&bufs, indirect);
    d.kick(0);
    let (id, len) = d.pop_used().expect("request completed");
    assert_eq!(id, head as u32);
    (status_at(d, st), len)
}

fn status_at(d: &TestDriver, a: u64) -> u8 {
    let mut b = [0u8];
    d.ram.read(a, &mut b).unwrap();
    b[0]
}

#[test]
fn identity_features_and_config() {
    let (mut d, _) = rig();
    assert_eq!(d.r32(REG_DEVICE_ID), 2);
    assert_eq!(d.r32(REG_VENDOR_ID), VENDOR_ID);
    let f = d.device_features();
    assert_ne!(f & VIRTIO_F_VERSION_1, 0);
    assert_ne!(f & VIRTIO_BLK_F_FLUSH, 0);
    assert_eq!(f & VIRTIO_BLK_F_RO, 0);
    assert_eq!(d.read_config(0, 8), SECTORS);
    // Linux reads 64-bit fields as two 32-bit halves.
    assert_eq!(d.read_config(0, 4), SECTORS);
    assert_eq!(d.read_config(4, 4), 0);
    assert_eq!(d.read_config(8, 4), SIZE_MAX as u64);
    assert_eq!(d.read_config(12, 4), SEG_MAX as u64);
    assert_eq!(d.read_config(20, 4), 512);
    assert_eq!(d.read_config(0x200, 4), 0);
    assert_eq!(d.read_config(0xeff, 1), 0);
    assert_eq!(d.r32(REG_QUEUE_NUM_MAX), QUEUE_SIZE as u32);
    assert_eq!(d.r32(REG_SHM_LEN_LOW), u32::MAX);
}

#[test]
fn write_then_read_back_direct_and_indirect() {
    for indirect in [false, true] {
        let (mut d, disk) = rig();
        let data = pattern(1024, 99);
        let buf = d.alloc_with(&data);
        let (st, len) = request(&mut d, VIRTIO_BLK_T_OUT, 3, &[(buf, 1024, false)], indirect);
        assert_eq!((st, len), (VIRTIO_BLK_S_OK, 1));
        assert_eq!(&disk.0.lock().unwrap().data[3 * 512..5 * 512], &data[..]);
        assert!(d.line(), "used-buffer interrupt");
        assert_eq!(d.ack(), INT_USED_BUFFER);
        assert!(!d.line());

        // Read it back scattered over three buffers of uneven sizes.
        let a = d.alloc(100);
        let b = d.alloc(900);
        let c = d.alloc(24);
        let (st, len) = request(&mut d, VIRTIO_BLK_T_IN, 3, &[(a, 100, true), (b, 900, true), (c, 24, true)], indirect);
        assert_eq!((st, len), (VIRTIO_BLK_S_OK, 1025));
        let mut got = vec![0u8; 1024];
        d.ram.read(a, &mut got[..100]).unwrap();
        d.ram.read(b, &mut got[100..1000]).unwrap();
        d.ram.read(c, &mut got[1000..]).unwrap();
        assert_eq!(got, data);
        // Reads mark the destination pages dirty.
        let dirty = d.ram.take_dirty();
        assert!(dirty.contains(&(a >> 12)) && dirty.contains(&(c >> 12)));
    }
}

#[test]
fn request_framing_is_not_assumed() {
    // Header split across two descriptors, data and status in one buffer.
    let (mut d, _) = rig();
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&VIRTIO_BLK_T_IN.to_le_bytes());
    h[8..16].copy_from_slice(&1u64.to_le_bytes());
    let h1 = d.alloc_with(&h[..5]);
    let h2 = d.alloc_with(&h[5..]);
    let out = d.alloc(513);
    let head = d.post(&[(h1, 5, false), (h2, 11, false), (out, 513, true)], false);
    d.kick(0);
    assert_eq!(d.pop_used(), Some((head as u32, 513)));
    let mut got = vec![0u8; 513];
    d.ram.read(out, &mut got).unwrap();
    assert_eq!(&got[..512], &pattern((SECTORS * 512) as usize, 7)[512..1024]);
    assert_eq!(got[512], VIRTIO_BLK_S_OK);
}

#[test]
fn flush_get_id_and_unsupported() {
    let (mut d, disk) = rig();
    let (st, _) = request(&mut d, VIRTIO_BLK_T_FLUSH, 0, &[], false);
    assert_eq!(st, VIRTIO_BLK_S_OK);
    assert_eq!(disk.0.lock().unwrap().flushes, 1);

    let id = d.alloc(20);
    let (st, len) = request(&mut d, VIRTIO_BLK_T_GET_ID, 0, &[(id, 20, true)], false);
    assert_eq!((st, len), (VIRTIO_BLK_S_OK, 21), "20 id bytes, zero padded, plus status");
    let mut got = [0u8; 20];
    d.ram.read(id, &mut got).unwrap();
    assert_eq!(&got, b"ftvm-disk0\0\0\0\0\0\0\0\0\0\0");

    let (st, _) = request(&mut d, 11 /* DISCARD */, 0, &[], false);
    assert_eq!(st, VIRTIO_BLK_S_UNSUPP);
}

#[test]
fn bad_requests_get_ioerr() {
    let (mut d, disk) = rig();
    let before = disk.0.lock().unwrap().data.clone();
    let buf = d.alloc(1024);
    // Past the end, straddling the end, sector overflow, partial sector.
    for (ty, sector, len) in [
        (VIRTIO_BLK_T_IN, SECTORS, 512),
        (VIRTIO_BLK_T_OUT, SECTORS - 1, 1024),
        (VIRTIO_BLK_T_IN, u64::MAX, 512),
        (VIRTIO_BLK_T_OUT, 0, 100),
    ] {
        let w = ty == VIRTIO_BLK_T_IN;
        let (st, _) = request(&mut d, ty, sector, &[(buf, len, w)], false);
        assert_eq!(st, VIRTIO_BLK_S_IOERR, "type {ty} sector {sector} len {len}");
    }
    // Data buffer outside RAM, in both directions.
    for ty in [VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT] {
        let (st, _) = request(&mut d, ty, 0, &[(0x1000, 512, ty == VIRTIO_BLK_T_IN)], false);
        assert_eq!(st, VIRTIO_BLK_S_IOERR);
        let (st, _) = request(&mut d, ty, 0, &[(RAM_BASE + RAM_SIZE - 256, 512, ty == VIRTIO_BLK_T_IN)], false);
        assert_eq!(st, VIRTIO_BLK_S_IOERR);
    }
    // Short header.
    let h = header(&mut d, VIRTIO_BLK_T_IN, 0);
    let st = d.alloc_with(&[0xff]);
    let head = d.post(&[(h, 8, false), (st, 1, true)], false);
    d.kick(0);
    assert_eq!(d.pop_used(), Some((head as u32, 1)));
    assert_eq!(status_at(&d, st), VIRTIO_BLK_S_IOERR);
    // No writable byte at all: returned with length 0.
    let h = header(&mut d, VIRTIO_BLK_T_FLUSH, 0);
    let head = d.post(&[(h, 16, false)], false);
    d.kick(0);
    assert_eq!(d.pop_used(), Some((head as u32, 0)));
    // Status byte outside RAM: returned with length 0.
    let h = header(&mut d, VIRTIO_BLK_T_FLUSH, 0);
    let head = d.post(&[(h, 16, false), (0x10, 1, true)], false);
    d.kick(0);
    assert_eq!(d.pop_used(), Some((head as u32, 0)));
    assert_eq!(disk.0.lock().unwrap().data, before, "nothing was written");
    assert_eq!(d.r32(REG_STATUS) & STATUS_DEVICE_NEEDS_RESET, 0);
}

#[test]
fn read_only_disk_refuses_writes() {
    let (mut d, disk) = rig_with(true, TestDriver::all_features());
    assert_ne!(d.device_features() & VIRTIO_BLK_F_RO, 0);
    let before = disk.0.lock().unwrap().data.clone();
    let buf = d.alloc_with(&[1u8; 512]);
    let (st, _) = request(&mut d, VIRTIO_BLK_T_OUT, 0, &[(buf, 512, false)], false);
    assert_eq!(st, VIRTIO_BLK_S_IOERR);
    assert_eq!(disk.0.lock().unwrap().data, before);
    let (st, _) = request(&mut d, VIRTIO_BLK_T_IN, 0, &[(buf, 512, true)], false);
    assert_eq!(st, VIRTIO_BLK_S_OK);
}

#[test]
fn many_requests_wrap_the_rings() {
    let (mut d, _) = rig();
    let buf = d.alloc(512);
    // 16-entry queue; 300 requests wrap avail/used indices many times and
    // exercise the u16 index arithmetic.
    for i in 0..300u64 {
        let (st, len) = request(&mut d, VIRTIO_BLK_T_IN, i % SECTORS, &[(buf, 512, true)], i % 2 == 0);
        assert_eq!((st, len), (VIRTIO_BLK_S_OK, 513));
    }
}

#[test]
fn event_idx_suppresses_and_publishes() {
    let (mut d, _) = rig();
    assert_ne!(d.dev.driver_features() & VIRTIO_F_RING_EVENT_IDX, 0);
    let buf = d.alloc(512);
    // Ask for an interrupt only after the third completion (used idx 3,
    // i.e. used_event = 2).
    d.set_used_event(2);
    for i in 0..3 {
        request(&mut d, VIRTIO_BLK_T_IN, 0, &[(buf, 512, true)], false);
        assert_eq!(d.avail_event(), i + 1, "device publishes how far it consumed");
        assert_eq!(d.line(), i == 2, "after request {i}");
    }
    d.ack();
    // Without EVENT_IDX the NO_INTERRUPT flag suppresses.
    let (mut d, _) = rig_with(false, VIRTIO_F_VERSION_1);
    d.set_avail_flags(1);
    request(&mut d, VIRTIO_BLK_T_IN, 0, &[(buf, 512, true)], false);
    assert!(!d.line());
    d.set_avail_flags(0);
    request(&mut d, VIRTIO_BLK_T_IN, 0, &[(buf, 512, true)], false);
    assert!(d.line());
}

#[test]
fn negotiation_and_reset() {
    let dev = BlkDevice::new(4096, false, "x");
    let mut d = TestDriver::new(VirtioMmio::new(Box::new(dev), IRQ));
    d.disk = Some(Box::new(MemBackend::new(vec![0; 4096])));
    // A legacy driver without VERSION_1 is refused.
    let st = d.init(!VIRTIO_F_VERSION_1, 8);
    assert_eq!(st & STATUS_FEATURES_OK, 0);
    // Asking for features never offered is refused too.
    d.w32(REG_STATUS, 0);
    d.w32(REG_STATUS, STATUS_ACKNOWLEDGE | STATUS_DRIVER);
    d.w32(REG_DRIVER_FEATURES_SEL, 1);
    d.w32(REG_DRIVER_FEATURES, 1 | 0x8000_0000);
    d.w32(REG_STATUS, STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK);
    assert_eq!(d.r32(REG_STATUS) & STATUS_FEATURES_OK, 0);
    // DRIVER_OK without FEATURES_OK does not take.
    d.w32(REG_STATUS, STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_DRIVER_OK);
    assert_eq!(d.r32(REG_STATUS) & STATUS_DRIVER_OK, 0);
    // A proper init works, a request raises the line, reset drops it.
    assert_ne!(d.init(TestDriver::all_features(), 8) & STATUS_DRIVER_OK, 0);
    let buf = d.alloc(512);
    request(&mut d, VIRTIO_BLK_T_IN, 0, &[(buf, 512, true)], false);
    assert!(d.line());
    d.w32(REG_STATUS, 0);
    assert!(!d.line());
    assert_eq!(d.r32(REG_STATUS), 0);
    d.w32(REG_QUEUE_SEL, 0);
    assert_eq!(d.r32(REG_QUEUE_READY), 0);
    // Kicks after reset do nothing.
    d.kick(0);
    assert_eq!(d.r32(REG_INTERRUPT_STATUS), 0);
}

#[test]
fn empty_slot_reads_device_id_zero() {
    let mut d = TestDriver::new(VirtioMmio::empty(IRQ));
    assert_eq!(d.r32(REG_MAGIC), MAGIC);
    assert_eq!(d.r32(REG_VERSION), 2);
    assert_eq!(d.r32(REG_DEVICE_ID), 0);
    assert_eq!(d.device_features(), 0);
    d.w32(REG_STATUS, 0xff);
    assert_eq!(d.r32(REG_STATUS), 0);
    d.kick(0);
    assert_eq!(d.read_config(0, 4), 0);
    assert!(!d.line());
}

#[test]
fn odd_access_sizes_and_offsets_are_ignored() {
    let (mut d, _) = rig();
    let mut ctx = DeviceCtx { ram: &mut d.ram, irq: &mut d.irq };
    for off in [0u64, 2, 0x50, 0x70, 0xfc, 0x1000, 0xffff, u64::MAX] {
        for size in [1u8, 2, 3, 8, 16] {
            d.dev.write(off, size, u64::MAX, &mut ctx);
            d.dev.read(off, size, &mut ctx);
        }
    }
    assert_ne!(d.r32(REG_STATUS) & STATUS_DRIVER_OK, 0, "no sub-word write reached Status");
    // Config writes are ignored by virtio-blk.
    assert_eq!(d.read_config(0, 8), SECTORS);
}

#[test]
fn descriptor_loop_and_bad_indirect_tables_complete_with_zero() {
    let (mut d, _) = rig();
    let h = header(&mut d, VIRTIO_BLK_T_IN, 0);
    // Descriptor 0 -> 1 -> 0 -> ...
    d.write_desc(d.desc, 0, h, 16, VIRTQ_DESC_F_NEXT, 1);
    d.write_desc(d.desc, 1, h, 16, VIRTQ_DESC_F_NEXT | VIRTQ_DESC_F_WRITE, 0);
    d.push_avail(0);
    d.kick(0);
    assert_eq!(d.pop_used(), Some((0, 0)));
    // next out of range.
    d.write_desc(d.desc, 2, h, 16, VIRTQ_DESC_F_NEXT, 500);
    d.push_avail(2);
    // Indirect with bad length, nested indirect, indirect + NEXT,
    // indirect table outside RAM, indirect table that loops.
    let t = d.alloc(64);
    d.write_desc(d.desc, 3, t, 17, VIRTQ_DESC_F_INDIRECT, 0);
    d.push_avail(3);
    d.write_desc(t, 0, t, 32, VIRTQ_DESC_F_INDIRECT, 0);
    d.write_desc(d.desc, 4, t, 32, VIRTQ_DESC_F_INDIRECT, 0);
    d.push_avail(4);
    d.write_desc(d.desc, 5, t, 32, VIRTQ_DESC_F_INDIRECT | VIRTQ_DESC_F_NEXT, 6);
    d.push_avail(5);
    d.write_desc(d.desc, 6, 0x1000, 32, VIRTQ_DESC_F_INDIRECT, 0);
    d.push_avail(6);
    let t2 = d.alloc(32);
    d.write_desc(t2, 0, h, 16, VIRTQ_DESC_F_NEXT, 1);
    d.write_desc(t2, 1, h, 16, VIRTQ_DESC_F_NEXT, 0);
    d.write_desc(d.desc, 7, t2, 32, VIRTQ_DESC_F_INDIRECT, 0);
    d.push_avail(7);
    d.write_desc(d.desc, 8, t, 16 * 100_000, VIRTQ_DESC_F_INDIRECT, 0);
    d.push_avail(8);
    d.kick(0);
    for head in 2..=8 {
        assert_eq!(d.pop_used(), Some((head, 0)), "head {head}");
    }
    assert_eq!(d.r32(REG_STATUS) & STATUS_DEVICE_NEEDS_RESET, 0, "the queue itself is still fine");
}

#[test]
fn garbage_rings_break_the_queue_not_the_host() {
    // Head index beyond the queue.
    let (mut d, _) = rig();
    d.push_avail(999);
    d.kick(0);
    assert_eq!(d.pop_used(), None);
    assert_ne!(d.r32(REG_STATUS) & STATUS_DEVICE_NEEDS_RESET, 0);
    assert_ne!(d.r32(REG_INTERRUPT_STATUS) & INT_CONFIG_CHANGE, 0);
    assert!(d.line());
    // Further kicks are ignored until reset; reset recovers.
    d.kick(0);
    assert_ne!(d.init(TestDriver::all_features(), 16) & STATUS_DRIVER_OK, 0);
    assert_eq!(d.r32(REG_STATUS) & STATUS_DEVICE_NEEDS_RESET, 0);

    // avail idx far ahead of what the ring can hold.
    let (mut d, _) = rig();
    d.set_avail_idx(1000);
    d.kick(0);
    assert_ne!(d.r32(REG_STATUS) & STATUS_DEVICE_NEEDS_RESET, 0);

    // Rings outside RAM: QueueReady accepted, first kick breaks it.
    let dev = BlkDevice::new(4096, false, "x");
    let mut d = TestDriver::new(VirtioMmio::new(Box::new(dev), IRQ));
    d.used = RAM_BASE + RAM_SIZE - 8;
    d.init(TestDriver::all_features(), 16);
    d.kick(0);
    assert_ne!(d.r32(REG_STATUS) & STATUS_DEVICE_NEEDS_RESET, 0);

    // Queue size not a power of two, or larger than the maximum.
    for qsize in [3u32, 512, 0, 0x1_0000] {
        let dev = BlkDevice::new(4096, false, "x");
        let mut d = TestDriver::new(VirtioMmio::new(Box::new(dev), IRQ));
        d.init(TestDriver::all_features(), 8);
        d.w32(REG_STATUS, 0);
        d.w32(REG_STATUS, 3);
        d.w32(REG_DRIVER_FEATURES_SEL, 1);
        d.w32(REG_DRIVER_FEATURES, 1);
        d.w32(REG_STATUS, 11);
        d.w32(REG_QUEUE_SEL, 0);
        d.w32(REG_QUEUE_NUM, qsize);
        d.w32(REG_QUEUE_READY, 1);
        d.w32(REG_STATUS, 15);
        d.w32(REG_QUEUE_NOTIFY, 0);
        d.w32(REG_QUEUE_NOTIFY, 7);
        assert_ne!(d.r32(REG_STATUS) & STATUS_DEVICE_NEEDS_RESET, 0, "qsize {qsize}");
    }
}

/// Deterministic pseudo-random garbage in every ring and table: whatever
/// happens, nothing panics and every chain that comes back names a valid
/// head.
#[test]
fn fuzzed_rings_never_panic() {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..300 {
        let (mut d, _) = rig();
        let buf = d.alloc(4096);
        for i in 0..16u16 {
            let r = rnd();
            let addr = match r % 4 {
                0 => buf + (r >> 8) % 4096,
                1 => d.desc + 16 * ((r >> 8) % 16),
                2 => rnd(),
                _ => buf,
            };
            let len = match (r >> 4) % 4 {
                0 => 16,
                1 => 512,
                2 => (rnd() % 5000) as u32,
                _ => rnd() as u32,
            };
            let flags = (rnd() % 8) as u16;
            let next = (rnd() % 20) as u16;
            d.write_desc(d.desc, i, addr, len, flags, next);
        }
        // Headers in the buffer with random types and sectors.
        for k in 0..8 {
            let v = rnd();
            d.ram.write_u64(buf + 16 * k, v % 16).unwrap();
            d.ram.write_u64(buf + 16 * k + 8, rnd() % (SECTORS + 4)).unwrap();
        }
        let n = (rnd() % 20) as u16;
        for _ in 0..n {
            d.push_avail((rnd() % 18) as u16);
        }
        if round % 7 == 0 {
            d.set_avail_idx(rnd() as u16);
        }
        d.kick(0);
        while let Some((id, _)) = d.pop_used() {
            assert!(id < 16);
        }
        d.ack();
    }
}

#[test]
fn snapshot_restore_continues_where_it_left_off() {
    let (mut d, disk) = rig();
    let buf = d.alloc(512);
    for i in 0..5 {
        request(&mut d, VIRTIO_BLK_T_IN, i, &[(buf, 512, true)], false);
    }
    // Two requests in flight when the snapshot is taken.
    d.disk = None;
    let a = d.alloc(512);
    let b = d.alloc_with(&pattern(512, 9));
    let (ha, sa) = post_request(&mut d, VIRTIO_BLK_T_IN, 3, &[(a, 512, true)]);
    let (hb, sb) = post_request(&mut d, VIRTIO_BLK_T_OUT, 4, &[(b, 512, false)]);
    d.kick(0);
    assert_eq!(d.unserved.len(), 2);
    let blob = d.dev.snapshot();
    // A fresh slot restored from the blob knows what is in flight and
    // completes it when the (new) host answers the re-issued requests.
    let mut fresh = VirtioMmio::new(Box::new(BlkDevice::new(SECTORS * 512, false, "ftvm-disk0")), IRQ);
    fresh.restore(&blob).unwrap();
    assert_eq!(fresh.snapshot(), blob);
    assert_eq!(fresh.in_flight(), d.unserved);
    d.dev = fresh;
    assert_ne!(d.r32(REG_STATUS) & STATUS_DRIVER_OK, 0);
    let mut backend = disk.clone();
    for req in d.dev.in_flight() {
        let IoRequest::Disk { tag, op } = req else { panic!("not a disk request") };
        let result = execute(&op, &mut backend);
        assert!(d.inject(IoCompletion::Disk { tag, result }));
    }
    assert_eq!(d.pop_used().map(|u| u.0), Some(ha as u32));
    assert_eq!(d.pop_used().map(|u| u.0), Some(hb as u32));
    assert_eq!((status_at(&d, sa), status_at(&d, sb)), (VIRTIO_BLK_S_OK, VIRTIO_BLK_S_OK));
    assert_eq!(d.ram.slice(a, 512).unwrap(), &pattern((SECTORS * 512) as usize, 7)[3 * 512..4 * 512]);
    assert_eq!(&disk.0.lock().unwrap().data[4 * 512..5 * 512], &pattern(512, 9)[..]);
    d.disk = Some(Box::new(disk.clone()));
    let (st, len) = request(&mut d, VIRTIO_BLK_T_IN, 9, &[(buf, 512, true)], true);
    assert_eq!((st, len), (VIRTIO_BLK_S_OK, 513));
    // Mismatches and truncation are errors, not panics.
    assert!(VirtioMmio::empty(IRQ).restore(&blob).is_err());
    let other = BlkDevice::new(512, false, "");
    assert!(VirtioMmio::new(Box::new(other), IRQ).restore(&blob).is_err());
    for cut in [0, 5, blob.len() / 2, blob.len() - 1] {
        let dev = BlkDevice::new(SECTORS * 512, false, "");
        assert!(VirtioMmio::new(Box::new(dev), IRQ).restore(&blob[..cut]).is_err());
    }
}

/// Makes a request available without kicking; returns (head, status address).
fn post_request(d: &mut TestDriver, ty: u32, sector: u64, data: &[(u64, u32, bool)]) -> (u16, u64) {
    let h = header(d, ty, sector);
    let st = d.alloc_with(&[0xff]);
    let mut bufs = vec![(h, 16, false)];
    bufs.extend_from_slice(data);
    bufs.push((st, 1, true));
    (d.post(&bufs, false), st)
}

#[test]
fn requests_complete_out_of_order_at_injection() {
    // The guest sees nothing until the host's completion is applied, the
    // write uses the bytes as they were at the kick (bounce buffer), and
    // completions may come back in any order.
    let (mut d, disk) = rig();
    d.disk = None;
    let data = pattern(512, 42);
    let src = d.alloc_with(&data);
    let dst = d.alloc(512);
    let (hw, sw) = post_request(&mut d, VIRTIO_BLK_T_OUT, 2, &[(src, 512, false)]);
    let (hr, sr) = post_request(&mut d, VIRTIO_BLK_T_IN, 5, &[(dst, 512, true)]);
    d.kick(0);
    let reqs = std::mem::take(&mut d.unserved);
    assert_eq!(reqs.len(), 2);
    d.ram.write(src, &[0u8; 512]).unwrap();
    assert_eq!(d.pop_used(), None);
    assert!(!d.line());
    let mut backend = disk.clone();
    let results: Vec<_> = reqs
        .iter()
        .map(|r| match r {
            IoRequest::Disk { tag, op } => (*tag, execute(op, &mut backend)),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(&disk.0.lock().unwrap().data[1024..1536], &data[..]);
    // The read completes first.
    assert!(d.inject(IoCompletion::Disk { tag: results[1].0, result: results[1].1.clone() }));
    assert_eq!(d.pop_used(), Some((hr as u32, 513)));
    assert_eq!(status_at(&d, sr), VIRTIO_BLK_S_OK);
    assert_eq!(d.ram.slice(dst, 512).unwrap(), &pattern((SECTORS * 512) as usize, 7)[5 * 512..6 * 512]);
    assert!(d.line());
    assert!(d.inject(IoCompletion::Disk { tag: results[0].0, result: results[0].1.clone() }));
    assert_eq!(d.pop_used(), Some((hw as u32, 1)));
    assert_eq!(status_at(&d, sw), VIRTIO_BLK_S_OK);
    // A completion nobody waits for changes nothing.
    assert!(!d.inject(IoCompletion::Disk { tag: results[0].0, result: results[0].1.clone() }));
    assert_eq!(d.pop_used(), None);
}

#[test]
fn a_short_read_from_the_host_is_an_io_error() {
    let (mut d, _disk) = rig();
    d.disk = None;
    let dst = d.alloc(1024);
    let (h, st) = post_request(&mut d, VIRTIO_BLK_T_IN, 0, &[(dst, 1024, true)]);
    d.kick(0);
    let IoRequest::Disk { tag, .. } = d.unserved[0] else { panic!() };
    assert!(d.inject(IoCompletion::Disk { tag, result: BlkResult { status: VIRTIO_BLK_S_OK, data: vec![1; 100] } }));
    assert_eq!(d.pop_used().map(|u| u.0), Some(h as u32));
    assert_eq!(status_at(&d, st), VIRTIO_BLK_S_IOERR);
}

#[test]
fn reset_forgets_requests_in_flight() {
    let (mut d, _disk) = rig();
    d.disk = None;
    let dst = d.alloc(512);
    post_request(&mut d, VIRTIO_BLK_T_IN, 0, &[(dst, 512, true)]);
    d.kick(0);
    let IoRequest::Disk { tag, .. } = d.unserved[0] else { panic!() };
    d.w32(REG_STATUS, 0);
    assert!(d.dev.in_flight().is_empty());
    assert!(!d.inject(IoCompletion::Disk { tag, result: BlkResult { status: 0, data: vec![0; 512] } }));
}
