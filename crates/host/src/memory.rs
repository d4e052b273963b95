//! How much memory this host can give a VM: its RAM and swap, from
//! `/proc/meminfo`. A guest asked for with more is refused up front with a
//! message that says so, rather than left to the allocator (which refuses
//! it as an error, see `GuestRam::new`, or, with overcommit, gives it
//! until the kernel's OOM killer takes the VM later).

/// RAM plus swap, in bytes; None if `/proc/meminfo` cannot be read.
pub fn capacity() -> Option<u64> {
    parse(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

fn parse(meminfo: &str) -> Option<u64> {
    let kib = |key: &str| -> Option<u64> {
        let line = meminfo.lines().find(|l| l.starts_with(key))?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    Some((kib("MemTotal:")? + kib("SwapTotal:").unwrap_or(0)) << 10)
}

#[cfg(test)]
mod tests {
    #[test]
    fn ram_and_swap_are_added() {
        let text = "MemTotal:       24000000 kB\nMemFree:  1 kB\nSwapTotal:       1000000 kB\n";
        assert_eq!(super::parse(text), Some(25_000_000 << 10));
        assert_eq!(super::parse("nothing"), None);
        assert!(super::capacity().unwrap() > 16 << 20);
    }
}
