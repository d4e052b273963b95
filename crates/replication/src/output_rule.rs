//! The Output Rule (VMware FT §2.2): an output leaves the host only once
//! the backup has acknowledged the log up to the entry that produced it.
//! Outputs are tagged with the log position (bytes of log written) they
//! need and released in the order they were produced; the VM keeps
//! running meanwhile.

use std::collections::VecDeque;

pub struct OutputGate<T> {
    held: VecDeque<(u64, T)>,
    /// Outputs held so far, for status.
    total_held: u64,
}

impl<T> Default for OutputGate<T> {
    fn default() -> Self {
        OutputGate { held: VecDeque::new(), total_held: 0 }
    }
}

impl<T> OutputGate<T> {
    /// Holds `output` until the log is acknowledged up to `needed` bytes.
    /// Tags never go down: outputs come in the order they were produced.
    pub fn hold(&mut self, needed: u64, output: T) {
        debug_assert!(self.held.back().is_none_or(|(n, _)| *n <= needed));
        self.held.push_back((needed, output));
        self.total_held += 1;
    }

    /// The outputs the acknowledgement of `acked` bytes lets go, in order.
    pub fn release(&mut self, acked: u64) -> Vec<T> {
        let n = self.held.iter().take_while(|(needed, _)| *needed <= acked).count();
        self.held.drain(..n).map(|(_, o)| o).collect()
    }

    /// Every held output, for a primary that goes on alone.
    pub fn release_all(&mut self) -> Vec<T> {
        self.held.drain(..).map(|(_, o)| o).collect()
    }

    /// Outputs waiting now.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Outputs that went through the gate since it was made.
    pub fn total_held(&self) -> u64 {
        self.total_held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_in_order_only_when_acknowledged() {
        let mut g = OutputGate::default();
        g.hold(100, "a");
        g.hold(100, "b");
        g.hold(250, "c");
        assert!(g.release(99).is_empty());
        assert_eq!(g.release(100), vec!["a", "b"]);
        assert!(g.release(249).is_empty());
        g.hold(300, "d");
        assert_eq!(g.release(1000), vec!["c", "d"]);
        assert!(g.is_empty());
        g.hold(2000, "e");
        assert_eq!(g.release_all(), vec!["e"]);
        assert_eq!(g.total_held(), 5);
    }
}
