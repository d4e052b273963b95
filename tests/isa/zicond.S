# Zicond: czero.eqz and czero.nez (written with .insn: the cross
# assembler of Debian 12 predates Zicond).
#include "common.h"

/* czero.eqz rd, rs1, rs2 = OP, funct3 5, funct7 7; czero.nez: funct3 7 */
.macro czero_eqz rd, rs1, rs2
    .insn r 0x33, 5, 7, \rd, \rs1, \rs2
.endm
.macro czero_nez rd, rs1, rs2
    .insn r 0x33, 7, 7, \rd, \rs1, \rs2
.endm

    .text
test_main:
    TEST_RR(1, czero_eqz, 0x0, 42, 0)
    TEST_RR(2, czero_eqz, 42, 42, 0x8000000000000000)
    TEST_RR(3, czero_eqz, 0xffffffffffffffff, 0xffffffffffffffff, 1)
    TEST_RR(4, czero_nez, 42, 42, 0)
    TEST_RR(5, czero_nez, 0x0, 42, 0xffffffffffffffff)
    TEST_RR(6, czero_nez, 0x0, 0xffffffffffffffff, 0x100000000)
    TEST_RR_SRC12_EQ_DEST(7, czero_eqz, 0x5, 0x5)
    TEST_RR_SRC12_EQ_DEST(8, czero_nez, 0x0, 0x5)
    TEST_RR_ZERODEST(9, czero_nez, 0x1, 0x0)
    PASS
