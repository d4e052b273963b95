//! virtio-net through the virtio-mmio transport, driven by a fake driver.

use super::*;
use crate::io::{IoCompletion, IoRequest};
use crate::virtio::mmio::*;
use crate::virtio::queue::{VIRTQ_DESC_F_NEXT, VIRTQ_DESC_F_WRITE};
use crate::virtio::testdriver::{TestDriver, IRQ, RAM_BASE, RAM_SIZE};
use crate::virtio::{VirtioMmio, VIRTIO_F_VERSION_1};

const MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
const QSIZE: u16 = 16;

fn rig() -> TestDriver {
    let mut d = TestDriver::new(VirtioMmio::new(Box::new(NetDevice::new(MAC)), IRQ));
    let st = d.init_queues(TestDriver::all_features(), &[QSIZE, QSIZE]);
    assert_eq!(st & STATUS_DRIVER_OK, STATUS_DRIVER_OK, "status {st:#x}");
    d
}

fn frame(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed)).collect()
}

/// Header (all zero, as a driver without offloads sends it) and frame.
fn tx_bytes(f: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; NET_HDR_LEN];
    b.extend_from_slice(f);
    b
}

/// Puts `bytes` in guest memory cut at `cuts` and returns the buffers.
fn split(d: &mut TestDriver, bytes: &[u8], cuts: &[usize]) -> Vec<(u64, u32, bool)> {
    let mut bufs = Vec::new();
    let mut at = 0;
    for &end in cuts.iter().chain(std::iter::once(&bytes.len())) {
        let a = d.alloc_with(&bytes[at..end]);
        bufs.push((a, (end - at) as u32, false));
        at = end;
    }
    bufs
}

fn input_ready(d: &TestDriver) -> bool {
    d.dev.input_ready(&d.ram)
}

fn used_idx(d: &TestDriver, q: usize) -> u16 {
    d.ram.read_u16(d.ring(q).used + 2).unwrap()
}

#[test]
fn identity_features_and_config() {
    let mut d = rig();
    assert_eq!(d.r32(REG_DEVICE_ID), 1);
    let f = d.device_features();
    assert_ne!(f & VIRTIO_F_VERSION_1, 0);
    assert_eq!(f & 0xff_ffff, VIRTIO_NET_F_MAC | VIRTIO_NET_F_STATUS, "no offloads, no MRG_RXBUF, no CTRL_VQ, no MQ");
    assert_eq!(
        d.dev.driver_features() & (VIRTIO_NET_F_MAC | VIRTIO_NET_F_STATUS),
        VIRTIO_NET_F_MAC | VIRTIO_NET_F_STATUS
    );
    for (i, &b) in MAC.iter().enumerate() {
        assert_eq!(d.read_config(i as u64, 1), b as u64);
    }
    assert_eq!(d.read_config(0, 4), u32::from_le_bytes([MAC[0], MAC[1], MAC[2], MAC[3]]) as u64);
    assert_eq!(d.read_config(6, 2), VIRTIO_NET_S_LINK_UP as u64);
    assert_eq!(d.read_config(8, 2), 0, "max_virtqueue_pairs: MQ not offered");
    assert_eq!(d.read_config(10, 2), 0, "mtu: not offered");
    assert_eq!(d.read_config(0xeff, 1), 0);
    for q in 0..2 {
        d.w32(REG_QUEUE_SEL, q);
        assert_eq!(d.r32(REG_QUEUE_NUM_MAX), QUEUE_SIZE as u32);
    }
    d.w32(REG_QUEUE_SEL, 2);
    assert_eq!(d.r32(REG_QUEUE_NUM_MAX), 0, "no control queue");
    // The MAC is not writable.
    let mut ctx = crate::DeviceCtx { ram: &mut d.ram, irq: &mut d.irq };
    crate::MmioDevice::write(&mut d.dev, CONFIG_SPACE, 4, 0xffff_ffff, &mut ctx);
    assert_eq!(d.read_config(0, 1), MAC[0] as u64);
    assert_eq!(d.dev.device_as::<NetDevice>().map(|n| n.mac()), Some(MAC));
}

#[test]
fn tx_frames_leave_bare_direct_and_indirect() {
    for indirect in [false, true] {
        let mut d = rig();
        // The header split across two buffers, the second also holding the
        // start of the frame.
        let f1 = frame(60, 1);
        let bufs = split(&mut d, &tx_bytes(&f1), &[5, 20]);
        let h1 = d.post_on(1, &bufs, indirect);
        // Header alone in one buffer, frame in another; a writable buffer
        // in a transmit chain is ignored.
        let f2 = frame(1514, 2);
        let mut bufs = split(&mut d, &tx_bytes(&f2), &[NET_HDR_LEN]);
        let junk = d.alloc(64);
        bufs.push((junk, 64, true));
        let h2 = d.post_on(1, &bufs, indirect);
        assert!(d.unserved.is_empty(), "nothing leaves before the kick");
        d.kick(1);
        assert_eq!(d.unserved, vec![IoRequest::NetTx { frame: f1 }, IoRequest::NetTx { frame: f2 }]);
        assert!(!d.unserved[0].expects_completion());
        assert_eq!(d.pop_used_on(1), Some((h1 as u32, 0)));
        assert_eq!(d.pop_used_on(1), Some((h2 as u32, 0)));
        assert_eq!(d.pop_used_on(1), None);
        assert_eq!(d.pop_used_on(0), None);
        assert!(d.line());
        assert_eq!(d.ack(), INT_USED_BUFFER);
        assert!(d.dev.in_flight().is_empty(), "transmit waits for nothing");
        assert!(!input_ready(&d));
    }
}

#[test]
fn tx_boundaries_and_malformed_chains() {
    let mut d = rig();
    let min = frame(MIN_FRAME, 3);
    let max = frame(MAX_FRAME, 4);
    let cases: Vec<(Vec<u8>, bool)> = vec![
        (vec![0u8; NET_HDR_LEN - 1], false),         // shorter than the header
        (vec![0u8; NET_HDR_LEN], false),             // header, no frame
        (tx_bytes(&frame(MIN_FRAME - 1, 5)), false), // runt
        (tx_bytes(&min), true),
        (tx_bytes(&max), true),
        (tx_bytes(&frame(MAX_FRAME + 1, 6)), false), // oversize
    ];
    let mut heads = Vec::new();
    for (bytes, _) in &cases {
        let bufs = split(&mut d, bytes, &[bytes.len() / 2]);
        heads.push(d.post_on(1, &bufs, false));
    }
    d.kick(1);
    assert_eq!(d.unserved, vec![IoRequest::NetTx { frame: min }, IoRequest::NetTx { frame: max }]);
    for h in heads {
        assert_eq!(d.pop_used_on(1), Some((h as u32, 0)));
    }
    d.unserved.clear();

    // Buffers outside RAM or straddling its end, a frame only in writable
    // buffers, a descriptor loop, a next index out of range.
    let ring = d.ring(1);
    let h = d.post_on(1, &[(0x1000, 100, false)], false);
    let h2 = d.post_on(1, &[(RAM_BASE + RAM_SIZE - 50, 100, false)], true);
    let w = d.alloc(100);
    let h3 = d.post_on(1, &[(w, 100, true)], false);
    let b = d.alloc_with(&tx_bytes(&frame(60, 7)));
    d.write_desc(ring.desc, 10, b, 72, VIRTQ_DESC_F_NEXT, 11);
    d.write_desc(ring.desc, 11, b, 72, VIRTQ_DESC_F_NEXT, 10);
    d.push_avail_on(1, 10);
    d.write_desc(ring.desc, 12, b, 72, VIRTQ_DESC_F_NEXT | VIRTQ_DESC_F_WRITE, 999);
    d.push_avail_on(1, 12);
    d.kick(1);
    assert!(d.unserved.is_empty(), "{:?}", d.unserved.len());
    for head in [h, h2, h3, 10, 12] {
        assert_eq!(d.pop_used_on(1), Some((head as u32, 0)));
    }
    assert_eq!(d.r32(REG_STATUS) & STATUS_DEVICE_NEEDS_RESET, 0, "the queue itself is fine");
}

#[test]
fn rx_waits_for_a_buffer_and_fills_it() {
    let mut d = rig();
    let f = frame(100, 9);
    // No buffer: not ready, and a frame offered anyway is refused with no
    // effect at all.
    assert!(!input_ready(&d));
    let before = d.ram.as_slice().to_vec();
    assert!(!d.inject(IoCompletion::NetRx { frame: f.clone() }));
    assert_eq!(d.ram.as_slice(), &before[..]);
    assert!(!d.line());
    assert_eq!(used_idx(&d, 0), 0);

    // A buffer split so the header straddles two descriptors.
    let a = d.alloc(10);
    let b = d.alloc(1516);
    let head = d.post_on(0, &[(a, 10, true), (b, 1516, true)], false);
    assert!(input_ready(&d), "a posted buffer is enough, no kick needed");
    d.kick(0);
    assert!(d.unserved.is_empty());
    assert_eq!(d.pop_used_on(0), None, "a receive kick consumes nothing");
    assert!(input_ready(&d));

    assert!(d.inject(IoCompletion::NetRx { frame: f.clone() }));
    assert_eq!(d.pop_used_on(0), Some((head as u32, (NET_HDR_LEN + f.len()) as u32)));
    let mut got = vec![0u8; NET_HDR_LEN + f.len()];
    d.ram.read(a, &mut got[..10]).unwrap();
    d.ram.read(b, &mut got[10..]).unwrap();
    let mut hdr = [0u8; NET_HDR_LEN];
    hdr[10] = 1; // num_buffers
    assert_eq!(&got[..NET_HDR_LEN], &hdr);
    assert_eq!(&got[NET_HDR_LEN..], &f[..]);
    assert!(d.line());
    assert_eq!(d.ack(), INT_USED_BUFFER);
    assert!(!input_ready(&d), "the only buffer is used");
    assert!(!d.inject(IoCompletion::NetRx { frame: f }));
}

#[test]
fn rx_through_indirect_and_wrapping_rings() {
    let mut d = rig();
    let buf = d.alloc(1526);
    // 16-entry queues; 100 frames each way wrap the indices several times.
    for i in 0..100u32 {
        let f = frame(14 + (i as usize * 37) % 1500, i as u8);
        let head = d.post_on(0, &[(buf, 1526, true)], i % 2 == 0);
        assert!(d.inject(IoCompletion::NetRx { frame: f.clone() }));
        assert_eq!(d.pop_used_on(0), Some((head as u32, (NET_HDR_LEN + f.len()) as u32)));
        assert_eq!(d.ram.slice(buf + NET_HDR_LEN as u64, f.len() as u64).unwrap(), &f[..]);
        let bufs = split(&mut d, &tx_bytes(&f), &[]);
        let head = d.post_on(1, &bufs, i % 3 == 0);
        d.kick(1);
        assert_eq!(d.pop_used_on(1), Some((head as u32, 0)));
        assert_eq!(d.unserved.pop(), Some(IoRequest::NetTx { frame: f }));
    }
}

#[test]
fn rx_unusable_buffers_lose_the_frame() {
    let mut d = rig();
    let f = frame(100, 11);
    // Too small for header + frame, by one byte.
    let small = d.alloc(NET_HDR_LEN as u64 + 99);
    let h1 = d.post_on(0, &[(small, NET_HDR_LEN as u32 + 99, true)], false);
    // Outside RAM; only readable buffers; a chain that loops.
    let h2 = d.post_on(0, &[(0x1000, 2048, true)], false);
    let r = d.alloc(2048);
    let h3 = d.post_on(0, &[(r, 2048, false)], false);
    let ring = d.ring(0);
    d.write_desc(ring.desc, 10, r, 16, VIRTQ_DESC_F_NEXT | VIRTQ_DESC_F_WRITE, 10);
    d.push_avail_on(0, 10);
    let good = d.alloc(2048);
    let h5 = d.post_on(0, &[(good, 2048, true)], false);
    for head in [h1, h2, h3, 10] {
        assert!(d.inject(IoCompletion::NetRx { frame: f.clone() }), "a buffer was consumed");
        assert_eq!(d.pop_used_on(0), Some((head as u32, 0)));
    }
    assert_eq!(d.ram.slice(small, NET_HDR_LEN as u64 + 99).unwrap(), &vec![0u8; NET_HDR_LEN + 99][..]);
    // An exact fit works.
    let exact = frame(2048 - NET_HDR_LEN, 12);
    assert!(d.inject(IoCompletion::NetRx { frame: exact }));
    assert_eq!(d.pop_used_on(0), Some((h5 as u32, 2048)));
    assert_eq!(d.r32(REG_STATUS) & STATUS_DEVICE_NEEDS_RESET, 0);
}

#[test]
fn rx_refuses_impossible_frames() {
    let mut d = rig();
    let big = d.alloc((NET_HDR_LEN + MAX_FRAME) as u64);
    let head = d.post_on(0, &[(big, (NET_HDR_LEN + MAX_FRAME) as u32, true)], false);
    for len in [0, MIN_FRAME - 1, MAX_FRAME + 1] {
        assert!(!d.inject(IoCompletion::NetRx { frame: frame(len, 1) }), "len {len}");
        assert!(input_ready(&d), "the buffer is still there");
        assert_eq!(used_idx(&d, 0), 0);
    }
    // Other completions are not for us.
    assert!(!d.inject(IoCompletion::Entropy { tag: 0, data: vec![1] }));
    let f = frame(MAX_FRAME, 2);
    assert!(d.inject(IoCompletion::NetRx { frame: f.clone() }));
    assert_eq!(d.pop_used_on(0), Some((head as u32, (NET_HDR_LEN + MAX_FRAME) as u32)));
    assert_eq!(d.ram.slice(big + NET_HDR_LEN as u64, MAX_FRAME as u64).unwrap(), &f[..]);
}

#[test]
fn nothing_is_received_before_driver_ok_or_after_reset() {
    let mut d = TestDriver::new(VirtioMmio::new(Box::new(NetDevice::new(MAC)), IRQ));
    assert!(!input_ready(&d));
    assert!(!d.inject(IoCompletion::NetRx { frame: frame(60, 0) }));
    let mut d = rig();
    let buf = d.alloc(1526);
    d.post_on(0, &[(buf, 1526, true)], false);
    assert!(input_ready(&d));
    d.w32(REG_STATUS, 0);
    assert!(!input_ready(&d));
    assert!(!d.inject(IoCompletion::NetRx { frame: frame(60, 0) }));
    // Reset forgets the negotiated features.
    let fresh = NetDevice::new(MAC);
    assert_eq!(d.dev.device_as::<NetDevice>().map(|n| n.snapshot()), Some(fresh.snapshot()));
}

#[test]
fn garbage_rings_break_the_queue_not_the_host() {
    let mut d = rig();
    d.push_avail_on(1, 999);
    d.kick(1);
    assert_ne!(d.r32(REG_STATUS) & STATUS_DEVICE_NEEDS_RESET, 0);
    let mut d = rig();
    d.set_avail_idx_on(0, 1000);
    // A garbage index looks like buffers until the device tries to take one.
    assert!(input_ready(&d));
    assert!(!d.inject(IoCompletion::NetRx { frame: frame(60, 0) }));
    assert_ne!(d.r32(REG_STATUS) & STATUS_DEVICE_NEEDS_RESET, 0);
    assert!(!input_ready(&d), "a broken queue takes nothing");
}

/// Deterministic pseudo-random garbage in both queues' rings and tables,
/// and frames of any size: nothing panics, and every chain that comes back
/// names a valid head.
#[test]
fn fuzzed_rings_never_panic() {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..200 {
        let mut d = rig();
        let buf = d.alloc(4096);
        let junk: Vec<u8> = (0..4096).map(|_| rnd() as u8).collect();
        d.ram.write(buf, &junk).unwrap();
        for q in 0..2 {
            let table = d.ring(q).desc;
            for i in 0..QSIZE {
                let r = rnd();
                let addr = match r % 4 {
                    0 => buf + (r >> 8) % 4096,
                    1 => table + 16 * ((r >> 8) % 16),
                    2 => rnd(),
                    _ => buf,
                };
                let len = match (r >> 4) % 4 {
                    0 => 12,
                    1 => 1526,
                    2 => (rnd() % 5000) as u32,
                    _ => rnd() as u32,
                };
                d.write_desc(table, i, addr, len, (rnd() % 8) as u16, (rnd() % 20) as u16);
            }
            for _ in 0..rnd() % 20 {
                d.push_avail_on(q, (rnd() % 18) as u16);
            }
            if round % 7 == q {
                d.set_avail_idx_on(q, rnd() as u16);
            }
        }
        d.kick(1);
        d.kick(0);
        for _ in 0..rnd() % 20 {
            let len = match rnd() % 3 {
                0 => (rnd() % 2000) as usize,
                1 => (rnd() % 70000) as usize,
                _ => 60,
            };
            d.inject(IoCompletion::NetRx { frame: frame(len, round as u8) });
        }
        for q in 0..2 {
            while let Some((id, _)) = d.pop_used_on(q) {
                assert!(id < QSIZE as u32);
            }
        }
        for r in d.unserved.drain(..) {
            let IoRequest::NetTx { frame } = r else { panic!("unexpected {r:?}") };
            assert!((MIN_FRAME..=MAX_FRAME).contains(&frame.len()));
        }
        d.ack();
    }
}

#[test]
fn snapshot_restore_round_trip() {
    let mut d = rig();
    let buf = d.alloc(1526);
    d.post_on(0, &[(buf, 1526, true)], false);
    assert!(d.inject(IoCompletion::NetRx { frame: frame(60, 1) }));
    d.post_on(0, &[(buf, 1526, true)], false);
    let blob = d.dev.snapshot();
    let mut fresh = VirtioMmio::new(Box::new(NetDevice::new(MAC)), IRQ);
    fresh.restore(&blob).unwrap();
    assert_eq!(fresh.snapshot(), blob);
    assert!(fresh.in_flight().is_empty());
    // The restored slot carries on: the second buffer takes the next frame.
    d.dev = fresh;
    assert!(input_ready(&d));
    let f = frame(200, 2);
    assert!(d.inject(IoCompletion::NetRx { frame: f.clone() }));
    assert_eq!(d.pop_used_on(0).map(|u| u.1), Some(NET_HDR_LEN as u32 + 60));
    assert_eq!(d.pop_used_on(0).map(|u| u.1), Some((NET_HDR_LEN + f.len()) as u32));
    let bufs = split(&mut d, &tx_bytes(&f), &[]);
    d.post_on(1, &bufs, false);
    d.kick(1);
    assert_eq!(d.unserved, vec![IoRequest::NetTx { frame: f }]);

    // The device blob alone.
    let mut dev = NetDevice::new(MAC);
    let dblob = d.dev.device_as::<NetDevice>().map(|n| n.snapshot()).unwrap();
    dev.restore(&dblob).unwrap();
    assert_eq!(dev.snapshot(), dblob);
    // Another MAC, another device type, a foreign blob, truncation.
    let mut other = NetDevice::new([2, 0, 0, 0, 0, 1]);
    let e = other.restore(&dblob).unwrap_err();
    assert!(matches!(e, SnapshotError::OtherMac { .. }), "{e:?}");
    let text = e.to_string();
    assert!(text.contains("52:54:00:12:34:56") && text.contains("02:00:00:00:00:01"), "{e}");
    assert!(VirtioMmio::new(Box::new(NetDevice::new([2, 0, 0, 0, 0, 1])), IRQ).restore(&blob).is_err());
    assert!(VirtioMmio::new(Box::new(crate::virtio::rng::RngDevice::new()), IRQ).restore(&blob).is_err());
    assert!(NetDevice::new(MAC).restore(&crate::virtio::rng::RngDevice::new().snapshot()).is_err());
    for cut in 0..dblob.len() {
        assert!(NetDevice::new(MAC).restore(&dblob[..cut]).is_err(), "cut {cut}");
    }
    for cut in [0, 5, blob.len() / 2, blob.len() - 1] {
        assert!(VirtioMmio::new(Box::new(NetDevice::new(MAC)), IRQ).restore(&blob[..cut]).is_err());
    }
    let mut long = dblob.clone();
    long.push(0);
    assert!(NetDevice::new(MAC).restore(&long).is_err());
}
