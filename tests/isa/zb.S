# march: rv64gc_zba_zbb_zbs
# Zba, Zbb, Zbs: every RV64 instruction, with the word forms' shift
# amounts at and above 32 and the edge operands 0, all ones and the sign
# bits. Expected values are worked out from the ratified bitmanip
# specification's definitions.
#include "common.h"

#define TEST_R(n, op, exp, a) \
    TEST_BEGIN(n); li a1, a; op a0, a1; ASSERT_EQ(a0, exp)

    .text
test_main:
    /* ---- Zba */
    TEST_RR(1, sh1add, 0x7, 0x2, 0x3)
    TEST_RR(2, sh2add, 0xfffffffffffffffc, 0xffffffffffffffff, 0x0)
    TEST_RR(3, sh3add, 0x5, 0x8000000000000000, 0x5)
    TEST_RR(4, add.uw, 0x100000000, 0xffffffffffffffff, 0x1)
    TEST_RR(5, sh1add.uw, 0x100000000, 0xffffffff80000000, 0x0)
    TEST_RR(6, sh2add.uw, 0x3fffffffd, 0xffffffffffffffff, 0x1)
    TEST_RR(7, sh3add.uw, 0x7fffffff8, 0x12345678ffffffff, 0x0)
    TEST_RI(8, slli.uw, 0xffffffff, 0xffffffffffffffff, 0)
    TEST_RI(9, slli.uw, 0xffffffff00000000, 0xffffffffffffffff, 32)
    TEST_RI(10, slli.uw, 0x8000000000000000, 0xffffffff, 63)
    TEST_RR_SRC12_EQ_DEST(11, sh1add, 0x9, 0x3)
    /* ---- Zbb: logic with negate */
    TEST_RR(12, andn, 0xf000, 0xff00, 0x0ff0)
    TEST_RR(13, orn, 0xffffffffffffffff, 0x0, 0x0)
    TEST_RR(14, xnor, 0xfffffffffffffff0, 0xf0, 0xff)
    /* counts */
    TEST_R(15, clz, 64, 0x0)
    TEST_R(16, clz, 0, 0x8000000000000000)
    TEST_R(17, ctz, 64, 0x0)
    TEST_R(18, ctz, 63, 0x8000000000000000)
    TEST_R(19, cpop, 64, 0xffffffffffffffff)
    TEST_R(20, clzw, 32, 0xffffffff00000000)
    TEST_R(21, clzw, 31, 0x1)
    TEST_R(22, ctzw, 32, 0xffffffff00000000)
    TEST_R(23, ctzw, 31, 0xffffffff80000000)
    TEST_R(24, cpopw, 32, 0xffffffffffffffff)
    TEST_R(25, cpopw, 0, 0xffffffff00000000)
    /* min / max */
    TEST_RR(26, min, 0xffffffffffffffff, 0xffffffffffffffff, 0x1)
    TEST_RR(27, minu, 0x1, 0xffffffffffffffff, 0x1)
    TEST_RR(28, max, 0x0, 0x8000000000000000, 0x0)
    TEST_RR(29, maxu, 0x8000000000000000, 0x8000000000000000, 0x0)
    /* extensions */
    TEST_R(30, sext.b, 0xffffffffffffff80, 0x80)
    TEST_R(31, sext.b, 0x7f, 0xffffff7f)
    TEST_R(32, sext.h, 0xffffffffffff8000, 0x18000)
    TEST_R(33, zext.h, 0xffff, 0xffffffffffffffff)
    /* rotates: amounts mod 64 (word forms: mod 32) */
    TEST_RR(34, rol, 0x3, 0x8000000000000001, 1)
    TEST_RR(35, rol, 0x1234, 0x1234, 64)
    TEST_RR(36, ror, 0x4000000000000123, 0x1234, 68)
    TEST_RI(37, rori, 0x100000000, 0x1, 32)
    TEST_RI(38, rori, 0x1, 0x8000000000000000, 63)
    TEST_RR(39, rolw, 0x3, 0x80000001, 1)
    TEST_RR(40, rolw, 0x1, 0xffffffff00000001, 32)
    TEST_RR(41, rorw, 0xffffffff80000000, 0x1, 33)
    TEST_RI(42, roriw, 0x1, 0xffffffff80000000, 31)
    TEST_RI(43, roriw, 0x7fffffff, 0x17fffffff, 0)
    /* bytes */
    TEST_R(44, orc.b, 0xff00ff00ff0000ff, 0x0100800070000001)
    TEST_R(45, orc.b, 0x0, 0x0)
    TEST_R(46, rev8, 0x0807060504030201, 0x0102030405060708)
    /* ---- Zbs: the index mod 64 */
    TEST_RR(47, bclr, 0x7fffffffffffffff, 0xffffffffffffffff, 63)
    TEST_RR(48, bclr, 0xfffffffffffffffe, 0xffffffffffffffff, 64)
    TEST_RR(49, bset, 0x100000000, 0x0, 32)
    TEST_RR(50, binv, 0x0, 0x8000000000000000, 127)
    TEST_RR(51, bext, 0x1, 0x8000000000000000, 63)
    TEST_RR(52, bext, 0x0, 0x8000000000000000, 62)
    TEST_RI(53, bclri, 0x7fffffffffffffff, 0xffffffffffffffff, 63)
    TEST_RI(54, bseti, 0x10000000000, 0x0, 40)
    TEST_RI(55, binvi, 0xfffffffffffffffe, 0xffffffffffffffff, 0)
    TEST_RI(56, bexti, 0x1, 0x100000000, 32)
    TEST_RR_ZERODEST(57, andn, 0x1, 0x2)
    PASS
