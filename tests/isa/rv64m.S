# RV64M: multiply (low/high, signed/unsigned/mixed, W form) and divide /
# remainder including division by zero and INT_MIN / -1 overflow.
# Expected values were computed from the ISA definition (truncating
# division; x / 0 = all ones, x % 0 = x; INT_MIN / -1 = INT_MIN, rem 0).
#include "common.h"

    .text
test_main:
    /* ---- mul */
    TEST_RR(1, mul, 0x0, 0x0, 0x0)
    TEST_RR(2, mul, 0x15, 0x3, 0x7)
    TEST_RR(3, mul, 0x1, 0xffffffffffffffff, 0xffffffffffffffff)
    TEST_RR(4, mul, 0xfffffffffffffffe, 0x7fffffffffffffff, 0x2)
    TEST_RR(5, mul, 0x8000000000000000, 0x8000000000000000, 0xffffffffffffffff)
    TEST_RR(6, mul, 0x0, 0x100000000, 0x100000000)
    TEST_RR(7, mul, 0xd77d742cce1833a9, 0x123456789, 0x987654321)
    TEST_RR(8, mul, 0xfffffffffffffff1, 0xfffffffffffffffd, 0x5)
    /* ---- mulh */
    TEST_RR(9, mulh, 0x0, 0xffffffffffffffff, 0xffffffffffffffff)
    TEST_RR(10, mulh, 0xffffffffffffffff, 0xffffffffffffffff, 0x1)
    TEST_RR(11, mulh, 0x4000000000000000, 0x8000000000000000, 0x8000000000000000)
    TEST_RR(12, mulh, 0x3fffffffffffffff, 0x7fffffffffffffff, 0x7fffffffffffffff)
    TEST_RR(13, mulh, 0xc000000000000000, 0x8000000000000000, 0x7fffffffffffffff)
    TEST_RR(14, mulh, 0xffeb49923cc09532, 0x123456789abcdef0, 0xfedcba9876543210)
    TEST_RR(15, mulh, 0x0, 0x3, 0x5)
    /* ---- mulhsu */
    TEST_RR(16, mulhsu, 0xffffffffffffffff, 0xffffffffffffffff, 0xffffffffffffffff)
    TEST_RR(17, mulhsu, 0x1, 0x2, 0xffffffffffffffff)
    TEST_RR(18, mulhsu, 0x8000000000000000, 0x8000000000000000, 0xffffffffffffffff)
    TEST_RR(19, mulhsu, 0x121fa00ad77d7422, 0x123456789abcdef0, 0xfedcba9876543210)
    TEST_RR(20, mulhsu, 0xffffffffffffffff, 0xfffffffffffffffe, 0x1)
    TEST_RR(21, mulhsu, 0x3fffffffffffffff, 0x7fffffffffffffff, 0x8000000000000000)
    /* ---- mulhu */
    TEST_RR(22, mulhu, 0xfffffffffffffffe, 0xffffffffffffffff, 0xffffffffffffffff)
    TEST_RR(23, mulhu, 0x1, 0x8000000000000000, 0x2)
    TEST_RR(24, mulhu, 0x121fa00ad77d7422, 0x123456789abcdef0, 0xfedcba9876543210)
    TEST_RR(25, mulhu, 0x0, 0x5, 0x7)
    TEST_RR(26, mulhu, 0x0, 0xffffffff, 0xffffffff)
    /* ---- mulw */
    TEST_RR(27, mulw, 0xfffffffffffffffe, 0x7fffffff, 0x2)
    TEST_RR(28, mulw, 0xf, 0x100000003, 0x100000005)
    TEST_RR(29, mulw, 0x0, 0x10000, 0x10000)
    TEST_RR(30, mulw, 0x1, 0xffffffff, 0xffffffff)
    TEST_RR(31, mulw, 0xffffffff80000000, 0x8000, 0x10000)
    TEST_RR(32, mulw, 0xfffffffffffffff1, 0xfffffffffffffffd, 0x5)
    /* ---- div */
    TEST_RR(33, div, 0x3, 0x14, 0x6)
    TEST_RR(34, div, 0xfffffffffffffffd, 0xffffffffffffffec, 0x6)
    TEST_RR(35, div, 0xfffffffffffffffd, 0x14, 0xfffffffffffffffa)
    TEST_RR(36, div, 0x3, 0xffffffffffffffec, 0xfffffffffffffffa)
    TEST_RR(37, div, 0xffffffffffffffff, 0x14, 0x0)
    TEST_RR(38, div, 0x8000000000000000, 0x8000000000000000, 0xffffffffffffffff)
    TEST_RR(39, div, 0xffffffffffffffff, 0x0, 0x0)
    TEST_RR(40, div, 0x8000000000000000, 0x8000000000000000, 0x1)
    TEST_RR(41, div, 0x0, 0x5, 0x7)
    /* ---- divu */
    TEST_RR(42, divu, 0x3, 0x14, 0x6)
    TEST_RR(43, divu, 0x2aaaaaaaaaaaaaa7, 0xffffffffffffffec, 0x6)
    TEST_RR(44, divu, 0xffffffffffffffff, 0x14, 0x0)
    TEST_RR(45, divu, 0x0, 0x8000000000000000, 0xffffffffffffffff)
    TEST_RR(46, divu, 0xffffffffffffffff, 0xffffffffffffffff, 0x1)
    TEST_RR(47, divu, 0xffffffffffffffff, 0x0, 0x0)
    /* ---- rem */
    TEST_RR(48, rem, 0x2, 0x14, 0x6)
    TEST_RR(49, rem, 0xfffffffffffffffe, 0xffffffffffffffec, 0x6)
    TEST_RR(50, rem, 0x2, 0x14, 0xfffffffffffffffa)
    TEST_RR(51, rem, 0xfffffffffffffffe, 0xffffffffffffffec, 0xfffffffffffffffa)
    TEST_RR(52, rem, 0x14, 0x14, 0x0)
    TEST_RR(53, rem, 0xffffffffffffffec, 0xffffffffffffffec, 0x0)
    TEST_RR(54, rem, 0x0, 0x8000000000000000, 0xffffffffffffffff)
    TEST_RR(55, rem, 0x0, 0x8000000000000000, 0x2)
    /* ---- remu */
    TEST_RR(56, remu, 0x2, 0x14, 0x6)
    TEST_RR(57, remu, 0x2, 0xffffffffffffffec, 0x6)
    TEST_RR(58, remu, 0x14, 0x14, 0x0)
    TEST_RR(59, remu, 0xffffffffffffffff, 0xffffffffffffffff, 0x0)
    TEST_RR(60, remu, 0x8000000000000000, 0x8000000000000000, 0xffffffffffffffff)
    /* ---- divw */
    TEST_RR(61, divw, 0x3, 0x14, 0x6)
    TEST_RR(62, divw, 0xfffffffffffffffd, 0xffffffffffffffec, 0x6)
    TEST_RR(63, divw, 0xffffffff80000000, 0x80000000, 0xffffffffffffffff)
    TEST_RR(64, divw, 0xffffffffffffffff, 0x14, 0x0)
    TEST_RR(65, divw, 0x3, 0x100000014, 0x6)
    TEST_RR(66, divw, 0x3, 0xffffffffffffffec, 0xfffffffffffffffa)
    TEST_RR(67, divw, 0xffffffff80000001, 0x7fffffff, 0xffffffffffffffff)
    /* ---- divuw */
    TEST_RR(68, divuw, 0x2aaaaaa7, 0xffffffec, 0x6)
    TEST_RR(69, divuw, 0xffffffffffffffff, 0x14, 0x0)
    TEST_RR(70, divuw, 0xffffffff80000000, 0x80000000, 0x1)
    TEST_RR(71, divuw, 0x7fffffff, 0x1fffffffe, 0x2)
    TEST_RR(72, divuw, 0x2aaaaaa7, 0xffffffffffffffec, 0x6)
    /* ---- remw */
    TEST_RR(73, remw, 0xfffffffffffffffe, 0xffffffffffffffec, 0x6)
    TEST_RR(74, remw, 0x2, 0x14, 0xfffffffffffffffa)
    TEST_RR(75, remw, 0x0, 0x80000000, 0xffffffffffffffff)
    TEST_RR(76, remw, 0x14, 0x14, 0x0)
    TEST_RR(77, remw, 0xffffffff80000000, 0x180000000, 0x0)
    TEST_RR(78, remw, 0x2, 0x100000014, 0x6)
    /* ---- remuw */
    TEST_RR(79, remuw, 0x2, 0xffffffec, 0x6)
    TEST_RR(80, remuw, 0x14, 0x14, 0x0)
    TEST_RR(81, remuw, 0xffffffff80000005, 0x80000005, 0x0)
    TEST_RR(82, remuw, 0x2, 0x1fffffffe, 0x100000007)
    /* ---- register aliasing */
    TEST_RR_SRC1_EQ_DEST(83, mul, 143, 13, 11)
    TEST_RR_SRC2_EQ_DEST(84, div, 7, 77, 11)
    TEST_RR_SRC12_EQ_DEST(85, mulhu, 1, 0x100000000)
    TEST_RR_SRC12_EQ_DEST(86, rem, 0, -77)
    TEST_RR_ZERODEST(87, divu, 77, 11)
    TEST_RR_SRC1_EQ_DEST(88, remw, 0xfffffffffffffffe, -20, 6)
    PASS
