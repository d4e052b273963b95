//! The Output Rule (VMware FT §2.2): an output leaves the host only once
//! the backup has acknowledged the log up to the entry that produced it.
//! Outputs are tagged with the log position (bytes of log written) they
//! need and released in the order they were produced; the VM keeps
//! running meanwhile.
//!
//! An output may also wait for the backup's execution: with the backup
//! doing its own disk reads on a shared disk (§4.2), a write must not
//! reach the disk before the backup has read what an earlier read of the
//! guest saw there.

use std::collections::VecDeque;

/// When an output may go: log bytes acknowledged, and instructions the
/// backup has executed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Needs {
    acked: u64,
    executed: u64,
}

pub struct OutputGate<T> {
    held: VecDeque<(Needs, T)>,
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
        self.hold_until(needed, 0, output);
    }

    /// Holds `output` until the log is acknowledged up to `needed` bytes
    /// and the backup has executed `executed` instructions. Outputs still
    /// leave in order: those behind it wait too.
    pub fn hold_until(&mut self, needed: u64, executed: u64, output: T) {
        debug_assert!(self.held.back().is_none_or(|(n, _)| n.acked <= needed));
        self.held.push_back((Needs { acked: needed, executed }, output));
        self.total_held += 1;
    }

    /// The outputs the acknowledgement of `acked` bytes, and the backup's
    /// execution to `executed`, let go, in order.
    pub fn release(&mut self, acked: u64, executed: u64) -> Vec<T> {
        let n = self.held.iter().take_while(|(n, _)| n.acked <= acked && n.executed <= executed).count();
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
        assert!(g.release(99, 0).is_empty());
        assert_eq!(g.release(100, 0), vec!["a", "b"]);
        assert!(g.release(249, 0).is_empty());
        g.hold(300, "d");
        assert_eq!(g.release(1000, 0), vec!["c", "d"]);
        assert!(g.is_empty());
        g.hold(2000, "e");
        assert_eq!(g.release_all(), vec!["e"]);
        assert_eq!(g.total_held(), 5);
    }

    #[test]
    fn an_output_waiting_for_the_backups_execution_holds_those_behind_it() {
        let mut g = OutputGate::default();
        g.hold(10, "packet");
        g.hold_until(20, 5000, "write");
        g.hold(30, "flush");
        assert_eq!(g.release(30, 4999), vec!["packet"]);
        assert!(g.release(30, 4999).is_empty());
        assert_eq!(g.release(30, 5000), vec!["write", "flush"]);
    }
}
