# RV64D: double-precision arithmetic, fused multiply-add family,
# conversions (to/from integers and single precision), compares, fclass,
# fmin/fmax with NaN and signed zeros, sign injection, fmv.x.d/fmv.d.x,
# fld/fsd, NaN boxing of single results and inputs, fflags, rounding.
# Values are IEEE-754 binary64 (or binary32 where noted) bit patterns.
#include "common.h"

#define D_ZERO   0x0000000000000000
#define D_NZERO  0x8000000000000000
#define D_ONE    0x3ff0000000000000
#define D_NONE   0xbff0000000000000
#define D_TWO    0x4000000000000000
#define D_NTWO   0xc000000000000000
#define D_THREE  0x4008000000000000
#define D_FOUR   0x4010000000000000
#define D_HALF   0x3fe0000000000000
#define D_2P5    0x4004000000000000
#define D_N2P5   0xc004000000000000
#define D_INF    0x7ff0000000000000
#define D_NINF   0xfff0000000000000
#define D_QNAN   0x7ff8000000000000
#define D_QNANP  0x7ff8000000012345
#define D_SNAN   0x7ff0000000000001
#define D_MAX    0x7fefffffffffffff
#define D_NMAX   0xffefffffffffffff
#define D_MINN   0x0010000000000000
#define D_MINS   0x0000000000000001
#define D_ULPH   0x3ca0000000000000      /* 2^-53 */
#define D_1P1U   0x3ff0000000000001
#define D_1M1U   0x3feffffffffffffe
#define S_ONE    0x3f800000
#define S_QNAN   0x7fc00000
#define S_SNAN   0x7f800001
#define S_MAX    0x7f7fffff

#define NX FFLAG_NX
#define UF FFLAG_UF
#define OF FFLAG_OF
#define DZ FFLAG_DZ
#define NV FFLAG_NV

    .text
test_main:
    /* ---- arithmetic */
    TEST_FP_D2(1, fadd.d, D_THREE, 0, D_ONE, D_TWO)
    TEST_FP_D2(2, fadd.d, D_ONE, NX, D_ONE, D_ULPH)
    TEST_FP_D(3, D_1P1U, NX, D_ONE, D_ULPH, 0, fadd.d fa3, fa0, fa1, rup)
    TEST_FP_D(4, D_1P1U, NX, D_ONE, D_ULPH, 0, fadd.d fa3, fa0, fa1, rmm)
    TEST_FP_D(5, D_ONE, NX, D_ONE, D_ULPH, 0, fadd.d fa3, fa0, fa1, rtz)
    TEST_FP_D(6, 0xbff0000000000001, NX, D_NONE, 0xbca0000000000000, 0, fadd.d fa3, fa0, fa1, rdn)
    TEST_FP_D(7, D_1P1U, NX, D_ONE, D_ULPH, 0, csrwi frm, 3; fadd.d fa3, fa0, fa1)
    csrwi frm, 0
    TEST_FP_D2(8, fsub.d, D_ZERO, 0, D_ONE, D_ONE)
    TEST_FP_D(9, D_NZERO, 0, D_ONE, D_ONE, 0, fsub.d fa3, fa0, fa1, rdn)
    TEST_FP_D2(10, fmul.d, 0x4014000000000000, 0, D_2P5, D_TWO)
    TEST_FP_D2(11, fdiv.d, 0x3fd5555555555555, NX, D_ONE, D_THREE)
    TEST_FP_D2(12, fdiv.d, D_NINF, DZ, D_NONE, D_ZERO)
    TEST_FP_D2(13, fdiv.d, D_QNAN, NV, D_ZERO, D_ZERO)
    TEST_FP_D1(14, fsqrt.d, D_TWO, 0, D_FOUR)
    TEST_FP_D1(15, fsqrt.d, 0x3ff6a09e667f3bcd, NX, D_TWO)
    TEST_FP_D1(16, fsqrt.d, D_QNAN, NV, D_NONE)
    TEST_FP_D2(17, fadd.d, D_QNAN, NV, D_INF, D_NINF)
    TEST_FP_D2(18, fadd.d, D_QNAN, 0, D_QNANP, D_ONE)
    TEST_FP_D2(19, fmul.d, D_QNAN, NV, D_SNAN, D_ONE)
    TEST_FP_D2(20, fmul.d, D_INF, OF | NX, D_MAX, D_TWO)
    TEST_FP_D(21, D_MAX, OF | NX, D_MAX, D_TWO, 0, fmul.d fa3, fa0, fa1, rdn)
    TEST_FP_D2(22, fmul.d, 0x0008000000000000, 0, D_MINN, D_HALF)
    TEST_FP_D2(23, fmul.d, D_ZERO, UF | NX, D_MINS, D_HALF)
    TEST_FP_D(24, D_MINS, UF | NX, D_MINS, D_HALF, 0, fmul.d fa3, fa0, fa1, rup)

    /* ---- fused multiply-add family */
    TEST_FP_D3(25, fmadd.d, 0x401c000000000000, 0, D_TWO, D_THREE, D_ONE)
    TEST_FP_D3(26, fmsub.d, 0x4014000000000000, 0, D_TWO, D_THREE, D_ONE)
    TEST_FP_D3(27, fnmsub.d, 0xc014000000000000, 0, D_TWO, D_THREE, D_ONE)
    TEST_FP_D3(28, fnmadd.d, 0xc01c000000000000, 0, D_TWO, D_THREE, D_ONE)
    TEST_FP_D3(29, fmadd.d, 0xb970000000000000, 0, D_1P1U, D_1M1U, D_NONE)
    TEST_FP_D3(30, fmadd.d, D_QNAN, NV, D_ZERO, D_INF, D_QNANP)
    TEST_FP_D3(31, fnmsub.d, D_QNAN, NV, D_INF, D_ONE, D_INF)
    TEST_FP_D(32, D_NZERO, 0, D_ONE, D_ONE, D_NONE, fmadd.d fa3, fa0, fa1, fa2, rdn)

    /* ---- compares, fclass */
    TEST_FP_INT_D(33, 1, 0, D_ONE, D_ONE, feq.d a0, fa0, fa1)
    TEST_FP_INT_D(34, 0, 0, D_QNAN, D_ONE, feq.d a0, fa0, fa1)
    TEST_FP_INT_D(35, 0, NV, D_SNAN, D_SNAN, feq.d a0, fa0, fa1)
    TEST_FP_INT_D(36, 1, 0, D_ZERO, D_NZERO, feq.d a0, fa0, fa1)
    TEST_FP_INT_D(37, 1, 0, D_NINF, D_ONE, flt.d a0, fa0, fa1)
    TEST_FP_INT_D(38, 0, NV, D_ONE, D_QNAN, flt.d a0, fa0, fa1)
    TEST_FP_INT_D(39, 1, 0, D_NZERO, D_ZERO, fle.d a0, fa0, fa1)
    TEST_FP_INT_D(40, 0, NV, D_QNAN, D_QNAN, fle.d a0, fa0, fa1)
    TEST_FP_INT_D(41, 1 << 0, 0, D_NINF, 0, fclass.d a0, fa0)
    TEST_FP_INT_D(42, 1 << 1, 0, D_NMAX, 0, fclass.d a0, fa0)
    TEST_FP_INT_D(43, 1 << 2, 0, 0x800fffffffffffff, 0, fclass.d a0, fa0)
    TEST_FP_INT_D(44, 1 << 3, 0, D_NZERO, 0, fclass.d a0, fa0)
    TEST_FP_INT_D(45, 1 << 4, 0, D_ZERO, 0, fclass.d a0, fa0)
    TEST_FP_INT_D(46, 1 << 5, 0, D_MINS, 0, fclass.d a0, fa0)
    TEST_FP_INT_D(47, 1 << 6, 0, D_MINN, 0, fclass.d a0, fa0)
    TEST_FP_INT_D(48, 1 << 7, 0, D_INF, 0, fclass.d a0, fa0)
    TEST_FP_INT_D(49, 1 << 8, 0, D_SNAN, 0, fclass.d a0, fa0)
    TEST_FP_INT_D(50, 1 << 9, 0, D_QNAN, 0, fclass.d a0, fa0)
    TEST_FP_INT_D(51, 1 << 9, 0, BOX_S(S_ONE), 0, fclass.d a0, fa0)  /* a boxed single is a NaN */

    /* ---- fmin / fmax, sign injection */
    TEST_FP_D2(52, fmin.d, D_NTWO, 0, D_ONE, D_NTWO)
    TEST_FP_D2(53, fmax.d, D_ONE, 0, D_ONE, D_NTWO)
    TEST_FP_D2(54, fmin.d, D_NZERO, 0, D_ZERO, D_NZERO)
    TEST_FP_D2(55, fmax.d, D_ZERO, 0, D_NZERO, D_ZERO)
    TEST_FP_D2(56, fmin.d, D_ONE, 0, D_QNANP, D_ONE)
    TEST_FP_D2(57, fmax.d, D_ONE, NV, D_SNAN, D_ONE)
    TEST_FP_D2(58, fmax.d, D_QNAN, 0, D_QNANP, D_QNANP)
    TEST_FP_D2(59, fmin.d, D_QNAN, NV, D_SNAN, D_QNANP)
    TEST_FP_D2(60, fsgnj.d, D_NONE, 0, D_ONE, D_NTWO)
    TEST_FP_D2(61, fsgnjn.d, D_NONE, 0, D_ONE, D_TWO)
    TEST_FP_D2(62, fsgnjx.d, D_ONE, 0, D_NONE, D_NTWO)
    TEST_FP_D2(63, fsgnj.d, 0xfff0000000000001, 0, D_SNAN, D_NONE)

    /* ---- double <-> single */
    TEST_BEGIN(64); LOAD_D(fa0, D_ONE); csrw fflags, zero; fcvt.s.d fa3, fa0
    fmv.x.d a0, fa3; ASSERT_EQ(a0, BOX_S(S_ONE))
    TEST_FP_D(65, BOX_S(0x3eaaaaab), NX, 0x3fd5555555555555, 0, 0, fcvt.s.d fa3, fa0)
    TEST_FP_D(66, BOX_S(0x3eaaaaaa), NX, 0x3fd5555555555555, 0, 0, fcvt.s.d fa3, fa0, rtz)
    TEST_FP_D(67, BOX_S(0x7f800000), OF | NX, D_MAX, 0, 0, fcvt.s.d fa3, fa0)
    TEST_FP_D(68, BOX_S(S_MAX), OF | NX, D_MAX, 0, 0, fcvt.s.d fa3, fa0, rtz)
    TEST_FP_D(69, BOX_S(S_QNAN), NV, D_SNAN, 0, 0, fcvt.s.d fa3, fa0)
    TEST_FP_D(70, BOX_S(S_QNAN), 0, D_QNANP, 0, 0, fcvt.s.d fa3, fa0)
    TEST_FP_D(71, BOX_S(0), UF | NX, 0x3690000000000000, 0, 0, fcvt.s.d fa3, fa0)
    TEST_FP_D(72, BOX_S(1), 0, 0x36a0000000000000, 0, 0, fcvt.s.d fa3, fa0)
    TEST_FP_D(73, D_ONE, 0, BOX_S(S_ONE), 0, 0, fcvt.d.s fa3, fa0)
    TEST_FP_D(74, 0x36a0000000000000, 0, BOX_S(1), 0, 0, fcvt.d.s fa3, fa0)
    TEST_FP_D(75, D_QNAN, NV, BOX_S(S_SNAN), 0, 0, fcvt.d.s fa3, fa0)
    TEST_FP_D(76, D_QNAN, 0, BOX_S(0x7fc12345), 0, 0, fcvt.d.s fa3, fa0)
    TEST_FP_D(77, D_NINF, 0, BOX_S(0xff800000), 0, 0, fcvt.d.s fa3, fa0)
    TEST_FP_D(78, D_QNAN, 0, 0x000000003f800000, 0, 0, fcvt.d.s fa3, fa0)   /* unboxed input */
    /* a double operation on a boxed single sees a NaN */
    TEST_FP_D2(79, fadd.d, D_QNAN, 0, BOX_S(S_ONE), D_ONE)

    /* ---- double -> integer */
    TEST_FP_INT_D(80, 3, NX, D_2P5, 0, fcvt.w.d a0, fa0, rmm)
    TEST_FP_INT_D(81, -2, NX, D_N2P5, 0, fcvt.w.d a0, fa0, rne)
    TEST_FP_INT_D(82, -3, NX, D_N2P5, 0, fcvt.w.d a0, fa0, rdn)
    TEST_FP_INT_D(83, 0x7fffffff, NV, 0x41e0000000000000, 0, fcvt.w.d a0, fa0, rtz)
    TEST_FP_INT_D(84, 0xffffffff80000000, 0, 0xc1e0000000000000, 0, fcvt.w.d a0, fa0, rtz)
    TEST_FP_INT_D(85, 0x7fffffff, NX, 0x41dfffffffe00000, 0, fcvt.w.d a0, fa0, rtz)
    TEST_FP_INT_D(86, 0x7fffffff, NV, 0x41dfffffffe00000, 0, fcvt.w.d a0, fa0, rup)
    TEST_FP_INT_D(87, 0x7fffffff, NV, D_QNAN, 0, fcvt.w.d a0, fa0, rtz)
    TEST_FP_INT_D(88, 0xffffffffffffffff, 0, 0x41efffffffe00000, 0, fcvt.wu.d a0, fa0, rtz)
    TEST_FP_INT_D(89, 0xffffffffffffffff, NV, 0x41f0000000000000, 0, fcvt.wu.d a0, fa0, rtz)
    TEST_FP_INT_D(90, 0, NV, D_NONE, 0, fcvt.wu.d a0, fa0, rtz)
    TEST_FP_INT_D(91, 0x7fffffffffffffff, NV, 0x43e0000000000000, 0, fcvt.l.d a0, fa0, rtz)
    TEST_FP_INT_D(92, 0x8000000000000000, 0, 0xc3e0000000000000, 0, fcvt.l.d a0, fa0, rtz)
    TEST_FP_INT_D(93, 0x7fffffffffffffff, NV, 0x7e37e43c8800759c, 0, fcvt.l.d a0, fa0, rtz)
    TEST_FP_INT_D(94, 0x7fffffffffffffff, NV, D_QNANP, 0, fcvt.l.d a0, fa0, rtz)
    TEST_FP_INT_D(95, -4, NX, 0xc00d99999999999a, 0, fcvt.l.d a0, fa0, rne)
    TEST_FP_INT_D(96, -3, NX, 0xc00d99999999999a, 0, fcvt.l.d a0, fa0, rtz)
    TEST_FP_INT_D(97, 0xfffffffffffff800, 0, 0x43efffffffffffff, 0, fcvt.lu.d a0, fa0, rtz)
    TEST_FP_INT_D(98, 0, 0, D_NZERO, 0, fcvt.lu.d a0, fa0, rtz)
    TEST_FP_INT_D(99, 0, NV, D_NINF, 0, fcvt.lu.d a0, fa0, rtz)
    TEST_FP_INT_D(100, 0xffffffffffffffff, NV, D_QNAN, 0, fcvt.lu.d a0, fa0, rtz)
    TEST_FP_INT_D(101, 0xffffffffffffffff, NV, 0x43f0000000000000, 0, fcvt.lu.d a0, fa0, rtz)

    /* ---- integer -> double */
    TEST_INT_FP_D(102, D_NONE, 0, -1, fcvt.d.w fa3, a1)
    TEST_INT_FP_D(103, 0xc1e0000000000000, 0, 0x80000000, fcvt.d.w fa3, a1)
    TEST_INT_FP_D(104, 0x41efffffffe00000, 0, 0xffffffff, fcvt.d.wu fa3, a1)
    TEST_INT_FP_D(105, 0x41efffffffe00000, 0, 0x12345678ffffffff, fcvt.d.wu fa3, a1)
    TEST_INT_FP_D(106, 0x4340000000000000, NX, 0x20000000000001, fcvt.d.l fa3, a1, rne)
    TEST_INT_FP_D(107, 0x4340000000000001, NX, 0x20000000000001, fcvt.d.l fa3, a1, rup)
    TEST_INT_FP_D(108, 0xc3e0000000000000, 0, 0x8000000000000000, fcvt.d.l fa3, a1)
    TEST_INT_FP_D(109, 0x43f0000000000000, NX, 0xffffffffffffffff, fcvt.d.lu fa3, a1)
    TEST_INT_FP_D(110, 0x43efffffffffffff, NX, 0xffffffffffffffff, fcvt.d.lu fa3, a1, rdn)
    TEST_INT_FP_D(111, D_ZERO, 0, 0, fcvt.d.lu fa3, a1)

    /* ---- moves, loads and stores */
    TEST_BEGIN(112); li a1, 0x123456789abcdef0; fmv.d.x fa0, a1; fmv.x.d a0, fa0
    ASSERT_EQ(a0, 0x123456789abcdef0)
    TEST_BEGIN(113); li a1, D_SNAN; fmv.d.x fa0, a1; fmv.x.d a0, fa0; ASSERT_EQ(a0, D_SNAN)
    TEST_BEGIN(114)
    la a1, ddata
    fld fa0, 0(a1)
    fmv.x.d a0, fa0
    ASSERT_EQ(a0, 0x400921fb54442d18)
    fsd fa0, 8(a1)
    ld a0, 8(a1)
    ASSERT_EQ(a0, 0x400921fb54442d18)
    TEST_BEGIN(115)                   /* fld/fsd move signaling NaNs unchanged */
    li a0, D_SNAN
    sd a0, 16(a1)
    csrw fflags, zero
    fld fa1, 16(a1)
    fsd fa1, 24(a1)
    ld a0, 24(a1)
    ASSERT_EQ(a0, D_SNAN)
    csrr a0, fflags
    ASSERT_EQ(a0, 0)
    TEST_BEGIN(116)                   /* fsw of a double register stores its low word */
    li a0, 0x0123456789abcdef
    fmv.d.x fa0, a0
    fsw fa0, 32(a1)
    lwu a0, 32(a1)
    ASSERT_EQ(a0, 0x89abcdef)

    PASS

    .data
    .balign 8
ddata:  .dword 0x400921fb54442d18, 0, 0, 0, 0
