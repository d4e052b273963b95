# RV64F: single-precision arithmetic, fused multiply-add family,
# conversions, compares, fclass, fmin/fmax with NaN and signed zeros,
# sign injection, moves, NaN boxing, canonical NaNs, fflags accumulation,
# static and dynamic rounding modes, illegal rounding modes, and
# mstatus.FS (Off makes FP instructions illegal; writes make it Dirty).
# Values are IEEE-754 binary32 bit patterns.
#include "common.h"

#define S_ZERO   0x00000000
#define S_NZERO  0x80000000
#define S_ONE    0x3f800000
#define S_NONE   0xbf800000
#define S_TWO    0x40000000
#define S_NTWO   0xc0000000
#define S_THREE  0x40400000
#define S_FOUR   0x40800000
#define S_HALF   0x3f000000
#define S_2P5    0x40200000
#define S_N2P5   0xc0200000
#define S_INF    0x7f800000
#define S_NINF   0xff800000
#define S_QNAN   0x7fc00000      /* the canonical NaN */
#define S_QNANP  0x7fc12345      /* quiet NaN with a payload */
#define S_SNAN   0x7f800001
#define S_MAX    0x7f7fffff
#define S_NMAX   0xff7fffff
#define S_MINN   0x00800000      /* smallest normal */
#define S_MINS   0x00000001      /* smallest subnormal */
#define S_ULPH   0x33800000      /* 2^-24: half an ulp of 1.0 */
#define S_1P1U   0x3f800001      /* 1 + 2^-23 */
#define S_1M1U   0x3f7ffffe      /* 1 - 2^-23 */
#define S_1P5    0x3fc00000
#define S_N1P5   0xbfc00000

#define NX FFLAG_NX
#define UF FFLAG_UF
#define OF FFLAG_OF
#define DZ FFLAG_DZ
#define NV FFLAG_NV

    .text
test_main:
    /* ---- arithmetic */
    TEST_FP_S2(1, fadd.s, S_THREE, 0, S_ONE, S_TWO)
    TEST_FP_S2(2, fadd.s, S_ONE, NX, S_ONE, S_ULPH)
    TEST_FP_S2(3, fsub.s, S_ZERO, 0, S_ONE, S_ONE)
    TEST_FP_S(4, S_NZERO, 0, S_ONE, S_ONE, 0, fsub.s fa3, fa0, fa1, rdn)
    TEST_FP_S2(5, fmul.s, 0x40a00000, 0, S_2P5, S_TWO)
    TEST_FP_S2(6, fdiv.s, 0x3eaaaaab, NX, S_ONE, S_THREE)
    TEST_FP_S2(7, fdiv.s, S_INF, DZ, S_ONE, S_ZERO)
    TEST_FP_S2(8, fdiv.s, S_NINF, DZ, S_NONE, S_ZERO)
    TEST_FP_S2(9, fdiv.s, S_QNAN, NV, S_ZERO, S_ZERO)
    TEST_FP_S2(10, fdiv.s, S_QNAN, NV, S_INF, S_INF)
    TEST_FP_S1(11, fsqrt.s, S_TWO, 0, S_FOUR)
    TEST_FP_S1(12, fsqrt.s, 0x3fb504f3, NX, S_TWO)
    TEST_FP_S1(13, fsqrt.s, S_QNAN, NV, S_NONE)
    TEST_FP_S1(14, fsqrt.s, S_NZERO, 0, S_NZERO)
    TEST_FP_S1(15, fsqrt.s, S_INF, 0, S_INF)
    TEST_FP_S2(16, fadd.s, S_QNAN, NV, S_INF, S_NINF)
    TEST_FP_S2(17, fadd.s, S_QNAN, 0, S_QNANP, S_ONE)       /* payload dropped */
    TEST_FP_S2(18, fadd.s, S_QNAN, NV, S_SNAN, S_ONE)
    TEST_FP_S2(19, fmul.s, S_QNAN, NV, S_INF, S_ZERO)
    TEST_FP_S2(20, fmul.s, S_INF, OF | NX, S_MAX, S_TWO)
    TEST_FP_S(21, S_MAX, OF | NX, S_MAX, S_TWO, 0, fmul.s fa3, fa0, fa1, rtz)
    TEST_FP_S(22, S_NMAX, OF | NX, S_NMAX, S_TWO, 0, fmul.s fa3, fa0, fa1, rup)
    TEST_FP_S2(23, fmul.s, 0x00400000, 0, S_MINN, S_HALF)    /* exact subnormal: no UF */
    TEST_FP_S2(24, fmul.s, S_ZERO, UF | NX, S_MINS, S_HALF)
    TEST_FP_S(25, S_MINS, UF | NX, S_MINS, S_HALF, 0, fmul.s fa3, fa0, fa1, rup)
    TEST_FP_S2(26, fsub.s, S_NINF, 0, S_NINF, S_MAX)

    /* ---- fused multiply-add family */
    TEST_FP_S3(27, fmadd.s, 0x40e00000, 0, S_TWO, S_THREE, S_ONE)
    TEST_FP_S3(28, fmsub.s, 0x40a00000, 0, S_TWO, S_THREE, S_ONE)
    TEST_FP_S3(29, fnmsub.s, 0xc0a00000, 0, S_TWO, S_THREE, S_ONE)
    TEST_FP_S3(30, fnmadd.s, 0xc0e00000, 0, S_TWO, S_THREE, S_ONE)
    TEST_FP_S3(31, fmadd.s, 0xa8800000, 0, S_1P1U, S_1M1U, S_NONE)   /* single rounding */
    TEST_FP_S3(32, fmadd.s, S_QNAN, NV, S_INF, S_ZERO, S_QNANP)     /* inf*0 + qNaN: NV */
    TEST_FP_S3(33, fmadd.s, S_QNAN, NV, S_INF, S_ONE, S_NINF)
    TEST_FP_S3(34, fnmadd.s, S_NZERO, 0, S_ZERO, S_ONE, S_ZERO)
    TEST_FP_S(35, S_NZERO, 0, S_ONE, S_ONE, S_NONE, fmadd.s fa3, fa0, fa1, fa2, rdn)
    TEST_FP_S(36, S_ZERO, 0, S_ONE, S_ONE, S_NONE, fmadd.s fa3, fa0, fa1, fa2, rne)
    TEST_FP_S3(37, fmsub.s, S_INF, OF | NX, S_MAX, S_MAX, S_ONE)

    /* ---- compares */
    TEST_FP_INT_S(38, 1, 0, S_ONE, S_ONE, feq.s a0, fa0, fa1)
    TEST_FP_INT_S(39, 0, 0, S_ONE, S_TWO, feq.s a0, fa0, fa1)
    TEST_FP_INT_S(40, 0, 0, S_QNAN, S_QNAN, feq.s a0, fa0, fa1)
    TEST_FP_INT_S(41, 0, NV, S_SNAN, S_ONE, feq.s a0, fa0, fa1)
    TEST_FP_INT_S(42, 1, 0, S_NZERO, S_ZERO, feq.s a0, fa0, fa1)
    TEST_FP_INT_S(43, 1, 0, S_ONE, S_TWO, flt.s a0, fa0, fa1)
    TEST_FP_INT_S(44, 0, 0, S_TWO, S_ONE, flt.s a0, fa0, fa1)
    TEST_FP_INT_S(45, 0, 0, S_NZERO, S_ZERO, flt.s a0, fa0, fa1)
    TEST_FP_INT_S(46, 0, NV, S_QNAN, S_ONE, flt.s a0, fa0, fa1)
    TEST_FP_INT_S(47, 1, 0, S_ONE, S_ONE, fle.s a0, fa0, fa1)
    TEST_FP_INT_S(48, 1, 0, S_NINF, S_NMAX, fle.s a0, fa0, fa1)
    TEST_FP_INT_S(49, 0, NV, S_ONE, S_QNAN, fle.s a0, fa0, fa1)

    /* ---- fclass */
    TEST_FP_INT_S(50, 1 << 0, 0, S_NINF, 0, fclass.s a0, fa0)
    TEST_FP_INT_S(51, 1 << 1, 0, S_NONE, 0, fclass.s a0, fa0)
    TEST_FP_INT_S(52, 1 << 2, 0, 0x80000001, 0, fclass.s a0, fa0)
    TEST_FP_INT_S(53, 1 << 3, 0, S_NZERO, 0, fclass.s a0, fa0)
    TEST_FP_INT_S(54, 1 << 4, 0, S_ZERO, 0, fclass.s a0, fa0)
    TEST_FP_INT_S(55, 1 << 5, 0, 0x007fffff, 0, fclass.s a0, fa0)
    TEST_FP_INT_S(56, 1 << 6, 0, S_MAX, 0, fclass.s a0, fa0)
    TEST_FP_INT_S(57, 1 << 7, 0, S_INF, 0, fclass.s a0, fa0)
    TEST_FP_INT_S(58, 1 << 8, 0, S_SNAN, 0, fclass.s a0, fa0)
    TEST_FP_INT_S(59, 1 << 9, 0, S_QNANP, 0, fclass.s a0, fa0)
    TEST_FP_INT_S(60, 1 << 8, 0, 0xff800001, 0, fclass.s a0, fa0)

    /* ---- fmin / fmax */
    TEST_FP_S2(61, fmin.s, S_ONE, 0, S_ONE, S_TWO)
    TEST_FP_S2(62, fmax.s, S_TWO, 0, S_ONE, S_TWO)
    TEST_FP_S2(63, fmin.s, S_NTWO, 0, S_ONE, S_NTWO)
    TEST_FP_S2(64, fmin.s, S_NZERO, 0, S_NZERO, S_ZERO)
    TEST_FP_S2(65, fmin.s, S_NZERO, 0, S_ZERO, S_NZERO)
    TEST_FP_S2(66, fmax.s, S_ZERO, 0, S_NZERO, S_ZERO)
    TEST_FP_S2(67, fmax.s, S_ZERO, 0, S_ZERO, S_NZERO)
    TEST_FP_S2(68, fmin.s, S_ONE, 0, S_QNANP, S_ONE)
    TEST_FP_S2(69, fmax.s, S_ONE, 0, S_ONE, S_QNANP)
    TEST_FP_S2(70, fmin.s, S_ONE, NV, S_SNAN, S_ONE)
    TEST_FP_S2(71, fmax.s, S_NINF, NV, S_NINF, S_SNAN)
    TEST_FP_S2(72, fmin.s, S_QNAN, 0, S_QNANP, S_QNANP)
    TEST_FP_S2(73, fmax.s, S_QNAN, NV, S_SNAN, S_SNAN)

    /* ---- sign injection (never canonicalizes, never raises) */
    TEST_FP_S2(74, fsgnj.s, S_NONE, 0, S_ONE, S_NTWO)
    TEST_FP_S2(75, fsgnj.s, S_ONE, 0, S_NONE, S_TWO)
    TEST_FP_S2(76, fsgnjn.s, S_ONE, 0, S_ONE, S_NTWO)
    TEST_FP_S2(77, fsgnjn.s, S_NONE, 0, S_ONE, S_TWO)
    TEST_FP_S2(78, fsgnjx.s, S_ONE, 0, S_NONE, S_NTWO)
    TEST_FP_S2(79, fsgnjx.s, S_NONE, 0, S_ONE, S_NTWO)
    TEST_FP_S2(80, fsgnj.s, 0xff800001, 0, S_SNAN, S_NONE)
    TEST_FP_S2(81, fsgnjx.s, 0x7fc12345, 0, S_QNANP, S_ONE)

    /* ---- float -> integer, every rounding mode */
    TEST_FP_INT_S(82, 2, NX, S_2P5, 0, fcvt.w.s a0, fa0, rne)
    TEST_FP_INT_S(83, 2, NX, S_2P5, 0, fcvt.w.s a0, fa0, rtz)
    TEST_FP_INT_S(84, 2, NX, S_2P5, 0, fcvt.w.s a0, fa0, rdn)
    TEST_FP_INT_S(85, 3, NX, S_2P5, 0, fcvt.w.s a0, fa0, rup)
    TEST_FP_INT_S(86, 3, NX, S_2P5, 0, fcvt.w.s a0, fa0, rmm)
    TEST_FP_INT_S(87, -2, NX, S_N2P5, 0, fcvt.w.s a0, fa0, rne)
    TEST_FP_INT_S(88, -2, NX, S_N2P5, 0, fcvt.w.s a0, fa0, rtz)
    TEST_FP_INT_S(89, -3, NX, S_N2P5, 0, fcvt.w.s a0, fa0, rdn)
    TEST_FP_INT_S(90, -2, NX, S_N2P5, 0, fcvt.w.s a0, fa0, rup)
    TEST_FP_INT_S(91, -3, NX, S_N2P5, 0, fcvt.w.s a0, fa0, rmm)
    TEST_FP_INT_S(92, 4, NX, 0x40600000, 0, fcvt.w.s a0, fa0, rne)  /* 3.5 -> 4 */
    TEST_FP_INT_S(93, 0x7fffffff, NV, 0x4f32d05e, 0, fcvt.w.s a0, fa0, rtz)
    TEST_FP_INT_S(94, 0xffffffff80000000, NV, 0xcf32d05e, 0, fcvt.w.s a0, fa0, rtz)
    TEST_FP_INT_S(95, 0x7fffffff, NV, S_QNAN, 0, fcvt.w.s a0, fa0, rtz)
    TEST_FP_INT_S(96, 0xffffffff80000000, NV, S_NINF, 0, fcvt.w.s a0, fa0, rtz)
    TEST_FP_INT_S(97, 0xffffffff80000000, 0, 0xcf000000, 0, fcvt.w.s a0, fa0, rtz)
    TEST_FP_INT_S(98, 0xffffffffb2d05e00, 0, 0x4f32d05e, 0, fcvt.wu.s a0, fa0, rtz)
    TEST_FP_INT_S(99, 0, NV, S_NONE, 0, fcvt.wu.s a0, fa0, rtz)
    TEST_FP_INT_S(100, 0, NX, 0xbf000000, 0, fcvt.wu.s a0, fa0, rtz)   /* -0.5 -> 0 */
    TEST_FP_INT_S(101, 0xffffffffffffffff, NV, S_QNAN, 0, fcvt.wu.s a0, fa0, rtz)
    TEST_FP_INT_S(102, 0xffffffffffffffff, NV, S_INF, 0, fcvt.wu.s a0, fa0, rtz)
    TEST_FP_INT_S(103, 0x10000000000, 0, 0x53800000, 0, fcvt.l.s a0, fa0, rtz)
    TEST_FP_INT_S(104, -2, NX, S_N1P5, 0, fcvt.l.s a0, fa0, rdn)
    TEST_FP_INT_S(105, 0x7fffffffffffffff, NV, S_INF, 0, fcvt.l.s a0, fa0, rtz)
    TEST_FP_INT_S(106, 0x7fffffffffffffff, NV, S_SNAN, 0, fcvt.l.s a0, fa0, rtz)
    TEST_FP_INT_S(107, 0x8000000000000000, 0, 0xdf000000, 0, fcvt.l.s a0, fa0, rtz)
    TEST_FP_INT_S(108, 0x8000000000000000, NV, S_NINF, 0, fcvt.l.s a0, fa0, rtz)
    TEST_FP_INT_S(109, 0x8000000000000000, 0, 0x5f000000, 0, fcvt.lu.s a0, fa0, rtz)
    TEST_FP_INT_S(110, 0, NV, S_NONE, 0, fcvt.lu.s a0, fa0, rtz)
    TEST_FP_INT_S(111, 0xffffffffffffffff, NV, 0x5f800000, 0, fcvt.lu.s a0, fa0, rtz)
    TEST_FP_INT_S(112, 2, NX, S_1P5, 0, fcvt.lu.s a0, fa0, rup)

    /* ---- integer -> float */
    TEST_INT_FP_S(113, S_NONE, 0, -1, fcvt.s.w fa3, a1)
    TEST_INT_FP_S(114, 0x4f000000, NX, 0x7fffffff, fcvt.s.w fa3, a1)
    TEST_INT_FP_S(115, 0x4effffff, NX, 0x7fffffff, fcvt.s.w fa3, a1, rtz)
    TEST_INT_FP_S(116, S_ONE, 0, 0x100000001, fcvt.s.w fa3, a1)       /* low word only */
    TEST_INT_FP_S(117, 0x4f800000, NX, 0xffffffff, fcvt.s.wu fa3, a1)
    TEST_INT_FP_S(118, 0x4f800000, NX, 0xffffffffffffffff, fcvt.s.wu fa3, a1)
    TEST_INT_FP_S(119, 0xdf000000, 0, 0x8000000000000000, fcvt.s.l fa3, a1)
    TEST_INT_FP_S(120, 0x5f800000, NX, 0xffffffffffffffff, fcvt.s.lu fa3, a1)
    TEST_INT_FP_S(121, 0x5f7fffff, NX, 0xffffffffffffffff, fcvt.s.lu fa3, a1, rtz)
    TEST_INT_FP_S(122, 0x4b800000, NX, 0x1000001, fcvt.s.l fa3, a1, rne)
    TEST_INT_FP_S(123, 0x4b800001, NX, 0x1000001, fcvt.s.l fa3, a1, rup)
    TEST_INT_FP_S(124, S_ZERO, 0, 0, fcvt.s.l fa3, a1)

    /* ---- moves */
    TEST_BEGIN(125); LOAD_S(fa0, S_NONE); fmv.x.w a0, fa0; ASSERT_EQ(a0, 0xffffffffbf800000)
    TEST_BEGIN(126); LOAD_S(fa0, S_ONE); fmv.x.w a0, fa0; ASSERT_EQ(a0, 0x3f800000)
    TEST_BEGIN(127); li a1, 0x123456783f800000; fmv.w.x fa0, a1; fmv.x.d a0, fa0
    ASSERT_EQ(a0, 0xffffffff3f800000)
    TEST_BEGIN(128)                   /* flw NaN-boxes, fsw stores 4 bytes */
    la a1, fdata
    flw fa0, 0(a1)
    fmv.x.d a0, fa0
    ASSERT_EQ(a0, 0xffffffffc0490fdb)
    fsw fa0, 8(a1)
    ld a0, 8(a1)
    ASSERT_EQ(a0, 0x11111111c0490fdb)

    /* ---- NaN boxing: an improperly boxed value reads as the canonical NaN */
    TEST_BEGIN(129)
    li a1, 0x000000003f800000
    fmv.d.x fa0, a1
    LOAD_S(fa1, S_ONE)
    csrw fflags, zero
    fadd.s fa3, fa0, fa1
    fmv.x.d a0, fa3
    ASSERT_EQ(a0, BOX_S(S_QNAN))
    csrr a0, fflags
    ASSERT_EQ(a0, 0)
    TEST_BEGIN(130); fsgnj.s fa3, fa0, fa0; fmv.x.d a0, fa3; ASSERT_EQ(a0, BOX_S(S_QNAN))
    TEST_BEGIN(131); fclass.s a0, fa0; ASSERT_EQ(a0, 1 << 9)
    TEST_BEGIN(132); feq.s a0, fa0, fa0; ASSERT_EQ(a0, 0); csrr a0, fflags; ASSERT_EQ(a0, 0)
    TEST_BEGIN(133)                   /* a boxed NaN with zero payload is not it */
    li a1, 0xfffffffe3f800000
    fmv.d.x fa0, a1
    fmin.s fa3, fa0, fa1
    fmv.x.d a0, fa3
    ASSERT_EQ(a0, BOX_S(S_ONE))
    TEST_BEGIN(134)                   /* transfers (fmv.x.w, fsw) move the bits as they are */
    li a1, 0x12345678bf800000
    fmv.d.x fa0, a1
    fmv.x.w a0, fa0
    ASSERT_EQ(a0, 0xffffffffbf800000)
    la a1, fdata
    fsw fa0, 8(a1)
    lwu a0, 8(a1)
    ASSERT_EQ(a0, 0xbf800000)

    /* ---- fflags accumulate; fcsr = frm << 5 | fflags */
    TEST_BEGIN(135)
    csrw fflags, zero
    LOAD_S(fa0, S_ONE); LOAD_S(fa1, S_ZERO); LOAD_S(fa2, S_ULPH)
    fdiv.s fa3, fa0, fa1            /* DZ */
    fadd.s fa3, fa0, fa2            /* NX */
    fadd.s fa3, fa0, fa0            /* exact: clears nothing */
    csrr a0, fflags
    ASSERT_EQ(a0, DZ | NX)
    TEST_BEGIN(136)
    LOAD_S(fa0, S_MAX); LOAD_S(fa1, S_MINS); LOAD_S(fa2, S_HALF)
    fmul.s fa3, fa0, fa0            /* OF NX */
    fmul.s fa3, fa1, fa2            /* UF NX */
    fsqrt.s fa3, fa2
    LOAD_S(fa0, S_SNAN)
    feq.s a0, fa0, fa0              /* NV */
    csrr a0, fflags
    ASSERT_EQ(a0, NV | DZ | OF | UF | NX)
    TEST_BEGIN(137)
    csrwi frm, 3
    csrr a0, fcsr
    ASSERT_EQ(a0, (3 << 5) | 0x1f)
    TEST_BEGIN(138)
    li a1, 0x1ff
    csrrw a0, fcsr, a1
    ASSERT_EQ(a0, 0x7f)
    csrr a0, fcsr
    ASSERT_EQ(a0, 0xff)
    csrr a0, frm
    ASSERT_EQ(a0, 7)
    TEST_BEGIN(139)
    csrwi fflags, 0
    csrr a0, fcsr
    ASSERT_EQ(a0, 0xe0)
    li a1, 0xfff
    csrw frm, a1
    csrr a0, frm
    ASSERT_EQ(a0, 7)
    csrr a0, fflags
    ASSERT_EQ(a0, 0)
    TEST_BEGIN(140)
    li a1, 0x2a
    fsflags a0, a1
    ASSERT_EQ(a0, 0)
    frflags a0
    ASSERT_EQ(a0, 0x0a)
    csrw fcsr, zero

    /* ---- rounding: 1 + 2^-24 and -(1 + 2^-24) are ties */
    TEST_FP_S(141, S_ONE, NX, S_ONE, S_ULPH, 0, fadd.s fa3, fa0, fa1, rne)
    TEST_FP_S(142, S_ONE, NX, S_ONE, S_ULPH, 0, fadd.s fa3, fa0, fa1, rtz)
    TEST_FP_S(143, S_ONE, NX, S_ONE, S_ULPH, 0, fadd.s fa3, fa0, fa1, rdn)
    TEST_FP_S(144, S_1P1U, NX, S_ONE, S_ULPH, 0, fadd.s fa3, fa0, fa1, rup)
    TEST_FP_S(145, S_1P1U, NX, S_ONE, S_ULPH, 0, fadd.s fa3, fa0, fa1, rmm)
    TEST_FP_S(146, S_NONE, NX, S_NONE, 0xb3800000, 0, fadd.s fa3, fa0, fa1, rne)
    TEST_FP_S(147, S_NONE, NX, S_NONE, 0xb3800000, 0, fadd.s fa3, fa0, fa1, rtz)
    TEST_FP_S(148, 0xbf800001, NX, S_NONE, 0xb3800000, 0, fadd.s fa3, fa0, fa1, rdn)
    TEST_FP_S(149, S_NONE, NX, S_NONE, 0xb3800000, 0, fadd.s fa3, fa0, fa1, rup)
    TEST_FP_S(150, 0xbf800001, NX, S_NONE, 0xb3800000, 0, fadd.s fa3, fa0, fa1, rmm)
    /* 1 + 3 * 2^-24 is 1.5 ulp above 1: RNE goes to the even 1 + 2 ulp */
    TEST_FP_S(151, 0x3f800002, NX, S_ONE, 0x34400000, 0, fadd.s fa3, fa0, fa1, rne)
    /* dynamic rounding mode from frm */
    TEST_FP_S(152, S_ONE, NX, S_ONE, S_ULPH, 0, csrwi frm, 0; fadd.s fa3, fa0, fa1, dyn)
    TEST_FP_S(153, S_ONE, NX, S_ONE, S_ULPH, 0, csrwi frm, 1; fadd.s fa3, fa0, fa1, dyn)
    TEST_FP_S(154, 0xbf800001, NX, S_NONE, 0xb3800000, 0, csrwi frm, 2; fadd.s fa3, fa0, fa1, dyn)
    TEST_FP_S(155, S_1P1U, NX, S_ONE, S_ULPH, 0, csrwi frm, 3; fadd.s fa3, fa0, fa1, dyn)
    TEST_FP_S(156, S_1P1U, NX, S_ONE, S_ULPH, 0, csrwi frm, 4; fadd.s fa3, fa0, fa1, dyn)
    TEST_FP_INT_S(157, 3, NX, S_2P5, 0, csrwi frm, 3; fcvt.w.s a0, fa0, dyn)
    TEST_FP_INT_S(158, 2, NX, S_2P5, 0, csrwi frm, 0; fcvt.w.s a0, fa0)     /* default rm = dyn */
    TEST_INT_FP_S(159, 0x4b800001, NX, 0x1000001, csrwi frm, 3; fcvt.s.l fa3, a1)
    TEST_FP_S(160, S_1P1U, NX, S_ONE, S_ULPH, S_ONE, csrwi frm, 3; fmadd.s fa3, fa0, fa2, fa1)
    csrwi frm, 0

    /* ---- reserved rounding modes are illegal (static 5, 6; dynamic 5..7) */
    TEST_TRAP(161, CAUSE_ILLEGAL, .insn r 0x53, 5, 0x00, fa3, fa0, fa1)   /* fadd.s rm=5 */
    TEST_TRAP(162, CAUSE_ILLEGAL, .insn r 0x53, 6, 0x08, fa3, fa0, fa1)   /* fmul.s rm=6 */
    csrwi frm, 5
    TEST_TRAP(163, CAUSE_ILLEGAL, fadd.s fa3, fa0, fa1, dyn)
    TEST_BEGIN(164)                   /* mtval = the instruction bits */
    TRAP_FIELD(a0, TA_EPC); lwu a1, 0(a0); ASSERT_TVAL_REG(a1)
    csrwi frm, 7
    TEST_TRAP(165, CAUSE_ILLEGAL, fsqrt.s fa3, fa0, dyn)
    csrwi frm, 6
    TEST_TRAP(166, CAUSE_ILLEGAL, fcvt.w.s a0, fa0, dyn)
    csrwi frm, 5
    TEST_TRAP(167, CAUSE_ILLEGAL, fmadd.s fa3, fa0, fa1, fa2)
    csrwi frm, 0

    /* ---- mstatus.FS */
    TEST_BEGIN(168)                   /* an FP register write makes FS Dirty, SD = 1 */
    li t0, MSTATUS_FS
    csrc mstatus, t0
    li t0, 1 << 13                  /* Initial */
    csrs mstatus, t0
    fmv.w.x fa0, zero
    csrr a0, mstatus
    srli a1, a0, 13
    andi a1, a1, 3
    ASSERT_EQ(a1, 3)
    srli a1, a0, 63
    ASSERT_EQ(a1, 1)
    TEST_BEGIN(169)                   /* also from Clean, and by an arithmetic op */
    li t0, MSTATUS_FS
    csrc mstatus, t0
    li t0, 2 << 13
    csrs mstatus, t0
    fadd.s fa1, fa0, fa0
    csrr a0, mstatus
    srli a1, a0, 13
    andi a1, a1, 3
    ASSERT_EQ(a1, 3)
    TEST_BEGIN(170)                   /* Off: SD reads 0 */
    li t0, MSTATUS_FS
    csrc mstatus, t0
    csrr a0, mstatus
    srli a1, a0, 63
    ASSERT_EQ(a1, 0)
    TEST_TRAP(171, CAUSE_ILLEGAL, fadd.s fa3, fa0, fa1)
    TEST_TRAP(172, CAUSE_ILLEGAL, fmv.x.w a0, fa0)
    TEST_TRAP(173, CAUSE_ILLEGAL, fmv.w.x fa0, a0)
    la a1, fdata
    TEST_TRAP(174, CAUSE_ILLEGAL, flw fa0, 0(a1))
    TEST_TRAP(175, CAUSE_ILLEGAL, fsw fa0, 8(a1))
    TEST_TRAP(176, CAUSE_ILLEGAL, csrr a0, fflags)
    TEST_TRAP(177, CAUSE_ILLEGAL, csrw frm, zero)
    TEST_TRAP(178, CAUSE_ILLEGAL, csrr a0, fcsr)
    TEST_TRAP(179, CAUSE_ILLEGAL, fmadd.s fa3, fa0, fa1, fa2)
    TEST_BEGIN(180)                   /* the trapping instruction did not change FS */
    csrr a0, mstatus
    li t0, MSTATUS_FS
    and a0, a0, t0
    ASSERT_EQ(a0, 0)
    TEST_BEGIN(181)                   /* back on: registers kept their values */
    li t0, 1 << 13
    csrs mstatus, t0
    fmv.x.d a0, fa1
    ASSERT_EQ(a0, BOX_S(S_ZERO))

    PASS

    .data
    .balign 8
fdata:  .dword 0x00000000c0490fdb, 0x1111111111111111
