//! The numbers a setting may take (a pair's failure timeout, a VM's CPU
//! limit), checked in one place with one way of saying why one is
//! refused: for the command line, the control socket, the cluster's API
//! and the stream between the two sides of a pair alike.

/// A number a setting takes, and the values it may have: one place that
/// checks it and says why one is refused, for the command line, the
/// control socket and the stream alike.
pub struct Bounded<T: 'static> {
    /// The values allowed, both ends included.
    pub range: std::ops::RangeInclusive<T>,
    /// The unit it is written in after a number ("ms", "%").
    pub unit: &'static str,
}

impl<T: Copy + PartialOrd + std::fmt::Display + std::str::FromStr> Bounded<T> {
    /// Whether `value` is allowed.
    pub fn contains(&self, value: T) -> bool {
        self.range.contains(&value)
    }

    /// `value` if allowed, else why not in one line, naming it `what`
    /// ("a timeout", "--timeout").
    pub fn check(&self, what: &str, value: T) -> Result<T, String> {
        if self.contains(value) {
            return Ok(value);
        }
        let (lo, hi, unit) = (self.range.start(), self.range.end(), self.unit);
        Err(format!("{what} of {value} {unit} is out of range ({lo} to {hi} {unit})"))
    }

    /// `text` as an allowed value, else why not in one line.
    pub fn parse(&self, what: &str, text: &str) -> Result<T, String> {
        let value = text.trim().parse::<T>().map_err(|_| {
            let (lo, hi, unit) = (self.range.start(), self.range.end(), self.unit);
            format!("{what} needs a number from {lo} to {hi} {unit}, not '{text}'")
        })?;
        self.check(what, value)
    }
}

/// The timeouts a pair may be given, in milliseconds: under 20 ms a
/// host's scheduling alone would be taken for a failure; a minute is
/// longer than anyone waits for a failover.
pub const TIMEOUT_MS: Bounded<u64> = Bounded { range: 20..=60_000, unit: "ms" };

/// The CPU limits a VM may be given, in percent of one host core; 100
/// is none (its one VM thread cannot use more). Under 5 % each rest
/// would be over 20 times the run before it, tens of milliseconds in
/// which a primary logs nothing (the lag control's floor is 5 % too).
pub const CPU_LIMIT_PERCENT: Bounded<u8> = Bounded { range: 5..=100, unit: "%" };
