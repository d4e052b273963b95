//! IEEE-754 binary32/binary64 arithmetic for the RISC-V F and D extensions.
//!
//! This module owns every floating-point computation the hart performs:
//! add/sub/mul/div/sqrt, fused multiply-add, fmin/fmax, comparisons, fclass,
//! and all conversions between floats and integers. Values travel as raw bit
//! patterns (`u32` for binary32, `u64` for binary64) and every operation ORs
//! its accrued exception flags (RISC-V `fflags` bit layout) into `fl`.
//!
//! It is implemented in software with integer arithmetic rather than with
//! host floating-point instructions, for two reasons:
//!
//! * Determinism: the result must be a pure function of the inputs on every
//!   host, independent of the host FPU's rounding-mode register, flush-to-zero
//!   or denormals-are-zero settings, NaN propagation rules, and x87-style
//!   double rounding.
//! * Exact RISC-V semantics: all five rounding modes, `fflags` exactly as the
//!   spec requires (tininess detected *after* rounding, UF only when tiny and
//!   inexact), canonical NaNs with no payload propagation, minimumNumber /
//!   maximumNumber fmin/fmax, and the RISC-V saturation table for
//!   float-to-integer conversions. Host FPUs do not expose these uniformly.
//!
//! The one place a host float instruction appears is as a hint: square root
//! asks the host for an estimate of an integer square root, then checks and
//! corrects it with exact integer arithmetic (falling back to a pure integer
//! square root if the estimate is more than a few units off). The result is
//! therefore the exact integer square root whatever the host returns; only
//! the speed depends on it.
//!
//! Internally both formats share one generic implementation. Finite operands
//! are unpacked to an integer significand and a biased exponent; results are
//! produced as a significand `sig: u64` together with an exponent `e` such
//! that the value is `sig * 2^(e - BIAS - 62)` (bit 62 of `sig` has weight
//! `2^(e - BIAS)`), with any discarded low-order bits ORed ("jammed") into
//! bit 0. `round_pack` then rounds once and encodes, which is the only place
//! rounding, overflow and underflow are decided.

/// Inexact.
pub const NX: u8 = 1;
/// Underflow.
pub const UF: u8 = 2;
/// Overflow.
pub const OF: u8 = 4;
/// Divide by zero.
pub const DZ: u8 = 8;
/// Invalid operation.
pub const NV: u8 = 16;

/// A RISC-V static rounding mode (the `frm` / instruction `rm` encodings 0..=4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rm {
    /// Round to nearest, ties to even.
    Rne,
    /// Round towards zero.
    Rtz,
    /// Round down (towards negative infinity).
    Rdn,
    /// Round up (towards positive infinity).
    Rup,
    /// Round to nearest, ties to max magnitude.
    Rmm,
}

impl Rm {
    /// Decodes a rounding-mode field. 0..=4 are valid; 5 and 6 are reserved
    /// and 7 (dynamic) must be resolved by the caller, so all give `None`.
    #[inline]
    pub fn from_bits(b: u32) -> Option<Rm> {
        match b {
            0 => Some(Rm::Rne),
            1 => Some(Rm::Rtz),
            2 => Some(Rm::Rdn),
            3 => Some(Rm::Rup),
            4 => Some(Rm::Rmm),
            _ => None,
        }
    }
}

/// The RISC-V canonical binary32 NaN.
pub const F32_CANONICAL_NAN: u32 = 0x7fc0_0000;
/// The RISC-V canonical binary64 NaN.
pub const F64_CANONICAL_NAN: u64 = 0x7ff8_0000_0000_0000;

// ---------------------------------------------------------------------------
// Format description
// ---------------------------------------------------------------------------

trait Format {
    /// Total width in bits.
    const BITS: u32;
    /// Fraction (trailing significand) width in bits.
    const M: u32;
    /// The all-ones biased exponent (infinities and NaNs).
    const EMAX: i32;
    const BIAS: i32;
    const NAN: u64;

    const SIGN: u64 = 1u64 << (Self::BITS - 1);
    const ABS: u64 = Self::SIGN - 1;
    const HIDDEN: u64 = 1u64 << Self::M;
    const FRAC: u64 = Self::HIDDEN - 1;
    const INF: u64 = (Self::EMAX as u64) << Self::M;
    const QUIET: u64 = 1u64 << (Self::M - 1);
}

struct S;
struct D;

impl Format for S {
    const BITS: u32 = 32;
    const M: u32 = 23;
    const EMAX: i32 = 0xff;
    const BIAS: i32 = 127;
    const NAN: u64 = F32_CANONICAL_NAN as u64;
}

impl Format for D {
    const BITS: u32 = 64;
    const M: u32 = 52;
    const EMAX: i32 = 0x7ff;
    const BIAS: i32 = 1023;
    const NAN: u64 = F64_CANONICAL_NAN;
}

#[inline(always)]
fn is_nan<F: Format>(x: u64) -> bool {
    (x & F::ABS) > F::INF
}

#[inline(always)]
fn is_snan<F: Format>(x: u64) -> bool {
    is_nan::<F>(x) && x & F::QUIET == 0
}

#[inline(always)]
fn is_inf<F: Format>(x: u64) -> bool {
    x & F::ABS == F::INF
}

#[inline(always)]
fn is_zero<F: Format>(x: u64) -> bool {
    x & F::ABS == 0
}

#[inline(always)]
fn sign_of<F: Format>(x: u64) -> bool {
    x & F::SIGN != 0
}

#[inline(always)]
fn exp_field<F: Format>(x: u64) -> i32 {
    ((x & F::ABS) >> F::M) as i32
}

#[inline(always)]
fn signed_zero<F: Format>(neg: bool) -> u64 {
    if neg {
        F::SIGN
    } else {
        0
    }
}

/// Unpacks a finite nonzero value into `(e, m)` with `m` having bit `M` set
/// and value `m * 2^(e - BIAS - M)`; subnormals get `e < 1`.
#[inline(always)]
fn normalize<F: Format>(x: u64) -> (i32, u64) {
    let e = exp_field::<F>(x);
    let f = x & F::FRAC;
    if e == 0 {
        let sh = f.leading_zeros() - (63 - F::M);
        (1 - sh as i32, f << sh)
    } else {
        (e, f | F::HIDDEN)
    }
}

/// Unpacks a finite nonzero value without normalizing subnormals:
/// value `m * 2^(e - BIAS - M)` with `e >= 1`.
#[inline(always)]
fn unpack_raw<F: Format>(x: u64) -> (i32, u64) {
    let e = exp_field::<F>(x);
    let f = x & F::FRAC;
    if e == 0 {
        (1, f)
    } else {
        (e, f | F::HIDDEN)
    }
}

/// Shift right, ORing every bit shifted out into bit 0.
#[inline(always)]
fn shr_jam64(x: u64, s: u32) -> u64 {
    if s == 0 {
        x
    } else if s < 64 {
        (x >> s) | ((x << (64 - s)) != 0) as u64
    } else {
        (x != 0) as u64
    }
}

#[inline(always)]
fn shr_jam128(x: u128, s: u32) -> u128 {
    if s == 0 {
        x
    } else if s < 128 {
        (x >> s) | ((x << (128 - s)) != 0) as u128
    } else {
        (x != 0) as u128
    }
}

// ---------------------------------------------------------------------------
// Rounding and packing
// ---------------------------------------------------------------------------

/// Rounds `sig` to an integer after discarding its low `r` bits (`r >= 1`).
/// Returns the rounded quotient and whether any discarded bit was set.
#[inline(always)]
fn round_bits(sig: u64, r: u32, neg: bool, rm: Rm) -> (u64, bool) {
    let rem = sig & ((1u64 << r) - 1);
    let half = 1u64 << (r - 1);
    let q = sig >> r;
    let inc = match rm {
        Rm::Rne => rem > half || (rem == half && q & 1 != 0),
        Rm::Rmm => rem >= half,
        Rm::Rtz => false,
        Rm::Rdn => neg && rem != 0,
        Rm::Rup => !neg && rem != 0,
    };
    (q + inc as u64, rem != 0)
}

#[inline(always)]
fn overflow<F: Format>(neg: bool, rm: Rm, fl: &mut u8) -> u64 {
    *fl |= OF | NX;
    let to_inf = match rm {
        Rm::Rne | Rm::Rmm => true,
        Rm::Rtz => false,
        Rm::Rdn => neg,
        Rm::Rup => !neg,
    };
    let mag = if to_inf { F::INF } else { F::INF - 1 };
    signed_zero::<F>(neg) | mag
}

/// Rounds and encodes the nonzero value `sig * 2^(e - BIAS - 62)`.
///
/// `sig` may have its leading one anywhere; bits below the true precision
/// must already be jammed into bit 0, and after normalization the jam bit
/// must lie strictly below the guard bit (the first bit below the kept
/// significand, also for the subnormal case), so that guard and sticky are
/// both exact.
#[inline(always)]
fn round_pack<F: Format>(neg: bool, mut e: i32, mut sig: u64, rm: Rm, fl: &mut u8) -> u64 {
    debug_assert!(sig != 0);
    let lz = sig.leading_zeros();
    if lz == 0 {
        sig = (sig >> 1) | (sig & 1);
        e += 1;
    } else {
        sig <<= lz - 1;
        e -= (lz - 1) as i32;
    }
    // Leading one is now at bit 62; the kept significand is bits 62..=r.
    let r = 62 - F::M;
    let sbit = signed_zero::<F>(neg);
    if e >= 1 {
        if e >= F::EMAX {
            return overflow::<F>(neg, rm, fl);
        }
        let (q, inexact) = round_bits(sig, r, neg, rm);
        // q is in [2^M, 2^(M+1)]; a carry out of the significand bumps the
        // exponent field by itself.
        let bits = (((e - 1) as u64) << F::M) + q;
        if bits >= F::INF {
            return overflow::<F>(neg, rm, fl);
        }
        if inexact {
            *fl |= NX;
        }
        sbit | bits
    } else {
        // Below the normal range. RISC-V detects tininess after rounding:
        // the result is tiny if rounding to full precision with an unbounded
        // exponent would still give a magnitude below 2^EMIN.
        let tiny = e < 0 || round_bits(sig, r, neg, rm).0 < (2u64 << F::M);
        let sig = shr_jam64(sig, (1 - e) as u32);
        let (q, inexact) = round_bits(sig, r, neg, rm);
        if inexact {
            *fl |= if tiny { NX | UF } else { NX };
        }
        // q <= 2^M; q == 2^M encodes the smallest normal number.
        sbit | q
    }
}

// ---------------------------------------------------------------------------
// Arithmetic
// ---------------------------------------------------------------------------

#[inline(always)]
fn nan_result<F: Format>(a: u64, b: u64, fl: &mut u8) -> u64 {
    if is_snan::<F>(a) || is_snan::<F>(b) {
        *fl |= NV;
    }
    F::NAN
}

#[inline(always)]
fn add<F: Format>(a: u64, b: u64, rm: Rm, fl: &mut u8) -> u64 {
    let ea = exp_field::<F>(a);
    let eb = exp_field::<F>(b);
    if ea == F::EMAX || eb == F::EMAX {
        if is_nan::<F>(a) || is_nan::<F>(b) {
            return nan_result::<F>(a, b, fl);
        }
        if ea == F::EMAX && eb == F::EMAX && (a ^ b) & F::SIGN != 0 {
            *fl |= NV;
            return F::NAN;
        }
        return if ea == F::EMAX { a } else { b };
    }
    let (aa, ab) = (a & F::ABS, b & F::ABS);
    if aa == 0 || ab == 0 {
        if ab != 0 {
            return b;
        }
        if aa != 0 {
            return a;
        }
        // Both zero.
        return if a == b { a } else { signed_zero::<F>(rm == Rm::Rdn) };
    }
    // Order by magnitude: x is the larger.
    let (x, y) = if aa >= ab { (a, b) } else { (b, a) };
    let (ex, mx) = unpack_raw::<F>(x);
    let (ey, my) = unpack_raw::<F>(y);
    let neg = sign_of::<F>(x);
    let sx = mx << (62 - F::M);
    let sy = shr_jam64(my << (62 - F::M), (ex - ey) as u32);
    if (x ^ y) & F::SIGN == 0 {
        round_pack::<F>(neg, ex, sx + sy, rm, fl)
    } else {
        let r = sx - sy;
        if r == 0 {
            return signed_zero::<F>(rm == Rm::Rdn);
        }
        round_pack::<F>(neg, ex, r, rm, fl)
    }
}

#[inline(always)]
fn mul<F: Format>(a: u64, b: u64, rm: Rm, fl: &mut u8) -> u64 {
    let neg = sign_of::<F>(a ^ b);
    if exp_field::<F>(a) == F::EMAX || exp_field::<F>(b) == F::EMAX {
        if is_nan::<F>(a) || is_nan::<F>(b) {
            return nan_result::<F>(a, b, fl);
        }
        if is_zero::<F>(a) || is_zero::<F>(b) {
            *fl |= NV;
            return F::NAN;
        }
        return signed_zero::<F>(neg) | F::INF;
    }
    if is_zero::<F>(a) || is_zero::<F>(b) {
        return signed_zero::<F>(neg);
    }
    let (ea, ma) = normalize::<F>(a);
    let (eb, mb) = normalize::<F>(b);
    // The product has its leading one at bit 2M or 2M+1; place bit 2M+1 at
    // bit 63 so that the leading one lands at bit 62 or 63.
    let sig = if 2 * F::M < 63 {
        (ma * mb) << (62 - 2 * F::M)
    } else {
        shr_jam128(ma as u128 * mb as u128, 2 * F::M - 62) as u64
    };
    round_pack::<F>(neg, ea + eb - F::BIAS, sig, rm, fl)
}

#[inline(always)]
fn div<F: Format>(a: u64, b: u64, rm: Rm, fl: &mut u8) -> u64 {
    let neg = sign_of::<F>(a ^ b);
    if is_nan::<F>(a) || is_nan::<F>(b) {
        return nan_result::<F>(a, b, fl);
    }
    if is_inf::<F>(a) {
        if is_inf::<F>(b) {
            *fl |= NV;
            return F::NAN;
        }
        return signed_zero::<F>(neg) | F::INF;
    }
    if is_inf::<F>(b) {
        return signed_zero::<F>(neg);
    }
    if is_zero::<F>(b) {
        if is_zero::<F>(a) {
            *fl |= NV;
            return F::NAN;
        }
        *fl |= DZ;
        return signed_zero::<F>(neg) | F::INF;
    }
    if is_zero::<F>(a) {
        return signed_zero::<F>(neg);
    }
    let (ea, ma) = normalize::<F>(a);
    let (eb, mb) = normalize::<F>(b);
    // ma/mb is in (1/2, 2). The quotient (ma << SH) / mb has at least
    // SH > M + 2 significant bits; the remainder goes into the jam bit.
    // Value = q * 2^(ea - eb - SH), so bit 62 has weight 2^(ea - eb + 62 - SH).
    if F::M < 32 {
        const SH: u32 = 39;
        let n = ma << SH;
        let q = n / mb;
        let r = n % mb;
        round_pack::<F>(neg, ea - eb + F::BIAS + 62 - SH as i32, q | (r != 0) as u64, rm, fl)
    } else {
        const SH: u32 = 62;
        let n = (ma as u128) << SH;
        let q = (n / mb as u128) as u64;
        let r = (n as u64).wrapping_sub(q.wrapping_mul(mb)); // exact: r < mb
        round_pack::<F>(neg, ea - eb + F::BIAS + 62 - SH as i32, q | (r != 0) as u64, rm, fl)
    }
}

#[inline(always)]
fn sqrt<F: Format>(a: u64, rm: Rm, fl: &mut u8) -> u64 {
    if is_nan::<F>(a) {
        return nan_result::<F>(a, a, fl);
    }
    if is_zero::<F>(a) {
        return a;
    }
    if sign_of::<F>(a) {
        *fl |= NV;
        return F::NAN;
    }
    if is_inf::<F>(a) {
        return a;
    }
    let (e, m) = normalize::<F>(a);
    // value = m * 2^(x - M). Scale m up by k (of the parity that makes the
    // exponent even) so that the integer square root of N = m << k has
    // M + 3 significant bits: the kept bits, a guard bit, and one more bit
    // that the remainder's sticky bit is ORed into.
    let x = e - F::BIAS;
    let base = 2 * (F::M as i32 + 3) - 1 - F::M as i32; // 28 (f32) / 57 (f64)
    let k = (base + ((x - F::M as i32 - base) & 1)) as u32;
    let n = (m as u128) << k; // leading one at bit 2M+2+{0,1}
    let root = isqrt_hinted(n, sqrt_hint(m, k));
    let sticky = (root as u128 * root as u128 != n) as u64;
    let h = (x - F::M as i32 - k as i32) / 2;
    // sqrt(value) = root * 2^h; bit 62 of root would weigh 2^(62 + h).
    round_pack::<F>(false, F::BIAS + 62 + h, root | sticky, rm, fl)
}

/// An estimate of `sqrt(m << k)` for `m < 2^53`, `k < 64`, from the host's
/// square root. Only a starting point: [`isqrt_hinted`] turns any estimate
/// into the exact integer square root with integer arithmetic, so results
/// never depend on the host's floating point (a bad estimate only costs time).
#[inline(always)]
fn sqrt_hint(m: u64, k: u32) -> u64 {
    let scaled = m as f64 * f64::from_bits(((1023 + k) as u64) << 52); // m * 2^k
    scaled.sqrt() as u64
}

/// `floor(sqrt(n))` for `n < 2^112`, starting from `hint`.
#[inline(always)]
fn isqrt_hinted(n: u128, hint: u64) -> u64 {
    let mut r = hint.min(1 << 56);
    for _ in 0..8 {
        let sq = r as u128 * r as u128;
        if sq > n {
            r -= 1; // sq > n >= 0 implies r >= 1
        } else if sq + 2 * (r as u128) < n {
            r += 1;
        } else {
            return r;
        }
    }
    n.isqrt() as u64
}

#[inline(always)]
fn fma<F: Format>(a: u64, b: u64, c: u64, rm: Rm, fl: &mut u8) -> u64 {
    let negp = sign_of::<F>(a ^ b);
    let negc = sign_of::<F>(c);
    let special = |x: u64| exp_field::<F>(x) == F::EMAX;
    if special(a) || special(b) || special(c) {
        if is_nan::<F>(a) || is_nan::<F>(b) || is_nan::<F>(c) {
            let inv = is_snan::<F>(a)
                || is_snan::<F>(b)
                || is_snan::<F>(c)
                || (is_inf::<F>(a) && is_zero::<F>(b))
                || (is_zero::<F>(a) && is_inf::<F>(b));
            if inv {
                *fl |= NV;
            }
            return F::NAN;
        }
        if is_inf::<F>(a) || is_inf::<F>(b) {
            if is_zero::<F>(a) || is_zero::<F>(b) || (is_inf::<F>(c) && negc != negp) {
                *fl |= NV;
                return F::NAN;
            }
            return signed_zero::<F>(negp) | F::INF;
        }
        return c; // c is infinite, the product finite
    }
    if is_zero::<F>(a) || is_zero::<F>(b) {
        if !is_zero::<F>(c) {
            return c;
        }
        return if negp == negc { c } else { signed_zero::<F>(rm == Rm::Rdn) };
    }
    if is_zero::<F>(c) {
        // The product is nonzero, so adding a zero of either sign changes nothing.
        return mul::<F>(a, b, rm, fl);
    }
    let (ea, ma) = normalize::<F>(a);
    let (eb, mb) = normalize::<F>(b);
    let (ec, mc) = normalize::<F>(c);
    if F::M < 32 {
        // binary32 fits in u64: both addends' leading ones at bit 62, so
        // value = W * 2^(E - BIAS - 62). The exact product has at most 48
        // bits, leaving >= 15 zero bits below it; c leaves 39. When the
        // smaller addend loses bits to the jam (d >= 16), at most one bit
        // cancels, so round_pack's renormalization stays exact enough.
        let p = ma * mb;
        let sh = p.leading_zeros() - 1;
        let wp = p << sh;
        let e_p = ea + eb - F::BIAS - 2 * F::M as i32 - sh as i32 + 62;
        let wc = mc << (62 - F::M);
        let (ex, wx, negx, ey, wy) =
            if e_p > ec || (e_p == ec && wp >= wc) { (e_p, wp, negp, ec, wc) } else { (ec, wc, negc, e_p, wp) };
        let wy = shr_jam64(wy, (ex - ey) as u32);
        let w = if negp == negc {
            wx + wy
        } else {
            let w = wx - wy;
            if w == 0 {
                return signed_zero::<F>(rm == Rm::Rdn);
            }
            w
        };
        return round_pack::<F>(negx, ex, w, rm, fl);
    }
    // Work in u128 with both addends' leading ones at bit 125, so that
    // value = W * 2^(E - BIAS - 125). The exact product has at most 2M+2
    // bits, leaving >= 19 zero bits below it; c leaves >= 72.
    let p = ma as u128 * mb as u128;
    let sh = p.leading_zeros() - 2;
    let wp = p << sh;
    let e_p = ea + eb - F::BIAS - 2 * F::M as i32 - sh as i32 + 125;
    let wc = (mc as u128) << (125 - F::M);
    let e_c = ec;
    let (ex, wx, negx, ey, wy) =
        if e_p > e_c || (e_p == e_c && wp >= wc) { (e_p, wp, negp, e_c, wc) } else { (e_c, wc, negc, e_p, wp) };
    let d = (ex - ey) as u32;
    let wy = shr_jam128(wy, d);
    let mut w = if negp == negc {
        wx + wy
    } else {
        let w = wx - wy;
        if w == 0 {
            return signed_zero::<F>(rm == Rm::Rdn);
        }
        w
    };
    let mut e = ex;
    // Massive cancellation is only possible when d <= 1, where the
    // subtraction was exact; renormalize so the leading one is at 125/126.
    let lz = w.leading_zeros();
    if lz > 2 {
        w <<= lz - 2;
        e -= (lz - 2) as i32;
    }
    let sig = shr_jam128(w, 63) as u64;
    round_pack::<F>(negx, e, sig, rm, fl)
}

// ---------------------------------------------------------------------------
// Min/max, comparisons, classification
// ---------------------------------------------------------------------------

/// `a < b` for non-NaN values, with -0 < +0.
#[inline(always)]
fn total_lt<F: Format>(a: u64, b: u64) -> bool {
    let (na, nb) = (sign_of::<F>(a), sign_of::<F>(b));
    if na != nb {
        na
    } else if na {
        a > b
    } else {
        a < b
    }
}

#[inline(always)]
fn minmax<F: Format>(a: u64, b: u64, want_max: bool, fl: &mut u8) -> u64 {
    let (an, bn) = (is_nan::<F>(a), is_nan::<F>(b));
    if an || bn {
        if is_snan::<F>(a) || is_snan::<F>(b) {
            *fl |= NV;
        }
        return match (an, bn) {
            (true, true) => F::NAN,
            (true, false) => b,
            _ => a,
        };
    }
    if total_lt::<F>(a, b) != want_max {
        a
    } else {
        b
    }
}

#[inline(always)]
fn feq<F: Format>(a: u64, b: u64, fl: &mut u8) -> bool {
    if is_nan::<F>(a) || is_nan::<F>(b) {
        if is_snan::<F>(a) || is_snan::<F>(b) {
            *fl |= NV;
        }
        return false;
    }
    a == b || (a | b) & F::ABS == 0
}

#[inline(always)]
fn flt<F: Format>(a: u64, b: u64, fl: &mut u8) -> bool {
    if is_nan::<F>(a) || is_nan::<F>(b) {
        *fl |= NV;
        return false;
    }
    if (a | b) & F::ABS == 0 {
        return false;
    }
    total_lt::<F>(a, b)
}

#[inline(always)]
fn fle<F: Format>(a: u64, b: u64, fl: &mut u8) -> bool {
    if is_nan::<F>(a) || is_nan::<F>(b) {
        *fl |= NV;
        return false;
    }
    if (a | b) & F::ABS == 0 {
        return true;
    }
    a == b || total_lt::<F>(a, b)
}

#[inline(always)]
fn classify<F: Format>(a: u64) -> u64 {
    let neg = sign_of::<F>(a);
    let e = exp_field::<F>(a);
    let f = a & F::FRAC;
    let bit = if e == F::EMAX {
        if f == 0 {
            if neg {
                0
            } else {
                7
            }
        } else if f & F::QUIET == 0 {
            8
        } else {
            9
        }
    } else if e == 0 {
        match (f == 0, neg) {
            (true, true) => 3,
            (true, false) => 4,
            (false, true) => 2,
            (false, false) => 5,
        }
    } else if neg {
        1
    } else {
        6
    };
    1 << bit
}

// ---------------------------------------------------------------------------
// Conversions
// ---------------------------------------------------------------------------

/// Rounds a float to an integer magnitude: `None` for NaN, otherwise
/// `(negative, rounded magnitude, inexact)`. Magnitudes that cannot fit in
/// any 64-bit integer (including infinities) are reported as `u128::MAX`.
#[inline(always)]
fn round_to_int<F: Format>(a: u64, rm: Rm) -> Option<(bool, u128, bool)> {
    let neg = sign_of::<F>(a);
    if exp_field::<F>(a) == F::EMAX {
        if is_nan::<F>(a) {
            return None;
        }
        return Some((neg, u128::MAX, false));
    }
    if is_zero::<F>(a) {
        return Some((neg, 0, false));
    }
    let (e, m) = normalize::<F>(a);
    let x = e - F::BIAS; // value in [2^x, 2^(x+1))
    if x >= 64 {
        return Some((neg, u128::MAX, false));
    }
    // Fixed point with 64 fraction bits: m << (64 + x - M) < 2^128.
    let sh = 64 + x - F::M as i32;
    let fx = if sh >= 0 { (m as u128) << sh } else { shr_jam128(m as u128, (-sh) as u32) };
    let q = fx >> 64;
    let rem = fx as u64;
    let half = 1u64 << 63;
    let inc = match rm {
        Rm::Rne => rem > half || (rem == half && q & 1 != 0),
        Rm::Rmm => rem >= half,
        Rm::Rtz => false,
        Rm::Rdn => neg && rem != 0,
        Rm::Rup => !neg && rem != 0,
    };
    Some((neg, q + inc as u128, rem != 0))
}

/// Float to a signed integer of `bits` bits, returned sign-extended.
#[inline(always)]
fn to_signed<F: Format>(a: u64, bits: u32, rm: Rm, fl: &mut u8) -> i64 {
    let max = (1u128 << (bits - 1)) - 1;
    match round_to_int::<F>(a, rm) {
        None => {
            *fl |= NV;
            max as i64
        }
        Some((neg, mag, inexact)) => {
            let limit = if neg { max + 1 } else { max };
            if mag > limit {
                *fl |= NV;
                return if neg { -(max as i64) - 1 } else { max as i64 };
            }
            if inexact {
                *fl |= NX;
            }
            if neg {
                (mag as u64).wrapping_neg() as i64
            } else {
                mag as i64
            }
        }
    }
}

/// Float to an unsigned integer of `bits` bits.
#[inline(always)]
fn to_unsigned<F: Format>(a: u64, bits: u32, rm: Rm, fl: &mut u8) -> u64 {
    let max = (1u128 << bits) - 1;
    match round_to_int::<F>(a, rm) {
        None => {
            *fl |= NV;
            max as u64
        }
        Some((neg, mag, inexact)) => {
            if neg && mag != 0 {
                *fl |= NV;
                return 0;
            }
            if mag > max {
                *fl |= NV;
                return max as u64;
            }
            if inexact {
                *fl |= NX;
            }
            mag as u64
        }
    }
}

/// Integer magnitude (with sign) to float.
#[inline(always)]
fn from_int<F: Format>(neg: bool, mag: u64, rm: Rm, fl: &mut u8) -> u64 {
    if mag == 0 {
        return 0;
    }
    // value = mag = mag * 2^((BIAS + 62) - BIAS - 62)
    round_pack::<F>(neg, F::BIAS + 62, mag, rm, fl)
}

// ---------------------------------------------------------------------------
// Public API
// ---------------------------------------------------------------------------

macro_rules! float_ops {
    ($F:ty, $t:ty,
     $add:ident, $sub:ident, $mul:ident, $div:ident, $sqrt:ident, $fma:ident,
     $min:ident, $max:ident, $eq:ident, $lt:ident, $le:ident, $class:ident,
     $to_i32:ident, $to_u32:ident, $to_i64:ident, $to_u64:ident,
     $from_i32:ident, $from_u32:ident, $from_i64:ident, $from_u64:ident) => {
        /// Correctly rounded `a + b`.
        #[inline]
        pub fn $add(a: $t, b: $t, rm: Rm, fl: &mut u8) -> $t {
            add::<$F>(a as u64, b as u64, rm, fl) as $t
        }
        /// Correctly rounded `a - b`.
        #[inline]
        pub fn $sub(a: $t, b: $t, rm: Rm, fl: &mut u8) -> $t {
            add::<$F>(a as u64, (b as u64) ^ <$F as Format>::SIGN, rm, fl) as $t
        }
        /// Correctly rounded `a * b`.
        #[inline]
        pub fn $mul(a: $t, b: $t, rm: Rm, fl: &mut u8) -> $t {
            mul::<$F>(a as u64, b as u64, rm, fl) as $t
        }
        /// Correctly rounded `a / b`.
        #[inline]
        pub fn $div(a: $t, b: $t, rm: Rm, fl: &mut u8) -> $t {
            div::<$F>(a as u64, b as u64, rm, fl) as $t
        }
        /// Correctly rounded square root.
        #[inline]
        pub fn $sqrt(a: $t, rm: Rm, fl: &mut u8) -> $t {
            sqrt::<$F>(a as u64, rm, fl) as $t
        }
        /// `a * b + c` with a single rounding.
        #[inline]
        pub fn $fma(a: $t, b: $t, c: $t, rm: Rm, fl: &mut u8) -> $t {
            fma::<$F>(a as u64, b as u64, c as u64, rm, fl) as $t
        }
        /// RISC-V `fmin` (IEEE 754-2019 minimumNumber, -0 < +0).
        #[inline]
        pub fn $min(a: $t, b: $t, fl: &mut u8) -> $t {
            minmax::<$F>(a as u64, b as u64, false, fl) as $t
        }
        /// RISC-V `fmax` (IEEE 754-2019 maximumNumber, -0 < +0).
        #[inline]
        pub fn $max(a: $t, b: $t, fl: &mut u8) -> $t {
            minmax::<$F>(a as u64, b as u64, true, fl) as $t
        }
        /// Quiet equality (`feq`): NV only for signaling NaNs.
        #[inline]
        pub fn $eq(a: $t, b: $t, fl: &mut u8) -> bool {
            feq::<$F>(a as u64, b as u64, fl)
        }
        /// Signaling less-than (`flt`): NV for any NaN.
        #[inline]
        pub fn $lt(a: $t, b: $t, fl: &mut u8) -> bool {
            flt::<$F>(a as u64, b as u64, fl)
        }
        /// Signaling less-or-equal (`fle`): NV for any NaN.
        #[inline]
        pub fn $le(a: $t, b: $t, fl: &mut u8) -> bool {
            fle::<$F>(a as u64, b as u64, fl)
        }
        /// The 10-bit `fclass` mask.
        #[inline]
        pub fn $class(a: $t) -> u64 {
            classify::<$F>(a as u64)
        }
        /// `fcvt.w`: RISC-V saturating conversion to i32.
        #[inline]
        pub fn $to_i32(a: $t, rm: Rm, fl: &mut u8) -> i32 {
            to_signed::<$F>(a as u64, 32, rm, fl) as i32
        }
        /// `fcvt.wu`: RISC-V saturating conversion to u32.
        #[inline]
        pub fn $to_u32(a: $t, rm: Rm, fl: &mut u8) -> u32 {
            to_unsigned::<$F>(a as u64, 32, rm, fl) as u32
        }
        /// `fcvt.l`: RISC-V saturating conversion to i64.
        #[inline]
        pub fn $to_i64(a: $t, rm: Rm, fl: &mut u8) -> i64 {
            to_signed::<$F>(a as u64, 64, rm, fl)
        }
        /// `fcvt.lu`: RISC-V saturating conversion to u64.
        #[inline]
        pub fn $to_u64(a: $t, rm: Rm, fl: &mut u8) -> u64 {
            to_unsigned::<$F>(a as u64, 64, rm, fl)
        }
        /// Correctly rounded conversion from i32.
        #[inline]
        pub fn $from_i32(v: i32, rm: Rm, fl: &mut u8) -> $t {
            from_int::<$F>(v < 0, v.unsigned_abs() as u64, rm, fl) as $t
        }
        /// Correctly rounded conversion from u32.
        #[inline]
        pub fn $from_u32(v: u32, rm: Rm, fl: &mut u8) -> $t {
            from_int::<$F>(false, v as u64, rm, fl) as $t
        }
        /// Correctly rounded conversion from i64.
        #[inline]
        pub fn $from_i64(v: i64, rm: Rm, fl: &mut u8) -> $t {
            from_int::<$F>(v < 0, v.unsigned_abs(), rm, fl) as $t
        }
        /// Correctly rounded conversion from u64.
        #[inline]
        pub fn $from_u64(v: u64, rm: Rm, fl: &mut u8) -> $t {
            from_int::<$F>(false, v, rm, fl) as $t
        }
    };
}

float_ops!(
    S,
    u32,
    f32_add,
    f32_sub,
    f32_mul,
    f32_div,
    f32_sqrt,
    f32_fma,
    f32_min,
    f32_max,
    f32_eq,
    f32_lt,
    f32_le,
    f32_classify,
    f32_to_i32,
    f32_to_u32,
    f32_to_i64,
    f32_to_u64,
    i32_to_f32,
    u32_to_f32,
    i64_to_f32,
    u64_to_f32
);

float_ops!(
    D,
    u64,
    f64_add,
    f64_sub,
    f64_mul,
    f64_div,
    f64_sqrt,
    f64_fma,
    f64_min,
    f64_max,
    f64_eq,
    f64_lt,
    f64_le,
    f64_classify,
    f64_to_i32,
    f64_to_u32,
    f64_to_i64,
    f64_to_u64,
    i32_to_f64,
    u32_to_f64,
    i64_to_f64,
    u64_to_f64
);

/// `fcvt.d.s`: exact widening. NaNs become the canonical NaN (NV if signaling).
#[inline]
pub fn f32_to_f64(a: u32, fl: &mut u8) -> u64 {
    let a = a as u64;
    let neg = signed_zero::<D>(sign_of::<S>(a));
    if exp_field::<S>(a) == S::EMAX {
        if is_nan::<S>(a) {
            nan_result::<S>(a, a, fl);
            return F64_CANONICAL_NAN;
        }
        return neg | D::INF;
    }
    if is_zero::<S>(a) {
        return neg;
    }
    let (e, m) = normalize::<S>(a);
    let e64 = (e - S::BIAS + D::BIAS) as u64;
    neg | (e64 << D::M) | ((m << (D::M - S::M)) & D::FRAC)
}

/// `fcvt.s.d`: correctly rounded narrowing. NaNs become the canonical NaN.
#[inline]
pub fn f64_to_f32(a: u64, rm: Rm, fl: &mut u8) -> u32 {
    let neg = sign_of::<D>(a);
    if exp_field::<D>(a) == D::EMAX {
        if is_nan::<D>(a) {
            nan_result::<D>(a, a, fl);
            return F32_CANONICAL_NAN;
        }
        return (signed_zero::<S>(neg) | S::INF) as u32;
    }
    if is_zero::<D>(a) {
        return signed_zero::<S>(neg) as u32;
    }
    let (e, m) = normalize::<D>(a);
    // m leads at bit 52; shifted to bit 62, bit 62 weighs 2^(e - 1023).
    round_pack::<S>(neg, e - D::BIAS + S::BIAS, m << (62 - D::M), rm, fl) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    const RMS: [Rm; 5] = [Rm::Rne, Rm::Rtz, Rm::Rdn, Rm::Rup, Rm::Rmm];

    fn f(x: f32) -> u32 {
        x.to_bits()
    }
    fn d(x: f64) -> u64 {
        x.to_bits()
    }

    #[test]
    fn rm_from_bits() {
        assert_eq!(Rm::from_bits(0), Some(Rm::Rne));
        assert_eq!(Rm::from_bits(1), Some(Rm::Rtz));
        assert_eq!(Rm::from_bits(2), Some(Rm::Rdn));
        assert_eq!(Rm::from_bits(3), Some(Rm::Rup));
        assert_eq!(Rm::from_bits(4), Some(Rm::Rmm));
        for b in 5..=8 {
            assert_eq!(Rm::from_bits(b), None);
        }
    }

    #[test]
    fn simple_arith() {
        let mut fl = 0;
        assert_eq!(f64_add(d(1.0), d(2.0), Rm::Rne, &mut fl), d(3.0));
        assert_eq!(f64_sub(d(1.0), d(2.0), Rm::Rne, &mut fl), d(-1.0));
        assert_eq!(f64_mul(d(1.5), d(-2.0), Rm::Rne, &mut fl), d(-3.0));
        assert_eq!(f64_div(d(1.0), d(4.0), Rm::Rne, &mut fl), d(0.25));
        assert_eq!(f64_sqrt(d(2.25), Rm::Rne, &mut fl), d(1.5));
        assert_eq!(f64_fma(d(2.0), d(3.0), d(1.0), Rm::Rne, &mut fl), d(7.0));
        assert_eq!(f32_add(f(1.0), f(2.0), Rm::Rne, &mut fl), f(3.0));
        assert_eq!(f32_div(f(1.0), f(4.0), Rm::Rne, &mut fl), f(0.25));
        assert_eq!(f32_sqrt(f(2.25), Rm::Rne, &mut fl), f(1.5));
        assert_eq!(fl, 0);
        assert_eq!(f64_div(d(1.0), d(3.0), Rm::Rne, &mut fl), d(1.0 / 3.0));
        assert_eq!(fl, NX);
        fl = 0;
        assert_eq!(f32_div(f(1.0), f(3.0), Rm::Rtz, &mut fl), 0x3eaa_aaaa);
        assert_eq!(f32_div(f(1.0), f(3.0), Rm::Rup, &mut fl), 0x3eaa_aaab);
        assert_eq!(f32_div(f(-1.0), f(3.0), Rm::Rdn, &mut fl), 0xbeaa_aaab);
        assert_eq!(f32_div(f(-1.0), f(3.0), Rm::Rup, &mut fl), 0xbeaa_aaaa);
        assert_eq!(fl, NX);
    }

    #[test]
    fn signed_zeros() {
        for &rm in &RMS {
            let mut fl = 0;
            let z = if rm == Rm::Rdn { d(-0.0) } else { d(0.0) };
            assert_eq!(f64_add(d(0.0), d(-0.0), rm, &mut fl), z);
            assert_eq!(f64_add(d(-0.0), d(-0.0), rm, &mut fl), d(-0.0));
            assert_eq!(f64_add(d(0.0), d(0.0), rm, &mut fl), d(0.0));
            assert_eq!(f64_sub(d(1.5), d(1.5), rm, &mut fl), z);
            assert_eq!(f64_sub(d(-0.0), d(0.0), rm, &mut fl), d(-0.0));
            assert_eq!(f64_mul(d(-0.0), d(3.0), rm, &mut fl), d(-0.0));
            assert_eq!(f64_div(d(0.0), d(-3.0), rm, &mut fl), d(-0.0));
            assert_eq!(f64_sqrt(d(-0.0), rm, &mut fl), d(-0.0));
            assert_eq!(f64_fma(d(2.0), d(-3.0), d(6.0), rm, &mut fl), z);
            assert_eq!(f64_fma(d(0.0), d(-3.0), d(-0.0), rm, &mut fl), d(-0.0));
            assert_eq!(f64_fma(d(0.0), d(-3.0), d(0.0), rm, &mut fl), z);
            assert_eq!(f32_sub(f(1.5), f(1.5), rm, &mut fl), (z >> 32) as u32);
            assert_eq!(fl, 0);
        }
        let mut fl = 0;
        assert_eq!(i32_to_f32(0, Rm::Rdn, &mut fl), 0);
        assert_eq!(f64_to_i64(d(-0.0), Rm::Rne, &mut fl), 0);
        assert_eq!(f64_to_u64(d(-0.0), Rm::Rne, &mut fl), 0);
        assert_eq!(fl, 0);
    }

    #[test]
    fn subnormals() {
        let mut fl = 0;
        let min_sub = 1u64;
        // Smallest subnormal halved: ties to even -> 0, inexact + underflow.
        assert_eq!(f64_mul(min_sub, d(0.5), Rm::Rne, &mut fl), 0);
        assert_eq!(fl, NX | UF);
        fl = 0;
        assert_eq!(f64_mul(min_sub, d(0.5), Rm::Rup, &mut fl), 1);
        assert_eq!(fl, NX | UF);
        fl = 0;
        assert_eq!(f64_mul(min_sub | (1 << 63), d(0.5), Rm::Rdn, &mut fl), 1 | (1 << 63));
        // Exact subnormal results raise nothing.
        fl = 0;
        assert_eq!(f64_mul(4, d(0.5), Rm::Rne, &mut fl), 2);
        assert_eq!(f64_add(3, 5, Rm::Rne, &mut fl), 8);
        assert_eq!(f64_sub(0x0010_0000_0000_0000, 1, Rm::Rne, &mut fl), 0x000f_ffff_ffff_ffff);
        assert_eq!(fl, 0);
        // Subnormal inputs are not flushed.
        assert_eq!(f32_mul(1, f(2.0), Rm::Rne, &mut fl), 2);
        assert_eq!(f32_to_f64(1, &mut fl), d(f32::from_bits(1) as f64));
        assert_eq!(f64_sqrt(1, Rm::Rne, &mut fl), d(f64::from_bits(1).sqrt()));
        assert_eq!(fl, 0);
        assert_eq!(f64_sqrt(2, Rm::Rne, &mut fl), d(f64::from_bits(2).sqrt()));
        assert_eq!(fl, NX);
        fl = 0;
        // Tininess after rounding: largest subnormal * (1 + 2^-52) rounds up
        // to the smallest normal in RNE; the result is not tiny -> no UF.
        let max_sub = 0x000f_ffff_ffff_ffffu64;
        let r = f64_mul(max_sub, d(1.0 + f64::EPSILON), Rm::Rne, &mut fl);
        assert_eq!(r, 0x0010_0000_0000_0000);
        assert_eq!(fl, NX);
        // In RTZ the same product stays subnormal: tiny and inexact.
        fl = 0;
        assert_eq!(f64_mul(max_sub, d(1.0 + f64::EPSILON), Rm::Rtz, &mut fl), max_sub);
        assert_eq!(fl, NX | UF);
        // Just below 2^-1022 rounding up to it only in the final subnormal
        // rounding but not at full precision: tiny.
        fl = 0;
        let r = f64_mul(0x001f_ffff_ffff_ffff, d(0.5), Rm::Rne, &mut fl);
        assert_eq!(r, 0x0010_0000_0000_0000);
        assert_eq!(fl, NX | UF);
        // f64 -> f32 of the smallest normal f32 minus a bit.
        fl = 0;
        assert_eq!(f64_to_f32(d(f32::MIN_POSITIVE as f64 * (1.0 - f64::EPSILON)), Rm::Rne, &mut fl), 0x0080_0000);
        assert_eq!(fl, NX);
    }

    #[test]
    fn overflow_every_mode() {
        let big = d(f64::MAX);
        let expect = |rm: Rm, neg: bool| -> u64 {
            let inf = match rm {
                Rm::Rne | Rm::Rmm => true,
                Rm::Rtz => false,
                Rm::Rdn => neg,
                Rm::Rup => !neg,
            };
            let mag = if inf { d(f64::INFINITY) } else { big };
            mag | ((neg as u64) << 63)
        };
        for &rm in &RMS {
            for neg in [false, true] {
                let mut fl = 0;
                let a = big | ((neg as u64) << 63);
                assert_eq!(f64_mul(a, d(2.0), rm, &mut fl), expect(rm, neg), "{rm:?} {neg}");
                assert_eq!(fl, OF | NX);
                fl = 0;
                assert_eq!(f64_add(a, a, rm, &mut fl), expect(rm, neg));
                assert_eq!(fl, OF | NX);
                fl = 0;
                assert_eq!(f64_fma(a, d(1.5), a, rm, &mut fl), expect(rm, neg));
                assert_eq!(fl, OF | NX);
                fl = 0;
                let r = f32_div(f(f32::MAX) | ((neg as u32) << 31), f(0.5), rm, &mut fl);
                let inf = expect(rm, neg) & !(1 << 63) == d(f64::INFINITY);
                let want = ((neg as u32) << 31) | if inf { 0x7f80_0000 } else { 0x7f7f_ffff };
                assert_eq!(r, want);
                assert_eq!(fl, OF | NX);
                fl = 0;
                let r = f64_to_f32(a, rm, &mut fl);
                assert_eq!(fl, OF | NX);
                assert_eq!(
                    r & 0x7fff_ffff,
                    if expect(rm, neg) & !(1 << 63) == big { 0x7f7f_ffff } else { 0x7f80_0000 }
                );
            }
        }
        // Adding half an ulp to MAX: RNE ties to even -> overflow.
        let mut fl = 0;
        let half_ulp = d(2f64.powi(970));
        assert_eq!(f64_add(big, half_ulp, Rm::Rne, &mut fl), d(f64::INFINITY));
        assert_eq!(fl, OF | NX);
        fl = 0;
        // In RTZ the unbounded-exponent result is MAX itself: no overflow.
        assert_eq!(f64_add(big, half_ulp, Rm::Rtz, &mut fl), big);
        assert_eq!(fl, NX);
        fl = 0;
        // Just less than half an ulp rounds back to MAX without overflow.
        assert_eq!(f64_add(big, d(2f64.powi(969)), Rm::Rne, &mut fl), big);
        assert_eq!(fl, NX);
        // u64::MAX to f32 in RUP reaches 2^64, well in range.
        fl = 0;
        assert_eq!(u64_to_f32(u64::MAX, Rm::Rup, &mut fl), f(18446744073709551616.0));
        assert_eq!(fl, NX);
    }

    #[test]
    fn nan_handling() {
        let qn = 0x7ff8_0000_0000_1234u64;
        let sn = 0x7ff0_0000_0000_0001u64;
        let inf = d(f64::INFINITY);
        let mut fl = 0;
        assert_eq!(f64_add(qn, d(1.0), Rm::Rne, &mut fl), F64_CANONICAL_NAN);
        assert_eq!(fl, 0);
        assert_eq!(f64_mul(d(1.0), qn | (1 << 63), Rm::Rne, &mut fl), F64_CANONICAL_NAN);
        assert_eq!(fl, 0);
        assert_eq!(f64_add(sn, d(1.0), Rm::Rne, &mut fl), F64_CANONICAL_NAN);
        assert_eq!(fl, NV);
        let invalid: [(u64, &str); 7] = [
            (f64_add(inf, inf | (1 << 63), Rm::Rne, &mut 0), "inf-inf"),
            (f64_mul(0, inf, Rm::Rne, &mut 0), "0*inf"),
            (f64_div(0, 1 << 63, Rm::Rne, &mut 0), "0/0"),
            (f64_div(inf, inf, Rm::Rne, &mut 0), "inf/inf"),
            (f64_sqrt(d(-1.0), Rm::Rne, &mut 0), "sqrt(-1)"),
            (f64_fma(inf, 0, qn, Rm::Rne, &mut 0), "fma(inf,0,qnan)"),
            (f64_fma(inf, d(1.0), inf | (1 << 63), Rm::Rne, &mut 0), "fma(inf,1,-inf)"),
        ];
        for (r, what) in invalid {
            assert_eq!(r, F64_CANONICAL_NAN, "{what}");
        }
        for (fl, what) in [
            (
                {
                    let mut g = 0;
                    f64_add(inf, inf | (1 << 63), Rm::Rne, &mut g);
                    g
                },
                "inf-inf",
            ),
            (
                {
                    let mut g = 0;
                    f64_mul(0, inf, Rm::Rne, &mut g);
                    g
                },
                "0*inf",
            ),
            (
                {
                    let mut g = 0;
                    f64_div(0, 0, Rm::Rne, &mut g);
                    g
                },
                "0/0",
            ),
            (
                {
                    let mut g = 0;
                    f64_div(inf, inf, Rm::Rne, &mut g);
                    g
                },
                "inf/inf",
            ),
            (
                {
                    let mut g = 0;
                    f64_sqrt(d(-1e-300), Rm::Rne, &mut g);
                    g
                },
                "sqrt(-x)",
            ),
            (
                {
                    let mut g = 0;
                    f64_fma(0, inf, qn, Rm::Rne, &mut g);
                    g
                },
                "fma(0,inf,qnan)",
            ),
            (
                {
                    let mut g = 0;
                    f32_fma(0, 0x7f80_0000, 0x7fc0_0001, Rm::Rne, &mut g);
                    g
                },
                "f32 fma(0,inf,qnan)",
            ),
        ] {
            assert_eq!(fl, NV, "{what}");
        }
        fl = 0;
        assert_eq!(f64_div(d(1.0), 1 << 63, Rm::Rne, &mut fl), inf | (1 << 63));
        assert_eq!(fl, DZ);
        fl = 0;
        assert_eq!(f64_div(inf, 0, Rm::Rne, &mut fl), inf);
        assert_eq!(f64_sqrt(inf, Rm::Rne, &mut fl), inf);
        assert_eq!(f64_fma(qn, 0, inf, Rm::Rne, &mut fl), F64_CANONICAL_NAN);
        assert_eq!(fl, 0);
        // Conversions between widths canonicalize.
        assert_eq!(f32_to_f64(0x7fc0_1234, &mut fl), F64_CANONICAL_NAN);
        assert_eq!(fl, 0);
        assert_eq!(f32_to_f64(0xff80_0001, &mut fl), F64_CANONICAL_NAN);
        assert_eq!(fl, NV);
        fl = 0;
        assert_eq!(f64_to_f32(qn | (1 << 63), Rm::Rne, &mut fl), F32_CANONICAL_NAN);
        assert_eq!(fl, 0);
        assert_eq!(f64_to_f32(sn, Rm::Rne, &mut fl), F32_CANONICAL_NAN);
        assert_eq!(fl, NV);
    }

    #[test]
    fn classify_all() {
        let cases32: [(u32, u32); 12] = [
            (0xff80_0000, 0),
            (f(-1.0), 1),
            (0x8000_0001, 2),
            (0x8000_0000, 3),
            (0, 4),
            (0x007f_ffff, 5),
            (f(1.0), 6),
            (0x7f80_0000, 7),
            (0x7f80_0001, 8),
            (0xffbf_ffff, 8),
            (0x7fc0_0000, 9),
            (0xffff_ffff, 9),
        ];
        for (x, bit) in cases32 {
            assert_eq!(f32_classify(x), 1 << bit, "{x:#x}");
        }
        let cases64: [(u64, u32); 10] = [
            (d(f64::NEG_INFINITY), 0),
            (d(-f64::MAX), 1),
            (0x800f_ffff_ffff_ffff, 2),
            (d(-0.0), 3),
            (0, 4),
            (1, 5),
            (d(f64::MIN_POSITIVE), 6),
            (d(f64::INFINITY), 7),
            (0x7ff4_0000_0000_0000, 8),
            (0xfff8_0000_0000_0000, 9),
        ];
        for (x, bit) in cases64 {
            assert_eq!(f64_classify(x), 1 << bit, "{x:#x}");
        }
    }

    #[test]
    fn conversions_saturate() {
        let cases: [(f64, Rm, i64, u8); 12] = [
            (2147483647.0, Rm::Rne, i32::MAX as i64, 0),
            (2147483647.4, Rm::Rne, i32::MAX as i64, NX),
            (2147483647.5, Rm::Rne, i32::MAX as i64, NV),
            (2147483647.5, Rm::Rtz, i32::MAX as i64, NX),
            (2147483648.0, Rm::Rtz, i32::MAX as i64, NV),
            (-2147483648.0, Rm::Rne, i32::MIN as i64, 0),
            (-2147483648.5, Rm::Rne, i32::MIN as i64, NX),
            (-2147483648.5, Rm::Rmm, i32::MIN as i64, NV),
            (-2147483648.5, Rm::Rdn, i32::MIN as i64, NV),
            (-2147483648.5, Rm::Rup, i32::MIN as i64, NX),
            (f64::INFINITY, Rm::Rne, i32::MAX as i64, NV),
            (f64::NEG_INFINITY, Rm::Rne, i32::MIN as i64, NV),
        ];
        for (x, rm, want, wfl) in cases {
            let mut fl = 0;
            assert_eq!(f64_to_i32(d(x), rm, &mut fl) as i64, want, "{x} {rm:?}");
            assert_eq!(fl, wfl, "{x} {rm:?}");
        }
        let mut fl = 0;
        assert_eq!(f64_to_i32(F64_CANONICAL_NAN | (1 << 63), Rm::Rne, &mut fl), i32::MAX);
        assert_eq!(fl, NV);
        fl = 0;
        assert_eq!(f64_to_u32(F64_CANONICAL_NAN, Rm::Rne, &mut fl), u32::MAX);
        assert_eq!(fl, NV);
        fl = 0;
        assert_eq!(f32_to_u32(f(-0.4), Rm::Rne, &mut fl), 0);
        assert_eq!(fl, NX);
        fl = 0;
        assert_eq!(f32_to_u32(f(-0.4), Rm::Rdn, &mut fl), 0);
        assert_eq!(fl, NV);
        fl = 0;
        assert_eq!(f32_to_u32(f(-1.0), Rm::Rtz, &mut fl), 0);
        assert_eq!(fl, NV);
        fl = 0;
        assert_eq!(f64_to_u32(d(4294967295.5), Rm::Rtz, &mut fl), u32::MAX);
        assert_eq!(fl, NX);
        fl = 0;
        assert_eq!(f64_to_u32(d(4294967295.5), Rm::Rne, &mut fl), u32::MAX);
        assert_eq!(fl, NV);
        fl = 0;
        assert_eq!(f64_to_u64(d(18446744073709549568.0), Rm::Rne, &mut fl), 18446744073709549568);
        assert_eq!(fl, 0);
        assert_eq!(f64_to_u64(d(18446744073709551616.0), Rm::Rne, &mut fl), u64::MAX);
        assert_eq!(fl, NV);
        fl = 0;
        assert_eq!(f64_to_i64(d(-9223372036854775808.0), Rm::Rne, &mut fl), i64::MIN);
        assert_eq!(fl, 0);
        assert_eq!(f64_to_i64(d(9223372036854775808.0), Rm::Rne, &mut fl), i64::MAX);
        assert_eq!(fl, NV);
        fl = 0;
        assert_eq!(f32_to_i64(f(-1e30), Rm::Rne, &mut fl), i64::MIN);
        assert_eq!(f32_to_u64(f(-1e30), Rm::Rne, &mut fl), 0);
        assert_eq!(f32_to_u64(f(f32::INFINITY), Rm::Rne, &mut fl), u64::MAX);
        assert_eq!(fl, NV);
        fl = 0;
        assert_eq!(f64_to_i64(d(2.5), Rm::Rne, &mut fl), 2);
        assert_eq!(f64_to_i64(d(2.5), Rm::Rmm, &mut fl), 3);
        assert_eq!(f64_to_i64(d(-2.5), Rm::Rmm, &mut fl), -3);
        assert_eq!(f64_to_i64(d(-2.5), Rm::Rup, &mut fl), -2);
        assert_eq!(f64_to_i64(d(1e-300), Rm::Rup, &mut fl), 1);
        assert_eq!(f64_to_i64(d(-1e-300), Rm::Rup, &mut fl), 0);
        assert_eq!(fl, NX);
        // Integer to float.
        fl = 0;
        assert_eq!(i64_to_f64(i64::MIN, Rm::Rne, &mut fl), d(-9223372036854775808.0));
        assert_eq!(i32_to_f64(i32::MIN, Rm::Rne, &mut fl), d(-2147483648.0));
        assert_eq!(u32_to_f64(u32::MAX, Rm::Rne, &mut fl), d(4294967295.0));
        assert_eq!(i32_to_f32(16777217, Rm::Rtz, &mut fl), f(16777216.0));
        assert_eq!(fl, NX);
        fl = 0;
        assert_eq!(i32_to_f32(16777217, Rm::Rup, &mut fl), f(16777218.0));
        assert_eq!(i32_to_f32(-16777217, Rm::Rup, &mut fl), f(-16777216.0));
        assert_eq!(i64_to_f64(i64::MAX, Rm::Rtz, &mut fl), d(9223372036854774784.0));
        assert_eq!(fl, NX);
    }

    #[test]
    fn min_max() {
        let mut fl = 0;
        let (p0, n0) = (d(0.0), d(-0.0));
        assert_eq!(f64_min(p0, n0, &mut fl), n0);
        assert_eq!(f64_min(n0, p0, &mut fl), n0);
        assert_eq!(f64_max(p0, n0, &mut fl), p0);
        assert_eq!(f64_max(n0, p0, &mut fl), p0);
        assert_eq!(f32_min(f(0.0), f(-0.0), &mut fl), f(-0.0));
        assert_eq!(f32_max(f(-0.0), f(0.0), &mut fl), f(0.0));
        assert_eq!(f64_min(d(-1.0), d(2.0), &mut fl), d(-1.0));
        assert_eq!(f64_max(d(-1.0), d(-2.0), &mut fl), d(-1.0));
        assert_eq!(f64_min(d(f64::NEG_INFINITY), d(-2.0), &mut fl), d(f64::NEG_INFINITY));
        let qn = 0x7ff8_0000_0000_0042u64;
        assert_eq!(f64_min(qn, d(3.0), &mut fl), d(3.0));
        assert_eq!(f64_max(d(3.0), qn, &mut fl), d(3.0));
        assert_eq!(f64_max(qn, qn, &mut fl), F64_CANONICAL_NAN);
        assert_eq!(fl, 0);
        let sn = 0x7ff0_0000_0000_0042u64;
        assert_eq!(f64_min(sn, d(3.0), &mut fl), d(3.0));
        assert_eq!(fl, NV);
        fl = 0;
        assert_eq!(f64_max(sn, qn, &mut fl), F64_CANONICAL_NAN);
        assert_eq!(fl, NV);
        fl = 0;
        assert_eq!(f32_min(0x7f80_0001, 0xff80_0000, &mut fl), 0xff80_0000);
        assert_eq!(fl, NV);
    }

    #[test]
    fn compares() {
        let mut fl = 0;
        assert!(f64_eq(d(0.0), d(-0.0), &mut fl));
        assert!(f64_le(d(-0.0), d(0.0), &mut fl));
        assert!(!f64_lt(d(-0.0), d(0.0), &mut fl));
        assert!(f64_lt(d(-1.0), d(-0.5), &mut fl));
        assert!(!f64_lt(d(-0.5), d(-1.0), &mut fl));
        assert!(f32_le(f(1.0), f(1.0), &mut fl));
        assert!(f32_lt(f(f32::NEG_INFINITY), f(f32::MIN), &mut fl));
        assert!(!f64_eq(F64_CANONICAL_NAN, F64_CANONICAL_NAN, &mut fl));
        assert_eq!(fl, 0);
        assert!(!f64_eq(0x7ff0_0000_0000_0001, d(1.0), &mut fl));
        assert_eq!(fl, NV);
        fl = 0;
        assert!(!f64_lt(F64_CANONICAL_NAN, d(1.0), &mut fl));
        assert_eq!(fl, NV);
        fl = 0;
        assert!(!f32_le(f(1.0), F32_CANONICAL_NAN, &mut fl));
        assert_eq!(fl, NV);
    }

    #[test]
    fn fma_single_rounding() {
        // (1 + 2^-52)^2 = 1 + 2^-51 + 2^-104: a separate multiply loses the
        // 2^-104 term; fma with c = -(1 + 2^-51) recovers it exactly.
        let mut fl = 0;
        let a = d(1.0 + f64::EPSILON);
        let c = d(-(1.0 + 2.0 * f64::EPSILON));
        assert_eq!(f64_fma(a, a, c, Rm::Rne, &mut fl), d(2f64.powi(-104)));
        assert_eq!(fl, 0);
        // Tiny product plus a normal: sticky must still steer directed rounding.
        assert_eq!(f64_fma(1, 1, d(1.0), Rm::Rup, &mut fl), d(1.0 + f64::EPSILON));
        assert_eq!(fl, NX);
        fl = 0;
        assert_eq!(f64_fma(1 | (1 << 63), 1, d(1.0), Rm::Rtz, &mut fl), d(1.0 - f64::EPSILON / 2.0));
        assert_eq!(fl, NX);
    }
}
