//! Making the backup's copy of a disk identical to the primary's when
//! protection starts (Remus §2.5: each host keeps its own copy, and the
//! copies must start the same). The backup hashes its copy in blocks and
//! sends the digests ([`DigestList`]); the primary sends back only the
//! blocks whose digests differ from its own, so a copy that is already
//! close costs little and a missing one (an empty sparse file) costs only
//! the blocks the primary has data in.
//!
//! The digests are BLAKE3, so a block that hashes the same is taken to be
//! the same; the backup checks the whole disk's digest again once the
//! blocks are written.

use std::fs::File;
use std::os::unix::fs::FileExt;

/// Smallest block compared; larger disks get larger blocks so that the
/// list stays under [`MAX_BLOCKS`].
pub const MIN_BLOCK: u64 = 1 << 20;
pub const MAX_BLOCKS: u64 = 1 << 16;
const DIGEST: usize = 32;

/// The block size for a disk of `size` bytes.
pub fn block_size(size: u64) -> u64 {
    size.div_ceil(MAX_BLOCKS).next_power_of_two().max(MIN_BLOCK)
}

/// The digest of each `block`-sized block of the first `size` bytes of
/// `file` (the last block may be short; bytes past the file's end read as
/// zeros, so a short copy differs only in its missing blocks).
pub fn digests(file: &File, size: u64, block: u64) -> std::io::Result<Vec<[u8; DIGEST]>> {
    let mut buf = vec![0u8; block as usize];
    let mut out = Vec::with_capacity(size.div_ceil(block) as usize);
    let mut at = 0;
    while at < size {
        let len = block.min(size - at) as usize;
        read_zero_padded(file, &mut buf[..len], at)?;
        out.push(*blake3::hash(&buf[..len]).as_bytes());
        at += block;
    }
    Ok(out)
}

/// Reads `buf.len()` bytes at `offset`; what lies past the end of the
/// file reads as zeros.
pub fn read_zero_padded(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf[done..].fill(0);
    Ok(())
}

/// Why a list of disk digests was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DigestListError {
    /// Shorter than its fixed fields.
    #[error("a malformed list of disk digests")]
    Short { len: usize },
    /// The block size or the count of blocks is not what a disk of its
    /// size has.
    #[error("disk digests of {count} blocks of {block} bytes for a disk of {size} bytes")]
    NotThisDisk { count: u64, block: u64, size: u64 },
    /// The digests that follow the fixed fields are not `count` of them.
    #[error("a malformed list of disk digests")]
    DigestBytes { count: u64, len: usize },
}

/// What the backup sends for one disk: its slot, the size it expects,
/// the block size and its digests.
///
/// ```text
/// slot u32 | size u64 | block u64 | count u32 | count × 32-byte digest
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DigestList {
    pub slot: u32,
    pub size: u64,
    pub block: u64,
    pub digests: Vec<[u8; DIGEST]>,
}

impl DigestList {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(24 + self.digests.len() * DIGEST);
        out.extend(self.slot.to_le_bytes());
        out.extend(self.size.to_le_bytes());
        out.extend(self.block.to_le_bytes());
        out.extend((self.digests.len() as u32).to_le_bytes());
        for d in &self.digests {
            out.extend(d);
        }
        out
    }

    /// Reads a list the backup sent; a list that does not describe a
    /// disk of its size in blocks of its block size is refused.
    pub fn decode(bytes: &[u8]) -> Result<DigestList, DigestListError> {
        let head = bytes.get(..24).ok_or(DigestListError::Short { len: bytes.len() })?;
        let slot = u32::from_le_bytes(head[0..4].try_into().unwrap());
        let size = u64::from_le_bytes(head[4..12].try_into().unwrap());
        let block = u64::from_le_bytes(head[12..20].try_into().unwrap());
        let count = u32::from_le_bytes(head[20..24].try_into().unwrap()) as u64;
        if block != block_size(size) || count != size.div_ceil(block) {
            return Err(DigestListError::NotThisDisk { count, block, size });
        }
        let body = &bytes[24..];
        if body.len() as u64 != count * DIGEST as u64 {
            return Err(DigestListError::DigestBytes { count, len: body.len() });
        }
        let digests = body.chunks_exact(DIGEST).map(|c| c.try_into().unwrap()).collect();
        Ok(DigestList { slot, size, block, digests })
    }

    /// The blocks (their offsets and lengths) where `mine`, digests of the
    /// same disk in the same blocks, differ from this list.
    pub fn differing(&self, mine: &[[u8; DIGEST]]) -> Vec<(u64, usize)> {
        mine.iter()
            .zip(&self.digests)
            .enumerate()
            .filter(|(_, (a, b))| a != b)
            .map(|(i, _)| {
                let at = i as u64 * self.block;
                (at, self.block.min(self.size - at) as usize)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn temp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("ftvm-disk-sync-{}-{name}", std::process::id()))
    }

    #[test]
    fn block_sizes_keep_the_list_short() {
        assert_eq!(block_size(0), MIN_BLOCK);
        assert_eq!(block_size(1 << 30), MIN_BLOCK);
        assert_eq!(block_size(1 << 40), 1 << 24);
        assert!((1u64 << 40).div_ceil(block_size(1 << 40)) <= MAX_BLOCKS);
        assert!((3u64 << 40).div_ceil(block_size(3 << 40)) <= MAX_BLOCKS);
    }

    #[test]
    fn only_the_blocks_that_differ_are_named_and_a_short_copy_reads_as_zeros() {
        let size = 5 * MIN_BLOCK + 1000;
        let block = block_size(size);
        let (a, b) = (temp("a"), temp("b"));
        let mut fa = File::create(&a).unwrap();
        fa.set_len(size).unwrap();
        fa.write_all_at(b"primary data", 2 * MIN_BLOCK + 7).unwrap();
        fa.write_all_at(b"tail", size - 4).unwrap();
        fa.flush().unwrap();
        // The backup's copy is short (no last block at all) and has
        // something else in block 0.
        let fb = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&b).unwrap();
        fb.write_all_at(b"stale", 10).unwrap();
        let theirs = DigestList { slot: 1, size, block, digests: digests(&fb, size, block).unwrap() };
        let theirs = DigestList::decode(&theirs.encode()).unwrap();
        let mine = digests(&File::open(&a).unwrap(), size, block).unwrap();
        assert_eq!(mine.len(), 6);
        let differ = theirs.differing(&mine);
        assert_eq!(differ, vec![(0, MIN_BLOCK as usize), (2 * MIN_BLOCK, MIN_BLOCK as usize), (5 * MIN_BLOCK, 1000)]);
        // Writing those blocks makes the copies the same.
        let mut buf = vec![0u8; MIN_BLOCK as usize];
        for (at, len) in differ {
            read_zero_padded(&File::open(&a).unwrap(), &mut buf[..len], at).unwrap();
            fb.write_all_at(&buf[..len], at).unwrap();
        }
        assert_eq!(digests(&fb, size, block).unwrap(), mine);
        std::fs::remove_file(a).unwrap();
        std::fs::remove_file(b).unwrap();
    }

    #[test]
    fn lists_that_do_not_fit_their_disk_are_refused() {
        let list = DigestList { slot: 0, size: 3 * MIN_BLOCK, block: MIN_BLOCK, digests: vec![[1; 32]; 3] };
        let bytes = list.encode();
        assert_eq!(DigestList::decode(&bytes).unwrap(), list);
        assert_eq!(
            DigestList::decode(&bytes[..bytes.len() - 1]),
            Err(DigestListError::DigestBytes { count: 3, len: 3 * 32 - 1 })
        );
        assert_eq!(DigestList::decode(&bytes[..10]), Err(DigestListError::Short { len: 10 }));
        let wrong_count = DigestList { digests: vec![[1; 32]; 2], ..list.clone() }.encode();
        assert_eq!(
            DigestList::decode(&wrong_count),
            Err(DigestListError::NotThisDisk { count: 2, block: MIN_BLOCK, size: 3 * MIN_BLOCK })
        );
        let wrong_block = DigestList { block: 4096, ..list }.encode();
        let refused = DigestList::decode(&wrong_block).unwrap_err();
        assert!(matches!(refused, DigestListError::NotThisDisk { block: 4096, .. }), "{refused:?}");
        assert_eq!(
            refused.to_string(),
            format!("disk digests of 3 blocks of 4096 bytes for a disk of {} bytes", 3 * MIN_BLOCK)
        );
        assert_eq!(DigestListError::Short { len: 10 }.to_string(), "a malformed list of disk digests");
    }
}
