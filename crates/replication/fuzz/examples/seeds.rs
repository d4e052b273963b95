//! Writes a few valid inputs for each target, made with the real
//! encoders, into `corpus/TARGET/` (where `cargo fuzz run TARGET` starts
//! from). Run from this directory: `cargo run --release --example seeds`.

use ftvm_replication::channel::secure::{answer, Initiator};
use ftvm_replication::channel::wire;
use ftvm_replication::checkpoint_stream::{encode, Record};
use ftvm_replication::disk_sync::{block_size, DigestList, MIN_BLOCK};
use ftvm_replication::heartbeat::Beats;
use ftvm_replication::page_delta::{PageEncoder, PAGE_SIZE};
use ftvm_replication::pair_key::PairKey;

fn put(target: &str, name: &str, bytes: &[u8]) {
    let dir = std::path::Path::new("corpus").join(target);
    std::fs::create_dir_all(&dir).expect("corpus directory");
    std::fs::write(dir.join(format!("seed-{name}")), bytes).expect("seed written");
}

fn main() {
    // The key the targets use.
    let key = PairKey::from_bytes([7; 32]);

    let mut acks = vec![5u8];
    acks.extend(wire::ack(4096, 1_000_000, 17));
    acks.extend(wire::request(b"digests".to_vec()));
    acks.extend(wire::refusal("its disk differs"));
    put("channel_acks", "messages", &acks);
    put("channel_acks", "cut-refusal", &wire::refusal("cut short")[..6]);

    // Programs: (op, length, bytes) after a piece size.
    put("channel_frames", "sealed", b"\x03\x00\x05hello\x00\x03ack\x02\x01");
    put("channel_frames", "garbage", b"\x00\x00\x02hi\x01\x04\x00\x20abc\x00\x02ok");

    let (initiator, first) = Initiator::start(&key);
    let (reply, answered) = answer(&key, &first).expect("our own handshake");
    let (_, confirm) = initiator.finish(&reply).expect("our own handshake");
    answered.confirm(&confirm).expect("our own handshake");
    put("channel_handshake", "first", &first);
    put("channel_handshake", "reply", &reply);

    let beats = Beats::new(&key, 5);
    put("heartbeat", "beat", &beats.make(1_700_000_000_000_000));
    put("heartbeat", "other-generation", &Beats::new(&key, 6).make(3));

    let mut stream = vec![3u8];
    for r in [
        Record::DiskSync { slot: 0, offset: 0, data: vec![0xcd; 64] },
        Record::DiskWrite { slot: 1, offset: 4096 * 7, data: vec![0xab; 32] },
        Record::Pages { number: 0, pages: vec![1, 2, 3] },
        Record::Checkpoint { number: 0, icount: 123_456_789, state: b"state".to_vec(), pages: vec![9; 20] },
        Record::KeepAlive,
        Record::End { status: Some(3) },
    ] {
        encode(&mut stream, &r);
    }
    put("checkpoint_stream", "records", &stream);

    // As the target's copy of the backup's RAM: page i filled with i, its
    // first bytes its number.
    let page = |i: u64| {
        let mut p = vec![i as u8; PAGE_SIZE];
        p[..8].copy_from_slice(&i.to_le_bytes());
        p
    };
    let mut enc = PageEncoder::new(64);
    let pfns = [0u64, 1, 2, 3];
    let first: Vec<u8> = pfns.iter().flat_map(|&i| page(i)).collect();
    put("page_delta", "section", &enc.encode(&pfns, &first));
    // The same pages changed a little (XOR deltas), one zeroed, one new.
    let mut next = first.clone();
    next[100] ^= 0x55;
    next[PAGE_SIZE + 4000..PAGE_SIZE + 4010].fill(0xee);
    next[2 * PAGE_SIZE..3 * PAGE_SIZE].fill(0);
    let mut pfns2 = pfns.to_vec();
    pfns2.push(9);
    next.extend((0..PAGE_SIZE).map(|i| (i * 7) as u8));
    put("page_delta", "deltas", &enc.encode(&pfns2, &next));

    let size = 3 * MIN_BLOCK + 512;
    let list = DigestList { slot: 1, size, block: block_size(size), digests: vec![[0x11; 32]; 4] };
    put("digest_list", "list", &list.encode());
    put("digest_list", "empty", &DigestList { slot: 0, size: 0, block: MIN_BLOCK, digests: vec![] }.encode());
}
