//! The optional extensions a hart implements beyond RV64IMAFDC with
//! Zicsr, Zifencei and Zicntr: a set fixed when the machine is built.
//! The set is part of the machine a log or snapshot describes, because
//! the device tree tells the guest what it may use and because an
//! instruction of a missing extension traps: a machine restored or
//! replayed from an older build gets the set that build had (none).

/// The cache block of Zicbom and Zicboz, in bytes: what `cbo.zero`
/// zeroes (the naturally aligned block holding its address) and what the
/// device tree reports as `riscv,cbom-block-size` and
/// `riscv,cboz-block-size`.
///
/// 64, as on QEMU and the hardware shipping these extensions, although a
/// larger block would be cheaper for us: Linux's `clear_page` issues
/// `PAGE_SIZE / block` of them (64 `cbo.zero` per page at 64 bytes, one at
/// 4096, the largest it accepts), so a page-sized block would cut the
/// guest instructions clearing a page from about 170 to 8. But the
/// RVA22/RVA23 profiles' Zic64b fixes the block at 64 bytes, so software
/// built for them may zero with `cbo.zero` without asking the size, and
/// a larger block would zero memory next to what it meant; and a guest
/// should see the block it saw on the machines it was tested on. At 64
/// bytes `clear_page` already runs about a third of the instructions of
/// the `memset` it replaces, each `cbo.zero` a TLB hit and 64 bytes
/// zeroed on the fast paths. The size is part of the machine (the device
/// tree tells it to the guest), so changing it needs a new extension bit
/// or a field in logs and snapshots.
pub const CBO_BLOCK_BYTES: u64 = 64;

/// A set of optional extensions, by the names the ISA string uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Extensions(u32);

/// Every optional extension, in the ISA string's canonical order (Z
/// extensions by their category letter, then S extensions), with its bit.
const NAMES: [(&str, u32); 7] = [
    ("zicbom", 1 << 5),
    ("zicboz", 1 << 6),
    ("zicond", 1 << 3),
    ("zba", 1 << 0),
    ("zbb", 1 << 1),
    ("zbs", 1 << 2),
    ("sstc", 1 << 4),
];

impl Extensions {
    pub const ZBA: Extensions = Extensions(1 << 0);
    pub const ZBB: Extensions = Extensions(1 << 1);
    pub const ZBS: Extensions = Extensions(1 << 2);
    pub const ZICOND: Extensions = Extensions(1 << 3);
    /// The supervisor timer compare register, `stimecmp`.
    pub const SSTC: Extensions = Extensions(1 << 4);
    /// Cache-block management: `cbo.clean`, `cbo.flush`, `cbo.inval`.
    pub const ZICBOM: Extensions = Extensions(1 << 5);
    /// Cache-block zero: `cbo.zero`.
    pub const ZICBOZ: Extensions = Extensions(1 << 6);
    /// What builds before the first optional extension implemented.
    pub const NONE: Extensions = Extensions(0);
    /// Everything this build implements.
    pub const ALL: Extensions = Extensions(0x7f);

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
        assert_eq!(Extensions::ALL.text(), "zicbom_zicboz_zicond_zba_zbb_zbs_sstc");
        // What the build before the cache-block operations wrote still
        // reads as that set.
        assert_eq!(Extensions::parse("zicond_zba_zbb_zbs_sstc").map(|e| e.has(Extensions::ZICBOZ)), Ok(false));
        assert_eq!(Extensions::parse("zba_zkx"), Err("zkx".into()));
        assert_eq!(Extensions::from_bits(1 << 31), None);
    }
}
