//! Synchronous exceptions and interrupt causes, as the privileged spec
//! numbers them.

/// An exception raised by an instruction: `cause` as written to xcause,
/// `tval` as written to xtval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trap {
    pub cause: u64,
    pub tval: u64,
}

pub const INSN_MISALIGNED: u64 = 0;
pub const INSN_ACCESS_FAULT: u64 = 1;
pub const ILLEGAL_INSN: u64 = 2;
pub const BREAKPOINT: u64 = 3;
pub const LOAD_MISALIGNED: u64 = 4;
pub const LOAD_ACCESS_FAULT: u64 = 5;
pub const STORE_MISALIGNED: u64 = 6;
pub const STORE_ACCESS_FAULT: u64 = 7;
pub const ECALL_FROM_U: u64 = 8;
pub const ECALL_FROM_S: u64 = 9;
pub const ECALL_FROM_M: u64 = 11;
pub const INSN_PAGE_FAULT: u64 = 12;
pub const LOAD_PAGE_FAULT: u64 = 13;
pub const STORE_PAGE_FAULT: u64 = 15;

pub const INTERRUPT_BIT: u64 = 1 << 63;

// Interrupt numbers (bit positions in mip/mie).
pub const IRQ_S_SOFT: u64 = 1;
pub const IRQ_M_SOFT: u64 = 3;
pub const IRQ_S_TIMER: u64 = 5;
pub const IRQ_M_TIMER: u64 = 7;
pub const IRQ_S_EXT: u64 = 9;
pub const IRQ_M_EXT: u64 = 11;

impl Trap {
    #[inline]
    pub fn new(cause: u64, tval: u64) -> Trap {
        Trap { cause, tval }
    }

    #[inline]
    pub fn illegal(insn: u32) -> Trap {
        Trap { cause: ILLEGAL_INSN, tval: insn as u64 }
    }
}

/// Which kind of access a translation or physical access is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Fetch,
    Load,
    Store,
}

impl Access {
    pub fn page_fault(self, vaddr: u64) -> Trap {
        let cause = match self {
            Access::Fetch => INSN_PAGE_FAULT,
            Access::Load => LOAD_PAGE_FAULT,
            Access::Store => STORE_PAGE_FAULT,
        };
        Trap::new(cause, vaddr)
    }

    pub fn access_fault(self, addr: u64) -> Trap {
        let cause = match self {
            Access::Fetch => INSN_ACCESS_FAULT,
            Access::Load => LOAD_ACCESS_FAULT,
            Access::Store => STORE_ACCESS_FAULT,
        };
        Trap::new(cause, addr)
    }

    pub fn misaligned(self, addr: u64) -> Trap {
        let cause = match self {
            Access::Fetch => INSN_MISALIGNED,
            Access::Load => LOAD_MISALIGNED,
            Access::Store => STORE_MISALIGNED,
        };
        Trap::new(cause, addr)
    }
}
