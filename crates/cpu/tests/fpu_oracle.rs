//! Differential test of `ftvm_cpu::fpu` against Berkeley SoftFloat 3e (through
//! the `softfloat-wrapper` crate built with its RISC-V specialization:
//! canonical NaNs, RISC-V saturation values, tininess after rounding).
//!
//! Every public function is compared, results and exception flags, in all
//! five rounding modes, on pseudo-random operands biased toward the cases
//! that break soft-float code: signed zeros, infinities, quiet and signaling
//! NaNs, subnormals, the edges of the normal range, exponents close together
//! (cancellation), products and quotients near overflow and underflow,
//! rounding ties, fma with catastrophic cancellation, and integers and
//! floats near 2^31, 2^32, 2^63 and 2^64.
//!
//! SoftFloat has no fmin/fmax or fclass; those are checked against small
//! reference models written here from SoftFloat's own predicates.
//!
//! The default case count keeps `cargo test --release` quick. Set
//! `FPU_ORACLE_SCALE=<n>` to run n times as many cases.

use ftvm_cpu::fpu::{self, Rm};
use softfloat_wrapper::{ExceptionFlags, Float, RoundingMode, F32, F64};
use std::fmt::Write as _;

const RMS: [Rm; 5] = [Rm::Rne, Rm::Rtz, Rm::Rdn, Rm::Rup, Rm::Rmm];

fn sf_rm(rm: Rm) -> RoundingMode {
    match rm {
        Rm::Rne => RoundingMode::TiesToEven,
        Rm::Rtz => RoundingMode::TowardZero,
        Rm::Rdn => RoundingMode::TowardNegative,
        Rm::Rup => RoundingMode::TowardPositive,
        Rm::Rmm => RoundingMode::TiesToAway,
    }
}

/// Runs a SoftFloat computation with cleared flags; returns result and flags.
fn sf<T>(f: impl FnOnce() -> T) -> (T, u8) {
    ExceptionFlags::default().set();
    let r = f();
    let mut fl = ExceptionFlags::default();
    fl.get();
    (r, fl.to_bits())
}

fn scale() -> u64 {
    std::env::var("FPU_ORACLE_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1)
}

// ---------------------------------------------------------------------------
// Random operands
// ---------------------------------------------------------------------------

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (multiply-high, no division).
    fn below(&mut self, n: u64) -> u64 {
        ((self.next() as u128 * n as u128) >> 64) as u64
    }
    fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + self.below((hi - lo + 1) as u64) as i64
    }
    fn bool(&mut self) -> bool {
        self.next() & 1 != 0
    }
}

#[derive(Clone, Copy)]
struct Fmt {
    m: u32,
    emax: i64,
    bias: i64,
    bits: u32,
}

const S: Fmt = Fmt { m: 23, emax: 255, bias: 127, bits: 32 };
const D: Fmt = Fmt { m: 52, emax: 2047, bias: 1023, bits: 64 };

impl Fmt {
    fn frac_mask(self) -> u64 {
        (1u64 << self.m) - 1
    }
    fn pack(self, neg: bool, e: i64, frac: u64) -> u64 {
        ((neg as u64) << (self.bits - 1)) | ((e.clamp(0, self.emax) as u64) << self.m) | (frac & self.frac_mask())
    }
    fn exp(self, x: u64) -> i64 {
        ((x >> self.m) & self.emax as u64) as i64
    }

    /// A fraction field with structure: short significands (exact products,
    /// ties), runs of ones (carries), single bits, or plain random.
    fn frac(self, r: &mut Rng) -> u64 {
        let m = self.m;
        let x = match r.below(10) {
            0..=2 => r.next(),
            3 => {
                // keep only the top k bits
                let k = r.below(m as u64 + 1) as u32;
                r.next() & !((1u64 << (m - k)) - 1)
            }
            4 => {
                let k = r.below(m as u64 + 1) as u32;
                (1u64 << k) - 1 // low ones
            }
            5 => {
                let k = r.below(m as u64 + 1) as u32;
                !((1u64 << k) - 1) // high ones
            }
            6 => 1u64 << r.below(m as u64),
            7 => 0,
            8 => r.next() | 1,
            _ => {
                // a few random bits set
                let mut v = 0;
                for _ in 0..r.below(4) + 1 {
                    v |= 1u64 << r.below(m as u64);
                }
                v
            }
        };
        x & self.frac_mask()
    }

    fn nan(self, r: &mut Rng, signaling: bool) -> u64 {
        let quiet = 1u64 << (self.m - 1);
        let mut f = self.frac(r) & (quiet - 1);
        if signaling {
            if f == 0 {
                f = 1 + r.below(quiet - 1);
            }
        } else {
            f |= quiet;
        }
        self.pack(r.bool(), self.emax, f)
    }

    fn special(self, r: &mut Rng) -> u64 {
        let neg = r.bool();
        match r.below(6) {
            0 | 1 => self.pack(neg, 0, 0),
            2 => self.pack(neg, self.emax, 0),
            3 => self.nan(r, false),
            4 => self.nan(r, true),
            _ => self.pack(neg, self.emax - 1, self.frac_mask()),
        }
    }

    /// A general operand, biased toward edge cases.
    fn any(self, r: &mut Rng) -> u64 {
        let neg = r.bool();
        match r.below(16) {
            0..=2 => r.next() & (u64::MAX >> (64 - self.bits)),
            3 => self.special(r),
            4 | 5 => self.pack(neg, 0, self.frac(r)), // subnormal (or zero)
            6 => self.pack(neg, r.range(1, 3), self.frac(r)), // near min normal
            7 => self.pack(neg, self.emax - 1 - r.range(0, 2), self.frac(r)), // near max
            8..=10 => self.pack(neg, self.bias + r.range(-8, 8), self.frac(r)),
            _ => self.pack(neg, r.range(1, self.emax - 1), self.frac(r)),
        }
    }

    /// An operand with (biased) exponent `e`, falling back to subnormals and
    /// specials at the edges.
    fn with_exp(self, e: i64, r: &mut Rng) -> u64 {
        let neg = r.bool();
        if e <= 0 {
            // Below the normal range: a subnormal with roughly that magnitude.
            let sh = (1 - e).min(self.m as i64 + 1) as u32;
            let f = (self.frac(r) | (1u64 << self.m)) >> sh;
            self.pack(neg, 0, f)
        } else if e >= self.emax {
            self.pack(neg, self.emax - 1, self.frac(r))
        } else {
            self.pack(neg, e, self.frac(r))
        }
    }

    fn norm_exp(self, x: u64) -> i64 {
        let e = self.exp(x);
        if e == 0 {
            let f = x & self.frac_mask();
            if f == 0 {
                return -(self.m as i64);
            }
            1 - (f.leading_zeros() as i64 - (63 - self.m as i64))
        } else {
            e
        }
    }

    /// A pair for add/sub: exponents near each other most of the time.
    fn add_pair(self, r: &mut Rng) -> (u64, u64) {
        let a = self.any(r);
        let b = match r.below(4) {
            0 => self.any(r),
            1 => self.with_exp(self.exp(a) + r.range(-3, 3), r),
            2 => {
                let m = self.m as i64 + 3;
                self.with_exp(self.exp(a) + r.range(-m, m), r)
            }
            _ => {
                // Same exponent, nearly equal significands: cancellation.
                let delta = r.range(-4, 4) as u64;
                let b = a.wrapping_add(delta) & (u64::MAX >> (64 - self.bits));
                b ^ ((r.bool() as u64) << (self.bits - 1))
            }
        };
        if r.bool() {
            (a, b)
        } else {
            (b, a)
        }
    }

    /// A pair whose product (or quotient when `div`) lands near overflow,
    /// underflow, or anywhere.
    fn mul_pair(self, r: &mut Rng, div: bool) -> (u64, u64) {
        let a = self.any(r);
        let ea = self.norm_exp(a);
        // target biased exponent of the result
        let target = match r.below(5) {
            0 => return (a, self.any(r)),
            1 => self.emax - 1 + r.range(-2, 2),
            2 => r.range(-(self.m as i64) - 3, 3),
            3 => r.range(-2 * self.m as i64, 2),
            _ => r.range(1, self.emax - 1),
        };
        if r.below(3) == 0 {
            // Aim straight at a boundary: b = boundary / a (mul) or
            // b = a / boundary (div), computed by SoftFloat in a random
            // mode and nudged by a few ulps, so the exact result straddles
            // the boundary by a fraction of an ulp.
            // Pick a's exponent so that b stays a normal number.
            let m = self.m as i64;
            let (boundary, x) = match r.below(4) {
                // smallest normal, largest subnormal
                0 => (self.pack(false, 1, 0), r.range(-m - 8, -1)),
                1 => (self.pack(false, 0, self.frac_mask()), r.range(-m - 8, -1)),
                // largest finite
                2 => (self.pack(false, self.emax - 1, self.frac_mask()), r.range(2, m + 8)),
                // tiny subnormals
                _ => (self.pack(false, 0, 1 + r.below(8)), r.range(-2 * m - 8, -m - 1)),
            };
            let a = self.with_exp(self.bias + x, r) & !(1u64 << (self.bits - 1));
            let rm = sf_rm(pick_rm(r));
            let q = if div { sf_div(self, a, boundary, rm) } else { sf_div(self, boundary, a, rm) };
            let b = q.wrapping_add(r.range(-2, 2) as u64) ^ ((r.bool() as u64) << (self.bits - 1));
            return (a, b & (u64::MAX >> (64 - self.bits)));
        }
        // mul: ea + eb - bias = target; div: ea - eb + bias = target
        let eb = if div { ea + self.bias - target } else { target - ea + self.bias };
        let b = self.with_exp(eb, r);
        if !div && r.bool() {
            (b, a)
        } else {
            (a, b)
        }
    }
}

fn sf_div(fmt: Fmt, a: u64, b: u64, rm: RoundingMode) -> u64 {
    if fmt.bits == 32 {
        F32::from_bits(a as u32).div(F32::from_bits(b as u32), rm).to_bits() as u64
    } else {
        F64::from_bits(a).div(F64::from_bits(b), rm).to_bits()
    }
}

fn pick_rm(r: &mut Rng) -> Rm {
    RMS[r.below(5) as usize]
}

// ---------------------------------------------------------------------------
// Mismatch bookkeeping
// ---------------------------------------------------------------------------

struct Check {
    name: &'static str,
    cases: u64,
    mismatches: u64,
    report: String,
}

impl Check {
    fn new(name: &'static str) -> Self {
        Check { name, cases: 0, mismatches: 0, report: String::new() }
    }
    fn cmp(&mut self, what: impl FnOnce() -> String, ours: (u64, u8), theirs: (u64, u8)) {
        self.cases += 1;
        if ours != theirs {
            self.mismatches += 1;
            if self.mismatches <= 20 {
                let _ = writeln!(
                    self.report,
                    "{} {}: ours {:#x} fl {:#04x}, softfloat {:#x} fl {:#04x}",
                    self.name,
                    what(),
                    ours.0,
                    ours.1,
                    theirs.0,
                    theirs.1
                );
            }
        }
    }
    /// Prints the tally (and the first mismatches); returns the mismatch count.
    fn finish(self) -> u64 {
        eprintln!("{}: {} cases, {} mismatches", self.name, self.cases, self.mismatches);
        eprint!("{}", self.report);
        self.mismatches
    }
}

fn finish_all(checks: impl IntoIterator<Item = Check>) {
    let bad: u64 = checks.into_iter().map(Check::finish).sum();
    assert_eq!(bad, 0, "mismatches against SoftFloat (see stderr)");
}

fn ours<T>(f: impl FnOnce(&mut u8) -> T) -> (T, u8) {
    let mut fl = 0;
    let r = f(&mut fl);
    (r, fl)
}

fn pair<T: Into<u64>>(x: (T, u8)) -> (u64, u8) {
    (x.0.into(), x.1)
}

// ---------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------

const N_ARITH: u64 = 4_000_000;
const N_CHEAP: u64 = 2_000_000;

macro_rules! arith_test {
    ($name:ident, $fmt:expr, $t:ty, $SF:ident, $add:path, $sub:path, $mul:path, $div:path, $seed:expr) => {
        #[test]
        fn $name() {
            let n = N_ARITH * scale();
            let fmt = $fmt;
            let mut r = Rng($seed);
            let mut c_add = Check::new(stringify!($add));
            let mut c_sub = Check::new(stringify!($sub));
            let mut c_mul = Check::new(stringify!($mul));
            let mut c_div = Check::new(stringify!($div));
            for _ in 0..n {
                let rm = pick_rm(&mut r);
                let srm = sf_rm(rm);
                let (a, b) = fmt.add_pair(&mut r);
                let (a, b) = (a as $t, b as $t);
                let what = || format!("({a:#x}, {b:#x}) {rm:?}");
                c_add.cmp(
                    what,
                    pair(ours(|fl| $add(a, b, rm, fl))),
                    pair(sf(|| $SF::from_bits(a).add($SF::from_bits(b), srm).to_bits())),
                );
                c_sub.cmp(
                    what,
                    pair(ours(|fl| $sub(a, b, rm, fl))),
                    pair(sf(|| $SF::from_bits(a).sub($SF::from_bits(b), srm).to_bits())),
                );
                let (a, b) = fmt.mul_pair(&mut r, false);
                let (a, b) = (a as $t, b as $t);
                let what = || format!("({a:#x}, {b:#x}) {rm:?}");
                c_mul.cmp(
                    what,
                    pair(ours(|fl| $mul(a, b, rm, fl))),
                    pair(sf(|| $SF::from_bits(a).mul($SF::from_bits(b), srm).to_bits())),
                );
                let (a, b) = fmt.mul_pair(&mut r, true);
                let (a, b) = (a as $t, b as $t);
                let what = || format!("({a:#x}, {b:#x}) {rm:?}");
                c_div.cmp(
                    what,
                    pair(ours(|fl| $div(a, b, rm, fl))),
                    pair(sf(|| $SF::from_bits(a).div($SF::from_bits(b), srm).to_bits())),
                );
            }
            finish_all([c_add, c_sub, c_mul, c_div]);
        }
    };
}

arith_test!(f32_add_sub_mul_div, S, u32, F32, fpu::f32_add, fpu::f32_sub, fpu::f32_mul, fpu::f32_div, 1);
arith_test!(f64_add_sub_mul_div, D, u64, F64, fpu::f64_add, fpu::f64_sub, fpu::f64_mul, fpu::f64_div, 2);

macro_rules! sqrt_test {
    ($name:ident, $fmt:expr, $t:ty, $SF:ident, $sqrt:path, $seed:expr) => {
        #[test]
        fn $name() {
            let n = N_ARITH * scale();
            let fmt = $fmt;
            let mut r = Rng($seed);
            let mut c = Check::new(stringify!($sqrt));
            for _ in 0..n {
                let rm = pick_rm(&mut r);
                let a = match r.below(4) {
                    0 => {
                        // A square of a short significand, maybe nudged by an ulp:
                        // exact results and results next to ties.
                        let k = r.below(fmt.m as u64 / 2 + 2) as u32;
                        let s = (r.next() >> (64 - k.max(1))) | 1;
                        let sq = (s as u128 * s as u128) as u64;
                        let lz = sq.leading_zeros() as i64;
                        let top = 63 - lz; // position of leading one
                        let e = fmt.bias + r.range(-60, 60) * 2 + (r.below(2) as i64);
                        let frac =
                            if top >= fmt.m as i64 { sq >> (top - fmt.m as i64) } else { sq << (fmt.m as i64 - top) };
                        let x = fmt.pack(false, e, frac);
                        x.wrapping_add(r.range(-1, 1) as u64)
                    }
                    _ => {
                        let x = fmt.any(&mut r);
                        // Mostly positive.
                        if r.below(8) != 0 {
                            x & !(1u64 << (fmt.bits - 1))
                        } else {
                            x
                        }
                    }
                } as $t;
                c.cmp(
                    || format!("({a:#x}) {rm:?}"),
                    pair(ours(|fl| $sqrt(a, rm, fl))),
                    pair(sf(|| $SF::from_bits(a).sqrt(sf_rm(rm)).to_bits())),
                );
            }
            finish_all([c]);
        }
    };
}

sqrt_test!(f32_sqrt, S, u32, F32, fpu::f32_sqrt, 3);
sqrt_test!(f64_sqrt, D, u64, F64, fpu::f64_sqrt, 4);

macro_rules! fma_test {
    ($name:ident, $fmt:expr, $t:ty, $SF:ident, $fma:path, $seed:expr) => {
        #[test]
        fn $name() {
            let n = N_ARITH * scale();
            let fmt = $fmt;
            let mut r = Rng($seed);
            let mut c = Check::new(stringify!($fma));
            let mask = u64::MAX >> (64 - fmt.bits);
            for _ in 0..n {
                let rm = pick_rm(&mut r);
                let srm = sf_rm(rm);
                let (a, b) = fmt.mul_pair(&mut r, false);
                let ep = fmt.norm_exp(a) + fmt.norm_exp(b) - fmt.bias;
                let cc = match r.below(6) {
                    0 => fmt.any(&mut r),
                    1 => fmt.with_exp(ep + r.range(-3, 3), &mut r),
                    2 => {
                        let m = 2 * fmt.m as i64 + 4;
                        fmt.with_exp(ep + r.range(-m, m), &mut r)
                    }
                    3 => fmt.special(&mut r),
                    _ => {
                        // -(a*b rounded), nudged by a few ulps: massive cancellation.
                        let p = $SF::from_bits(a as $t).mul($SF::from_bits(b as $t), srm).to_bits() as u64;
                        (p.wrapping_add(r.range(-3, 3) as u64) ^ (1u64 << (fmt.bits - 1))) & mask
                    }
                };
                let (a, b, cc) = (a as $t, b as $t, cc as $t);
                c.cmp(
                    || format!("({a:#x}, {b:#x}, {cc:#x}) {rm:?}"),
                    pair(ours(|fl| $fma(a, b, cc, rm, fl))),
                    pair(sf(|| $SF::from_bits(a).fused_mul_add($SF::from_bits(b), $SF::from_bits(cc), srm).to_bits())),
                );
            }
            finish_all([c]);
        }
    };
}

fma_test!(f32_fma, S, u32, F32, fpu::f32_fma, 5);
fma_test!(f64_fma, D, u64, F64, fpu::f64_fma, 6);

/// Reference fmin/fmax built from SoftFloat predicates.
fn ref_minmax<T: Float + Copy>(a: T, b: T, max: bool, canonical: T) -> (T, u8) {
    let fl = if a.is_signaling_nan() || b.is_signaling_nan() { fpu::NV } else { 0 };
    let r = if a.is_nan() && b.is_nan() {
        canonical
    } else if a.is_nan() {
        b
    } else if b.is_nan() {
        a
    } else {
        let (lt, _) = sf(|| a.lt_quiet(b));
        let (gt, _) = sf(|| b.lt_quiet(a));
        if lt {
            if max {
                b
            } else {
                a
            }
        } else if gt {
            if max {
                a
            } else {
                b
            }
        } else if a.is_zero() && b.is_zero() && a.is_negative() != b.is_negative() {
            // -0 < +0
            let a_is_smaller = a.is_negative();
            if a_is_smaller != max {
                a
            } else {
                b
            }
        } else {
            a
        }
    };
    (r, fl)
}

fn ref_class<T: Float>(a: T) -> u64 {
    let bit = if a.is_negative_infinity() {
        0
    } else if a.is_negative_normal() {
        1
    } else if a.is_negative_subnormal() {
        2
    } else if a.is_negative_zero() {
        3
    } else if a.is_positive_zero() {
        4
    } else if a.is_positive_subnormal() {
        5
    } else if a.is_positive_normal() {
        6
    } else if a.is_positive_infinity() {
        7
    } else if a.is_signaling_nan() {
        8
    } else {
        assert!(a.is_nan());
        9
    };
    1 << bit
}

macro_rules! compare_test {
    ($name:ident, $fmt:expr, $t:ty, $SF:ident, $pre:ident, $nan:expr, $seed:expr) => {
        #[test]
        fn $name() {
            use fpu::*;
            let n = N_CHEAP * scale();
            let fmt = $fmt;
            let mut r = Rng($seed);
            let mut c_min = Check::new(concat!(stringify!($pre), "_min"));
            let mut c_max = Check::new(concat!(stringify!($pre), "_max"));
            let mut c_eq = Check::new(concat!(stringify!($pre), "_eq"));
            let mut c_lt = Check::new(concat!(stringify!($pre), "_lt"));
            let mut c_le = Check::new(concat!(stringify!($pre), "_le"));
            let mut c_cl = Check::new(concat!(stringify!($pre), "_classify"));
            let sign = 1u64 << (fmt.bits - 1);
            for _ in 0..n {
                let a = fmt.any(&mut r);
                let b = match r.below(5) {
                    0 => a,
                    1 => a ^ sign,
                    2 => fmt.add_pair(&mut r).0,
                    _ => fmt.any(&mut r),
                };
                let (a, b) = (a as $t, b as $t);
                let (fa, fb) = ($SF::from_bits(a), $SF::from_bits(b));
                let what = || format!("({a:#x}, {b:#x})");
                let canon = $SF::from_bits($nan);
                paste_ops!($pre, a, b, fa, fb, what, canon, c_min, c_max, c_eq, c_lt, c_le, c_cl);
            }
            finish_all([c_min, c_max, c_eq, c_lt, c_le, c_cl]);
        }
    };
}

macro_rules! paste_ops {
    (f32, $a:ident, $b:ident, $fa:ident, $fb:ident, $what:ident, $canon:ident, $cmin:ident, $cmax:ident, $ceq:ident, $clt:ident, $cle:ident, $ccl:ident) => {
        paste_ops!(@ f32_min, f32_max, f32_eq, f32_lt, f32_le, f32_classify, $a, $b, $fa, $fb, $what, $canon, $cmin, $cmax, $ceq, $clt, $cle, $ccl)
    };
    (f64, $a:ident, $b:ident, $fa:ident, $fb:ident, $what:ident, $canon:ident, $cmin:ident, $cmax:ident, $ceq:ident, $clt:ident, $cle:ident, $ccl:ident) => {
        paste_ops!(@ f64_min, f64_max, f64_eq, f64_lt, f64_le, f64_classify, $a, $b, $fa, $fb, $what, $canon, $cmin, $cmax, $ceq, $clt, $cle, $ccl)
    };
    (@ $min:ident, $max:ident, $eq:ident, $lt:ident, $le:ident, $cl:ident, $a:ident, $b:ident, $fa:ident, $fb:ident, $what:ident, $canon:ident, $cmin:ident, $cmax:ident, $ceq:ident, $clt:ident, $cle:ident, $ccl:ident) => {{
        let (rm_, fl_) = ref_minmax($fa, $fb, false, $canon);
        $cmin.cmp($what, pair(ours(|fl| $min($a, $b, fl))), (rm_.to_bits() as u64, fl_));
        let (rm_, fl_) = ref_minmax($fa, $fb, true, $canon);
        $cmax.cmp($what, pair(ours(|fl| $max($a, $b, fl))), (rm_.to_bits() as u64, fl_));
        $ceq.cmp($what, pair(ours(|fl| $eq($a, $b, fl))), pair(sf(|| $fa.eq($fb))));
        $clt.cmp($what, pair(ours(|fl| $lt($a, $b, fl))), pair(sf(|| $fa.lt($fb))));
        $cle.cmp($what, pair(ours(|fl| $le($a, $b, fl))), pair(sf(|| $fa.le($fb))));
        $ccl.cmp($what, ($cl($a), 0), (ref_class($fa), 0));
    }};
}

compare_test!(f32_compare_minmax_class, S, u32, F32, f32, fpu::F32_CANONICAL_NAN, 7);
compare_test!(f64_compare_minmax_class, D, u64, F64, f64, fpu::F64_CANONICAL_NAN, 8);

/// A float near an integer-range boundary, near small integers and halves,
/// or anything.
fn conv_operand(fmt: Fmt, r: &mut Rng) -> u64 {
    match r.below(6) {
        0 => fmt.any(r),
        1 => {
            let k = [31i64, 32, 63, 64][r.below(4) as usize];
            let a = fmt.with_exp(fmt.bias + k + r.range(-2, 1), r);
            // nudge toward the exact boundary
            if r.bool() {
                fmt.pack(a >> (fmt.bits - 1) != 0, fmt.exp(a), 0).wrapping_add(r.range(-3, 3) as u64)
            } else {
                a
            }
        }
        2 => fmt.with_exp(fmt.bias + r.range(-3, 3), r),
        3 => fmt.with_exp(fmt.bias + r.range(0, fmt.m as i64 + 2), r),
        4 => fmt.special(r),
        _ => fmt.with_exp(fmt.bias + r.range(-80, 70), r),
    }
}

/// An integer near a power of two (including the f32/f64 precision edges),
/// with structured low bits, or anything.
fn int_operand(r: &mut Rng) -> u64 {
    match r.below(5) {
        0 => r.next(),
        1 => {
            let k = r.below(64);
            (1u64 << k).wrapping_add(r.range(-4, 4) as u64)
        }
        2 => {
            // short significand at a random position: exact or tie cases
            let k = r.below(64) as u32;
            let s = r.next() >> r.below(64);
            s << (k.min(s.leading_zeros()))
        }
        3 => r.next() >> r.below(64),
        _ => (r.below(64) as i64 - 32) as u64,
    }
}

macro_rules! conv_test {
    ($name:ident, $fmt:expr, $t:ty, $SF:ident,
     $to_i32:path, $to_u32:path, $to_i64:path, $to_u64:path,
     $from_i32:path, $from_u32:path, $from_i64:path, $from_u64:path, $seed:expr) => {
        #[test]
        fn $name() {
            let n = N_CHEAP * scale();
            let fmt = $fmt;
            let mut r = Rng($seed);
            let mut c = [
                Check::new(stringify!($to_i32)),
                Check::new(stringify!($to_u32)),
                Check::new(stringify!($to_i64)),
                Check::new(stringify!($to_u64)),
                Check::new(stringify!($from_i32)),
                Check::new(stringify!($from_u32)),
                Check::new(stringify!($from_i64)),
                Check::new(stringify!($from_u64)),
            ];
            for _ in 0..n {
                let rm = pick_rm(&mut r);
                let srm = sf_rm(rm);
                let a = conv_operand(fmt, &mut r) as $t;
                let fa = $SF::from_bits(a);
                let what = || format!("({a:#x}) {rm:?}");
                c[0].cmp(what, pair(ours(|fl| $to_i32(a, rm, fl) as u32)), pair(sf(|| fa.to_i32(srm, true) as u32)));
                c[1].cmp(what, pair(ours(|fl| $to_u32(a, rm, fl))), pair(sf(|| fa.to_u32(srm, true))));
                c[2].cmp(what, pair(ours(|fl| $to_i64(a, rm, fl) as u64)), pair(sf(|| fa.to_i64(srm, true) as u64)));
                c[3].cmp(what, pair(ours(|fl| $to_u64(a, rm, fl))), pair(sf(|| fa.to_u64(srm, true))));
                let v = int_operand(&mut r);
                let what = || format!("({v:#x}) {rm:?}");
                let (i32v, u32v, i64v) = (v as i32, v as u32, v as i64);
                let i32v = if r.bool() { i32v } else { (v >> 32) as i32 };
                let u32v = if r.bool() { u32v } else { (v >> 32) as u32 };
                c[4].cmp(
                    what,
                    pair(ours(|fl| $from_i32(i32v, rm, fl))),
                    pair(sf(|| $SF::from_i32(i32v, srm).to_bits())),
                );
                c[5].cmp(
                    what,
                    pair(ours(|fl| $from_u32(u32v, rm, fl))),
                    pair(sf(|| $SF::from_u32(u32v, srm).to_bits())),
                );
                c[6].cmp(
                    what,
                    pair(ours(|fl| $from_i64(i64v, rm, fl))),
                    pair(sf(|| $SF::from_i64(i64v, srm).to_bits())),
                );
                c[7].cmp(what, pair(ours(|fl| $from_u64(v, rm, fl))), pair(sf(|| $SF::from_u64(v, srm).to_bits())));
            }
            finish_all(c);
        }
    };
}

conv_test!(
    f32_int_conversions,
    S,
    u32,
    F32,
    fpu::f32_to_i32,
    fpu::f32_to_u32,
    fpu::f32_to_i64,
    fpu::f32_to_u64,
    fpu::i32_to_f32,
    fpu::u32_to_f32,
    fpu::i64_to_f32,
    fpu::u64_to_f32,
    9
);
conv_test!(
    f64_int_conversions,
    D,
    u64,
    F64,
    fpu::f64_to_i32,
    fpu::f64_to_u32,
    fpu::f64_to_i64,
    fpu::f64_to_u64,
    fpu::i32_to_f64,
    fpu::u32_to_f64,
    fpu::i64_to_f64,
    fpu::u64_to_f64,
    10
);

#[test]
fn f32_f64_conversions() {
    let n = N_CHEAP * scale();
    let mut r = Rng(11);
    let mut c_wide = Check::new("f32_to_f64");
    let mut c_narrow = Check::new("f64_to_f32");
    for _ in 0..n {
        let rm = pick_rm(&mut r);
        let a = S.any(&mut r) as u32;
        c_wide.cmp(
            || format!("({a:#x})"),
            pair(ours(|fl| fpu::f32_to_f64(a, fl))),
            pair(sf(|| F32::from_bits(a).to_f64(RoundingMode::TiesToEven).to_bits())),
        );
        // Doubles around the binary32 range: overflow, the subnormal range,
        // below it, and ties at the 29 dropped fraction bits.
        let b = match r.below(5) {
            0 => D.any(&mut r),
            1 => D.with_exp(D.bias - S.bias + 255 + r.range(-3, 1), &mut r),
            2 => D.with_exp(D.bias - S.bias + r.range(-(S.m as i64) - 3, 2), &mut r),
            3 => D.with_exp(r.range(1, 2046), &mut r),
            _ => {
                let x = D.with_exp(D.bias + r.range(-160, 140), &mut r);
                let low = match r.below(3) {
                    0 => 1u64 << 28,
                    1 => (1u64 << 28).wrapping_add(r.range(-2, 2) as u64),
                    _ => 0,
                };
                (x & !((1u64 << 29) - 1)) | low
            }
        };
        c_narrow.cmp(
            || format!("({b:#x}) {rm:?}"),
            pair(ours(|fl| fpu::f64_to_f32(b, rm, fl))),
            pair(sf(|| F64::from_bits(b).to_f32(sf_rm(rm)).to_bits())),
        );
    }
    finish_all([c_wide, c_narrow]);
}

/// Every bit pattern (both signs) in windows around the edges, for the
/// unary f32 operations.
#[test]
fn f32_unary_edge_sweep() {
    let around = |x: u32, w: u32| (x - w, x + w);
    let windows: [(u32, u32); 10] = [
        (0x0000_0000, 0x0000_8000),  // zero and the smallest subnormals
        around(0x0080_0000, 0x8000), // subnormal/normal boundary
        around(0x3f80_0000, 0x8000), // 1.0
        around(0x3f00_0000, 0x2000), // 0.5
        around(0x4f00_0000, 0x2000), // 2^31
        around(0x4f80_0000, 0x2000), // 2^32
        around(0x5f00_0000, 0x2000), // 2^63
        around(0x5f80_0000, 0x2000), // 2^64
        around(0x7f80_0000, 0x2000), // max finite, infinity, first sNaNs
        around(0x7fc0_0000, 0x2000), // sNaN/qNaN boundary
    ];
    let mut c = Check::new("f32 unary sweep (sqrt, to_int, to_f64)");
    for (lo, hi) in windows {
        for x in lo..hi {
            for a in [x, x ^ 0x8000_0000] {
                for rm in RMS {
                    let srm = sf_rm(rm);
                    let fa = F32::from_bits(a);
                    let what = || format!("({a:#x}) {rm:?}");
                    c.cmp(what, pair(ours(|fl| fpu::f32_sqrt(a, rm, fl))), pair(sf(|| fa.sqrt(srm).to_bits())));
                    c.cmp(
                        what,
                        pair(ours(|fl| fpu::f32_to_i32(a, rm, fl) as u32)),
                        pair(sf(|| fa.to_i32(srm, true) as u32)),
                    );
                    c.cmp(what, pair(ours(|fl| fpu::f32_to_u32(a, rm, fl))), pair(sf(|| fa.to_u32(srm, true))));
                    c.cmp(
                        what,
                        pair(ours(|fl| fpu::f32_to_i64(a, rm, fl) as u64)),
                        pair(sf(|| fa.to_i64(srm, true) as u64)),
                    );
                    c.cmp(what, pair(ours(|fl| fpu::f32_to_u64(a, rm, fl))), pair(sf(|| fa.to_u64(srm, true))));
                }
                c.cmp(
                    || format!("({a:#x})"),
                    pair(ours(|fl| fpu::f32_to_f64(a, fl))),
                    pair(sf(|| F32::from_bits(a).to_f64(RoundingMode::TiesToEven).to_bits())),
                );
            }
        }
    }
    finish_all([c]);
}

/// With `FPU_ORACLE_EXHAUSTIVE=1`: f32 sqrt of every non-negative binary32
/// in all five rounding modes, and f32_to_f64 of every bit pattern, split
/// across the available cores. Several minutes; skipped by default.
#[test]
fn f32_exhaustive_sqrt_and_widen() {
    if std::env::var("FPU_ORACLE_EXHAUSTIVE").map_or(true, |v| v != "1") {
        return;
    }
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
    let chunk = (1u64 << 31).div_ceil(threads);
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            std::thread::spawn(move || {
                let mut c = Check::new("f32 exhaustive (sqrt, to_f64)");
                let lo = t * chunk;
                let hi = ((t + 1) * chunk).min(1 << 31);
                for x in lo..hi {
                    let a = x as u32;
                    for rm in RMS {
                        c.cmp(
                            || format!("sqrt({a:#x}) {rm:?}"),
                            pair(ours(|fl| fpu::f32_sqrt(a, rm, fl))),
                            pair(sf(|| F32::from_bits(a).sqrt(sf_rm(rm)).to_bits())),
                        );
                    }
                    for a in [a, a | 0x8000_0000] {
                        c.cmp(
                            || format!("to_f64({a:#x})"),
                            pair(ours(|fl| fpu::f32_to_f64(a, fl))),
                            pair(sf(|| F32::from_bits(a).to_f64(RoundingMode::TiesToEven).to_bits())),
                        );
                    }
                }
                c
            })
        })
        .collect();
    finish_all(handles.into_iter().map(|h| h.join().unwrap()));
}
