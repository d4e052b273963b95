//! virtio-rng through the virtio-mmio transport, driven by a fake driver.

use super::*;
use crate::io::{IoCompletion, IoRequest};
use crate::virtio::mmio::*;
use crate::virtio::testdriver::{TestDriver, IRQ, RAM_BASE, RAM_SIZE};
use crate::virtio::{VirtioMmio, VIRTIO_F_VERSION_1};

const QSIZE: u16 = 16;

fn rig_sized(qsize: u16) -> TestDriver {
    let mut d = TestDriver::new(VirtioMmio::new(Box::new(RngDevice::new()), IRQ));
    let st = d.init(TestDriver::all_features(), qsize);
    assert_eq!(st & STATUS_DRIVER_OK, STATUS_DRIVER_OK, "status {st:#x}");
    d
}

fn rig() -> TestDriver {
    rig_sized(QSIZE)
}

fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed)).collect()
}

/// The tag of the only request the device issued since the last call.
fn only_request(d: &mut TestDriver) -> (u32, u32) {
    let reqs = std::mem::take(&mut d.unserved);
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    match reqs[0] {
        IoRequest::Entropy { tag, len } => (tag, len),
        ref r => panic!("unexpected {r:?}"),
    }
}

#[test]
fn identity_features_and_config() {
    let mut d = rig();
    assert_eq!(d.r32(REG_DEVICE_ID), 4);
    let f = d.device_features();
    assert_ne!(f & VIRTIO_F_VERSION_1, 0);
    assert_eq!(f & 0xff_ffff, 0);
    assert_eq!(d.read_config(0, 4), 0);
    assert_eq!(d.r32(REG_QUEUE_NUM_MAX), QUEUE_SIZE as u32);
    d.w32(REG_QUEUE_SEL, 1);
    assert_eq!(d.r32(REG_QUEUE_NUM_MAX), 0);
    assert!(!d.dev.input_ready(&d.ram));
}

#[test]
fn request_is_filled_when_the_host_answers() {
    let mut d = rig();
    let buf = d.alloc(32);
    let head = d.post(&[(buf, 32, true)], false);
    d.kick(0);
    let (tag, len) = only_request(&mut d);
    assert_eq!(len, 32);
    assert!(IoRequest::Entropy { tag, len }.expects_completion());
    assert_eq!(d.dev.in_flight(), vec![IoRequest::Entropy { tag, len }]);
    assert_eq!(d.pop_used(), None, "nothing before the answer");
    assert!(!d.line());
    let data = bytes(32, 1);
    assert!(d.inject(IoCompletion::Entropy { tag, data: data.clone() }));
    assert_eq!(d.pop_used(), Some((head as u32, 32)));
    assert_eq!(d.ram.slice(buf, 32).unwrap(), &data[..]);
    assert!(d.line());
    assert!(d.dev.in_flight().is_empty());
    // Answering again, or a tag never issued, or another kind: no effect.
    assert!(!d.inject(IoCompletion::Entropy { tag, data: data.clone() }));
    assert!(!d.inject(IoCompletion::Entropy { tag: 77, data }));
    assert!(!d.inject(IoCompletion::NetRx { frame: vec![0; 60] }));
    assert_eq!(d.pop_used(), None);
}

#[test]
fn large_buffers_ask_for_at_most_4096_bytes() {
    for indirect in [false, true] {
        let mut d = rig();
        let a = d.alloc(3000);
        let b = d.alloc(7000);
        d.ram.write(a, &[0xee; 3000]).unwrap();
        d.ram.write(b, &[0xee; 7000]).unwrap();
        let head = d.post(&[(a, 3000, true), (b, 7000, true)], indirect);
        d.kick(0);
        let (tag, len) = only_request(&mut d);
        assert_eq!(len, MAX_REQUEST);
        // More than asked: the excess is ignored.
        let data = bytes(5000, 2);
        assert!(d.inject(IoCompletion::Entropy { tag, data: data.clone() }));
        assert_eq!(d.pop_used(), Some((head as u32, MAX_REQUEST)));
        assert_eq!(d.ram.slice(a, 3000).unwrap(), &data[..3000]);
        assert_eq!(d.ram.slice(b, 1096).unwrap(), &data[3000..4096]);
        assert_eq!(d.ram.slice(b + 1096, 7000 - 1096).unwrap(), &vec![0xee; 7000 - 1096][..]);
    }
}

#[test]
fn short_and_empty_answers() {
    let mut d = rig();
    let buf = d.alloc(64);
    d.ram.write(buf, &[0xee; 64]).unwrap();
    let h1 = d.post(&[(buf, 64, true)], false);
    d.kick(0);
    let (t1, _) = only_request(&mut d);
    assert!(d.inject(IoCompletion::Entropy { tag: t1, data: vec![1; 10] }));
    assert_eq!(d.pop_used(), Some((h1 as u32, 10)));
    assert_eq!(d.ram.slice(buf, 11).unwrap(), &[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0xee]);
    // The host's entropy source failed: the buffer comes back empty.
    let h2 = d.post(&[(buf, 64, true)], false);
    d.kick(0);
    let (t2, _) = only_request(&mut d);
    assert_ne!(t1, t2);
    assert!(d.inject(IoCompletion::Entropy { tag: t2, data: Vec::new() }));
    assert_eq!(d.pop_used(), Some((h2 as u32, 0)));
}

#[test]
fn requests_complete_in_any_order() {
    let mut d = rig();
    let bufs: Vec<u64> = (0..3).map(|_| d.alloc(16)).collect();
    let heads: Vec<u16> = bufs.iter().map(|&b| d.post(&[(b, 16, true)], false)).collect();
    d.kick(0);
    let reqs = std::mem::take(&mut d.unserved);
    let tags: Vec<u32> = reqs
        .iter()
        .map(|r| match r {
            IoRequest::Entropy { tag, len: 16 } => *tag,
            r => panic!("unexpected {r:?}"),
        })
        .collect();
    assert_eq!(tags, vec![0, 1, 2]);
    assert_eq!(d.dev.in_flight(), reqs, "in flight, in tag order");
    for i in [2, 0, 1] {
        assert!(d.inject(IoCompletion::Entropy { tag: tags[i], data: bytes(16, i as u8) }));
        assert_eq!(d.pop_used(), Some((heads[i] as u32, 16)));
        assert_eq!(d.ram.slice(bufs[i], 16).unwrap(), &bytes(16, i as u8)[..]);
    }
}

#[test]
fn chains_without_room_or_malformed_come_back_at_once() {
    let mut d = rig();
    let r = d.alloc(16);
    // Only readable buffers; a zero-length writable buffer; a loop.
    let h1 = d.post(&[(r, 16, false)], false);
    let h2 = d.post(&[(r, 0, true)], true);
    let desc = d.desc;
    d.write_desc(desc, 10, r, 16, crate::virtio::queue::VIRTQ_DESC_F_NEXT | 2, 10);
    d.push_avail(10);
    d.kick(0);
    assert!(d.unserved.is_empty());
    for h in [h1, h2, 10] {
        assert_eq!(d.pop_used(), Some((h as u32, 0)));
    }
    // A buffer outside RAM is asked for but gets nothing.
    let h = d.post(&[(RAM_BASE + RAM_SIZE - 8, 64, true)], false);
    d.kick(0);
    let (tag, len) = only_request(&mut d);
    assert_eq!(len, 64);
    assert!(d.inject(IoCompletion::Entropy { tag, data: vec![5; 64] }));
    assert_eq!(d.pop_used(), Some((h as u32, 0)));
    assert_eq!(d.r32(REG_STATUS) & STATUS_DEVICE_NEEDS_RESET, 0);
}

#[test]
fn a_driver_reposting_heads_cannot_grow_in_flight_without_bound() {
    let mut d = rig_sized(QUEUE_SIZE);
    let buf = d.alloc(8);
    let desc = d.desc;
    d.write_desc(desc, 0, buf, 8, 2, 0);
    // A ring's worth taken, then another ring's worth that must wait.
    for _ in 0..2 {
        for _ in 0..QUEUE_SIZE {
            d.push_avail(0);
        }
        d.kick(0);
    }
    assert_eq!(d.dev.device_as::<RngDevice>().map(|r| r.in_flight_count()), Some(QUEUE_SIZE as usize));
    let IoRequest::Entropy { tag, .. } = d.unserved[0] else { panic!() };
    assert!(d.inject(IoCompletion::Entropy { tag, data: vec![1; 8] }));
    d.kick(0);
    assert_eq!(d.dev.in_flight().len(), QUEUE_SIZE as usize, "room for one more, taken at the next kick");
    assert_eq!(d.unserved.len(), QUEUE_SIZE as usize + 1);
    assert_eq!(d.r32(REG_STATUS) & STATUS_DEVICE_NEEDS_RESET, 0);
}

#[test]
fn snapshot_with_requests_in_flight_completes_after_restore() {
    let mut d = rig();
    // Some history so next_tag is not 0.
    let buf = d.alloc(16);
    for _ in 0..3 {
        d.post(&[(buf, 16, true)], false);
        d.kick(0);
        let (tag, _) = only_request(&mut d);
        assert!(d.inject(IoCompletion::Entropy { tag, data: vec![0; 16] }));
        d.pop_used();
    }
    let a = d.alloc(32);
    let b1 = d.alloc(5);
    let b2 = d.alloc(20);
    let ha = d.post(&[(a, 32, true)], false);
    let hb = d.post(&[(b1, 5, true), (b2, 20, true)], true);
    d.kick(0);
    let issued = std::mem::take(&mut d.unserved);
    assert_eq!(issued, vec![IoRequest::Entropy { tag: 3, len: 32 }, IoRequest::Entropy { tag: 4, len: 25 }]);
    let blob = d.dev.snapshot();
    let mut fresh = VirtioMmio::new(Box::new(RngDevice::new()), IRQ);
    fresh.restore(&blob).unwrap();
    assert_eq!(fresh.snapshot(), blob);
    assert_eq!(fresh.in_flight(), issued);
    d.dev = fresh;
    // The new host answers the re-issued requests, in reverse for fun.
    let data = bytes(25, 9);
    assert!(d.inject(IoCompletion::Entropy { tag: 4, data: data.clone() }));
    assert!(d.inject(IoCompletion::Entropy { tag: 3, data: bytes(32, 3) }));
    assert_eq!(d.pop_used(), Some((hb as u32, 25)));
    assert_eq!(d.pop_used(), Some((ha as u32, 32)));
    assert_eq!(d.ram.slice(b1, 5).unwrap(), &data[..5]);
    assert_eq!(d.ram.slice(b2, 20).unwrap(), &data[5..]);
    assert_eq!(d.ram.slice(a, 32).unwrap(), &bytes(32, 3)[..]);
    // Tags carry on from the snapshot.
    d.post(&[(buf, 16, true)], false);
    d.kick(0);
    assert_eq!(only_request(&mut d), (5, 16));

    // The device blob: truncation, trailing bytes, foreign blobs, and
    // decoded nonsense are errors.
    let dblob = RngDevice::new().snapshot();
    let dev_blob = {
        let mut w = SnapWriter::new(b"VRNG", 1);
        w.u32(9);
        w.u32(1);
        w.u32(8);
        w.u16(3);
        w.u32(16);
        w.u32(1);
        w.u64(buf);
        w.u32(16);
        w.finish()
    };
    let mut dev = RngDevice::new();
    dev.restore(&dev_blob).unwrap();
    assert_eq!(dev.snapshot(), dev_blob);
    assert_eq!(dev.in_flight(), vec![IoRequest::Entropy { tag: 8, len: 16 }]);
    for cut in 0..dev_blob.len() {
        assert!(RngDevice::new().restore(&dev_blob[..cut]).is_err(), "cut {cut}");
    }
    let mut long = dev_blob.clone();
    long.push(0);
    assert!(RngDevice::new().restore(&long).is_err());
    assert!(RngDevice::new().restore(&crate::virtio::net::NetDevice::new([0; 6]).snapshot()).is_err());
    assert!(RngDevice::new().restore(&dblob).is_ok());
    let bad = |len: u32, tags: [u32; 2]| {
        let mut w = SnapWriter::new(b"VRNG", 1);
        w.u32(0);
        w.u32(2);
        for tag in tags {
            w.u32(tag);
            w.u16(0);
            w.u32(len);
            w.u32(0);
        }
        w.finish()
    };
    assert!(RngDevice::new().restore(&bad(16, [1, 2])).is_ok());
    assert!(RngDevice::new().restore(&bad(0, [1, 2])).is_err(), "zero-length request");
    assert!(RngDevice::new().restore(&bad(MAX_REQUEST + 1, [1, 2])).is_err(), "oversize request");
    assert!(RngDevice::new().restore(&bad(16, [2, 1])).is_err(), "tags out of order");
    assert!(RngDevice::new().restore(&bad(16, [2, 2])).is_err(), "duplicate tag");
    let mut v2 = dblob.clone();
    v2[4] = 2;
    assert!(RngDevice::new().restore(&v2).is_err(), "unknown version");
    // A failed restore leaves the device as it was.
    let mut dev = RngDevice::new();
    dev.restore(&dev_blob).unwrap();
    assert!(dev.restore(&dev_blob[..dev_blob.len() - 1]).is_err());
    assert_eq!(dev.snapshot(), dev_blob);
}

#[test]
fn reset_forgets_requests_in_flight() {
    let mut d = rig();
    let buf = d.alloc(16);
    d.post(&[(buf, 16, true)], false);
    d.kick(0);
    let (tag, _) = only_request(&mut d);
    d.w32(REG_STATUS, 0);
    assert!(d.dev.in_flight().is_empty());
    assert!(!d.inject(IoCompletion::Entropy { tag, data: vec![0; 16] }));
    assert_eq!(d.dev.device_as::<RngDevice>().map(|r| r.in_flight_count()), Some(0));
    // After a new init the device works again.
    d.init(TestDriver::all_features(), QSIZE);
    let h = d.post(&[(buf, 16, true)], false);
    d.kick(0);
    let (tag, _) = only_request(&mut d);
    assert!(d.inject(IoCompletion::Entropy { tag, data: vec![7; 16] }));
    assert_eq!(d.pop_used(), Some((h as u32, 16)));
}

/// Pseudo-random garbage rings and answers: nothing panics, every returned
/// head is valid, and every request asks for 1..=4096 bytes.
#[test]
fn fuzzed_rings_never_panic() {
    let mut seed = 0x5851_f42d_4c95_7f2du64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..200 {
        let mut d = rig();
        let buf = d.alloc(8192);
        let desc = d.desc;
        for i in 0..QSIZE {
            let r = rnd();
            let addr = match r % 4 {
                0 => buf + (r >> 8) % 8192,
                1 => desc + 16 * ((r >> 8) % 16),
                2 => rnd(),
                _ => buf,
            };
            let len = match (r >> 4) % 3 {
                0 => (rnd() % 9000) as u32,
                1 => 0,
                _ => rnd() as u32,
            };
            d.write_desc(desc, i, addr, len, (rnd() % 8) as u16, (rnd() % 20) as u16);
        }
        for _ in 0..rnd() % 20 {
            d.push_avail((rnd() % 18) as u16);
        }
        if round % 7 == 0 {
            d.set_avail_idx(rnd() as u16);
        }
        d.kick(0);
        for r in std::mem::take(&mut d.unserved) {
            let IoRequest::Entropy { tag, len } = r else { panic!("unexpected {r:?}") };
            assert!((1..=MAX_REQUEST).contains(&len));
            let n = (rnd() % 5000) as usize;
            // False when the ring broke after the request was taken.
            d.inject(IoCompletion::Entropy { tag, data: bytes(n, tag as u8) });
        }
        while let Some((id, len)) = d.pop_used() {
            assert!(id < QSIZE as u32);
            assert!(len <= MAX_REQUEST);
        }
        d.ack();
    }
}
