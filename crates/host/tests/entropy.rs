//! Entropy from the host.

use ftvm_host::entropy::fill;

#[test]
fn fills_differ_and_cover_the_whole_buffer() {
    let mut a = [0u8; 64];
    let mut b = [0u8; 64];
    fill(&mut a).unwrap();
    fill(&mut b).unwrap();
    assert_ne!(a, b, "two fills gave the same 64 bytes");
    assert_ne!(a, [0u8; 64]);

    let mut empty = [0u8; 0];
    fill(&mut empty).unwrap();

    // Larger than one getrandom(2) call may return; every 4 KiB stretch,
    // the last one included, must have been written (all zeroes has
    // probability 2^-32768 per stretch).
    let mut big = vec![0u8; 40 << 20];
    fill(&mut big).unwrap();
    assert_eq!(big.len(), 40 << 20);
    for (i, chunk) in big.chunks(4096).enumerate() {
        assert!(chunk.iter().any(|&x| x != 0), "chunk {i} was not filled");
    }
    // Roughly uniform: each bit set about half the time.
    let ones: u64 = big[..1 << 20].iter().map(|b| b.count_ones() as u64).sum();
    let bits = 8u64 << 20;
    assert!(ones.abs_diff(bits / 2) < bits / 100, "{ones} ones in {bits} bits");
}
