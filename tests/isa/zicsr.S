# Zicsr: csrrw/csrrs/csrrc and their immediate forms (old value returned,
# rs1 = x0 / uimm = 0 do not write), read-only CSRs trap on writes,
# unknown CSRs trap, misa = RV64 with I M A F D C S U, mstatus.SXL/UXL,
# mhartid and the boot registers, sstatus/sie as views of mstatus/mie,
# mtvec vectored mode, counter enables for S and U mode.
#include "common.h"

#define MISA_BIT(c) (1 << ((c) - 'A'))

    .text
test_main:
    /* ---- read/modify/write forms on mscratch (no traps until restored) */
    TEST_BEGIN(1); li a1, 0x1234; csrw mscratch, a1; li a2, 0xff00ff00ff00ff00
    csrrw a0, mscratch, a2; ASSERT_EQ(a0, 0x1234)
    csrr a0, mscratch; ASSERT_EQ(a0, 0xff00ff00ff00ff00)
    TEST_BEGIN(2); li a2, 0x0f; csrrs a0, mscratch, a2; ASSERT_EQ(a0, 0xff00ff00ff00ff00)
    csrr a0, mscratch; ASSERT_EQ(a0, 0xff00ff00ff00ff0f)
    TEST_BEGIN(3); li a2, 0xff00000000000003; csrrc a0, mscratch, a2; ASSERT_EQ(a0, 0xff00ff00ff00ff0f)
    csrr a0, mscratch; ASSERT_EQ(a0, 0x0000ff00ff00ff0c)
    TEST_BEGIN(4); csrrwi a0, mscratch, 31; ASSERT_EQ(a0, 0x0000ff00ff00ff0c)
    csrr a0, mscratch; ASSERT_EQ(a0, 31)
    TEST_BEGIN(5); csrrci a0, mscratch, 5; ASSERT_EQ(a0, 31)
    csrr a0, mscratch; ASSERT_EQ(a0, 26)
    TEST_BEGIN(6); csrrsi a0, mscratch, 0x11; ASSERT_EQ(a0, 26)
    csrr a0, mscratch; ASSERT_EQ(a0, 27)
    TEST_BEGIN(7); csrrs a0, mscratch, x0; ASSERT_EQ(a0, 27)     /* read only */
    csrrc a0, mscratch, x0; ASSERT_EQ(a0, 27)
    csrrsi a0, mscratch, 0; csrrci a0, mscratch, 0
    csrr a0, mscratch; ASSERT_EQ(a0, 27)
    TEST_BEGIN(8); li a0, 99; csrrw a0, mscratch, a0; ASSERT_EQ(a0, 27)   /* rd == rs1 */
    csrr a0, mscratch; ASSERT_EQ(a0, 99)
    TEST_BEGIN(9); li a1, 5; csrrw x0, mscratch, a1; csrr a0, mscratch; ASSERT_EQ(a0, 5)
    TEST_BEGIN(10); csrrwi x0, mscratch, 0; csrr a0, mscratch; ASSERT_EQ(a0, 0)
    la t0, trap_area                /* the trap handler needs mscratch back */
    csrw mscratch, t0

    /* ---- read-only CSRs: reads are fine, writes trap */
    TEST_BEGIN(11); csrr a0, mhartid; ASSERT_EQ(a0, 0)
    TEST_BEGIN(12); csrr a0, mvendorid; csrr a0, marchid; csrr a0, mimpid
    csrrs a0, mhartid, x0; csrrsi a0, mvendorid, 0; csrrci a0, marchid, 0; ASSERT_EQ(x0, 0)
    TEST_TRAP(13, CAUSE_ILLEGAL, csrw mhartid, zero)
    TEST_BEGIN(14); TRAP_FIELD(a0, TA_EPC); lwu a1, 0(a0); ASSERT_TVAL_REG(a1)
    TEST_TRAP(15, CAUSE_ILLEGAL, csrrwi a0, mvendorid, 1)
    /* (csrrs with rs1 != x0 holding zero is a write by the spec and should
       trap on a read-only CSR, but QEMU 7.2 decides by the value: not checked) */
    li a1, 1
    TEST_TRAP(16, CAUSE_ILLEGAL, csrrs a0, mimpid, a1)
    TEST_TRAP(17, CAUSE_ILLEGAL, csrrci a0, marchid, 1)
    TEST_TRAP(18, CAUSE_ILLEGAL, csrw cycle, zero)
    TEST_TRAP(19, CAUSE_ILLEGAL, csrw time, zero)
    TEST_TRAP(20, CAUSE_ILLEGAL, csrrsi a0, instret, 1)
    TEST_TRAP(21, CAUSE_ILLEGAL, csrrc a0, mconfigptr, a1)
    /* ---- unknown CSR numbers trap, for reads and writes */
    TEST_TRAP(22, CAUSE_ILLEGAL, csrr a0, 0x0ff)
    TEST_TRAP(23, CAUSE_ILLEGAL, csrr a0, 0x1ff)
    TEST_TRAP(24, CAUSE_ILLEGAL, csrw 0x3ff, a0)
    TEST_TRAP(25, CAUSE_ILLEGAL, csrr a0, 0x5ff)
    TEST_TRAP(26, CAUSE_ILLEGAL, csrrs a0, 0xfff, x0)
    TEST_TRAP(27, CAUSE_ILLEGAL, csrr a0, pmpcfg1)       /* odd pmpcfg: RV32 only */
    TEST_BEGIN(28); TRAP_FIELD(a0, TA_EPC); lwu a1, 0(a0); ASSERT_TVAL_REG(a1)

    /* ---- misa, mstatus.SXL/UXL */
    TEST_BEGIN(29); csrr a0, misa; srli a0, a0, 62; ASSERT_EQ(a0, 2)
    TEST_BEGIN(30); csrr a0, misa
    li a1, MISA_BIT('I') | MISA_BIT('M') | MISA_BIT('A') | MISA_BIT('F') | MISA_BIT('D') | MISA_BIT('C') | MISA_BIT('S') | MISA_BIT('U')
    and a0, a0, a1; ASSERT_EQ_REG(a0, a1)
    TEST_BEGIN(31); csrr a0, misa; andi a0, a0, MISA_BIT('E'); ASSERT_EQ(a0, 0)
    TEST_BEGIN(32); csrr a0, mstatus; srli a0, a0, 32; andi a0, a0, 0xf; ASSERT_EQ(a0, 0xa)

    /* ---- boot registers: a0 = hart id, a1 = a flattened device tree */
    TEST_BEGIN(33); TRAP_FIELD(a0, TA_BOOT_A0); ASSERT_EQ(a0, 0)
    TEST_BEGIN(34); TRAP_FIELD(a1, TA_BOOT_A1); beqz a1, fail
    lwu a0, 0(a1); ASSERT_EQ(a0, 0xedfe0dd0)            /* magic d0 0d fe ed */

    /* ---- sstatus and sie are restricted views */
    TEST_BEGIN(35)
    li t0, MSTATUS_SIE | MSTATUS_MIE | MSTATUS_SPIE | MSTATUS_MPIE
    csrc mstatus, t0
    csrsi sstatus, MSTATUS_SIE
    csrr a0, mstatus; andi a0, a0, MSTATUS_SIE | MSTATUS_MIE; ASSERT_EQ(a0, MSTATUS_SIE)
    TEST_BEGIN(36)
    li t0, MSTATUS_MPIE
    csrs mstatus, t0
    csrr a0, sstatus; andi a0, a0, MSTATUS_MPIE | MSTATUS_MIE | MSTATUS_SIE; ASSERT_EQ(a0, MSTATUS_SIE)
    TEST_BEGIN(37)                   /* sstatus writes do not reach M-only bits */
    li t0, MSTATUS_MIE
    csrs sstatus, t0
    csrr a0, mstatus; andi a0, a0, MSTATUS_MIE; ASSERT_EQ(a0, 0)
    li t0, MSTATUS_SIE | MSTATUS_MPIE
    csrc mstatus, t0
    TEST_BEGIN(38)                   /* sie: only delegated bits are visible */
    csrw mideleg, zero
    csrw mie, zero
    li t0, 0x222
    csrw sie, t0
    csrr a0, sie; ASSERT_EQ(a0, 0)
    csrr a0, mie; ASSERT_EQ(a0, 0)
    TEST_BEGIN(39)
    li t0, 0x222
    csrw mideleg, t0
    csrw sie, t0
    csrr a0, sie; ASSERT_EQ(a0, 0x222)
    csrr a0, mie; ASSERT_EQ(a0, 0x222)
    li t0, 0x888                    /* M-level bits through mie only */
    csrs mie, t0
    csrr a0, sie; ASSERT_EQ(a0, 0x222)
    csrw mie, zero
    csrw mideleg, zero

    /* ---- mtvec keeps vectored mode */
    TEST_BEGIN(40)
    csrr s0, mtvec
    la a1, trap_m
    ori a1, a1, 1
    csrw mtvec, a1
    csrr a0, mtvec
    csrw mtvec, s0
    ASSERT_EQ_REG(a0, a1)

    /* ---- counter enables: S needs mcounteren, U needs both */
    TEST_BEGIN(41)
    csrw mcounteren, zero
    csrw scounteren, zero
    SET_RESUME(1f)
    GOTO_MODE(MODE_S, 2f)
2:  csrr a0, cycle
    j fail
1:  ASSERT_TRAP(CAUSE_ILLEGAL)
    TEST_BEGIN(42)
    SET_RESUME(1f)
    GOTO_MODE(MODE_S, 2f)
2:  csrr a0, instret
    j fail
1:  ASSERT_TRAP(CAUSE_ILLEGAL)
    TEST_BEGIN(43)
    li t0, 7
    csrw mcounteren, t0
    GOTO_MODE(MODE_S, 2f)
2:  csrr a0, cycle
    csrr a0, time
    csrr a0, instret
    BACK_TO_M
    ASSERT_TRAP(CAUSE_ECALL_S)
    TEST_BEGIN(44)                   /* U with scounteren = 0 */
    SET_RESUME(1f)
    GOTO_MODE(MODE_U, 2f)
2:  csrr a0, time
    j fail
1:  ASSERT_TRAP(CAUSE_ILLEGAL)
    TEST_BEGIN(45)                   /* U with only the TM bit in scounteren */
    csrwi scounteren, 2
    GOTO_MODE(MODE_U, 2f)
2:  csrr a0, time
    BACK_TO_M
    ASSERT_TRAP(CAUSE_ECALL_U)
    TEST_BEGIN(46)
    SET_RESUME(1f)
    GOTO_MODE(MODE_U, 2f)
2:  csrr a0, cycle
    j fail
1:  ASSERT_TRAP(CAUSE_ILLEGAL)
    TEST_BEGIN(47)                   /* U with scounteren but not mcounteren */
    csrwi mcounteren, 3
    csrwi scounteren, 7
    SET_RESUME(1f)
    GOTO_MODE(MODE_U, 2f)
2:  csrr a0, instret
    j fail
1:  ASSERT_TRAP(CAUSE_ILLEGAL)
    TEST_BEGIN(48)                   /* M-mode counters are never readable below M */
    csrwi mcounteren, 7
    SET_RESUME(1f)
    GOTO_MODE(MODE_S, 2f)
2:  csrr a0, mcycle
    j fail
1:  ASSERT_TRAP(CAUSE_ILLEGAL)
    TEST_BEGIN(49)
    SET_RESUME(1f)
    GOTO_MODE(MODE_U, 2f)
2:  csrr a0, sscratch
    j fail
1:  ASSERT_TRAP(CAUSE_ILLEGAL)

    PASS
