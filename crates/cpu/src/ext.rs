//! The optional extensions a hart implements beyond RV64IMAFDC with
//! Zicsr, Zifencei and Zicntr: a set fixed when the machine is built.
//! The set is part of the machine a log or snapshot describes, because
//! the device tree tells the guest what it may use and because an
//! instruction of a missing extension traps: a machine restored or
//! replayed from an older build gets the set that build had (none).

/// A set of optional extensions, by the names the ISA string uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Extensions(u32);

/// Every optional extension, in the ISA string's canonical order (Z
/// extensions by their category letter, then S extensions), with its bit.
const NAMES: [(&str, u32); 5] =
    [("zicond", 1 << 3), ("zba", 1 << 0), ("zbb", 1 << 1), ("zbs", 1 << 2), ("sstc", 1 << 4)];

impl Extensions {
    pub const ZBA: Extensions = Extensions(1 << 0);
    pub const ZBB: Extensions = Extensions(1 << 1);
    pub const ZBS: Extensions = Extensions(1 << 2);
    pub const ZICOND: Extensions = Extensions(1 << 3);
    /// The supervisor timer compare register, `stimecmp`.
    pub const SSTC: Extensions = Extensions(1 << 4);
    /// What builds before the first optional extension implemented.
    pub const NONE: Extensions = Extensions(0);
    /// Everything this build implements.
    pub const ALL: Extensions = Extensions(0x1f);

    #[inline(always)]
    pub const fn has(self, e: Extensions) -> bool {
        self.0 & e.0 == e.0
    }

    pub const fn union(self, e: Extensions) -> Extensions {
        Extensions(self.0 | e.0)
    }

    pub const fn bits(self) -> u32 {
        self.0
    }

    /// The set with these bits, if this build implements them all.
    pub fn from_bits(bits: u32) -> Option<Extensions> {
        (bits & !Extensions::ALL.0 == 0).then_some(Extensions(bits))
    }

    /// The names of the set's extensions, in canonical order.
    pub fn names(self) -> impl Iterator<Item = &'static str> {
        NAMES.into_iter().filter(move |&(_, b)| self.0 & b != 0).map(|(n, _)| n)
    }

    /// The set as `zba_zbb_...`, or `none` for the empty set: what
    /// [`Extensions::parse`] reads back.
    pub fn text(self) -> String {
        if self.0 == 0 {
            return "none".into();
        }
        self.names().collect::<Vec<_>>().join("_")
    }

    /// Reads [`Extensions::text`]; `Err` names an extension this build
    /// does not implement.
    pub fn parse(s: &str) -> Result<Extensions, String> {
        if s == "none" {
            return Ok(Extensions::NONE);
        }
        s.split('_').try_fold(Extensions::NONE, |set, name| match NAMES.iter().find(|(n, _)| *n == name) {
            Some(&(_, b)) => Ok(Extensions(set.0 | b)),
            None => Err(name.to_string()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_round_trips_and_unknown_names_are_refused() {
        for e in [Extensions::NONE, Extensions::ALL, Extensions::ZBB.union(Extensions::SSTC)] {
            assert_eq!(Extensions::parse(&e.text()), Ok(e));
        }
        assert_eq!(Extensions::ALL.text(), "zicond_zba_zbb_zbs_sstc");
        assert_eq!(Extensions::parse("zba_zkx"), Err("zkx".into()));
        assert_eq!(Extensions::from_bits(1 << 31), None);
    }
}
