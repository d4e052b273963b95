//! Received frames a follower keeps for its guest: those its primary took
//! from its TAP and had not delivered where the follower's copy of the
//! VM stands (a replay's log holds them for an epoch's end, a checkpoint
//! backup's for a checkpoint not committed). Given to the guest if the
//! follower goes live; bounded, the oldest dropped first, since a frame
//! dropped here is one the network lost (TCP sends it again).

use std::collections::VecDeque;

/// Most frames kept.
pub const MAX_FRAMES: usize = 4096;
/// Most bytes of frames kept.
pub const MAX_BYTES: usize = 16 << 20;

/// The frames, in the order they came, each as (what the follower tells
/// them apart by, NIC slot, frame).
pub struct WaitingFrames<K> {
    frames: VecDeque<(K, usize, Vec<u8>)>,
    /// The bytes of the frames: kept, not summed, as a push must be cheap.
    bytes: usize,
}

impl<K> Default for WaitingFrames<K> {
    fn default() -> Self {
        WaitingFrames { frames: VecDeque::new(), bytes: 0 }
    }
}

impl<K> WaitingFrames<K> {
    /// Keeps a frame, dropping the oldest past either bound.
    pub fn push(&mut self, key: K, slot: usize, frame: Vec<u8>) {
        self.bytes += frame.len();
        self.frames.push_back((key, slot, frame));
        while self.frames.len() > MAX_FRAMES || self.bytes > MAX_BYTES {
            let (_, _, old) = self.frames.pop_front().expect("over a bound, so not empty");
            self.bytes -= old.len();
        }
    }

    /// Keeps only the frames whose key `keep` says so.
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.frames.retain(|(k, ..)| keep(k));
        self.bytes = self.frames.iter().map(|(_, _, f)| f.len()).sum();
    }

    /// Forgets them all.
    pub fn clear(&mut self) {
        self.frames.clear();
        self.bytes = 0;
    }

    /// Hands them all out, as (NIC slot, frame), in order.
    pub fn take(&mut self) -> Vec<(usize, Vec<u8>)> {
        self.bytes = 0;
        self.frames.drain(..).map(|(_, slot, frame)| (slot, frame)).collect()
    }
}
