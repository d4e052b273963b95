# Sstc: menvcfg.STCE, stimecmp in M-mode and (with STCE and mcounteren.TM)
# S-mode, STIP following time >= stimecmp and read-only in mip while STCE
# is set, the interrupt taken when it fires and WFI woken by it; with STCE
# clear, stimecmp is illegal below M-mode and STIP is software's again.
#include "common.h"

#define STIMECMP 0x14d
#define MENVCFG  0x30a
#define STIP     (1 << IRQ_STI)

#define WAIT_MIP(mask, value) \
    li t2, 10000000; \
    7790: csrr t0, mip; li t1, mask; and t0, t0, t1; li t1, value; beq t0, t1, 7791f; \
    addi t2, t2, -1; bnez t2, 7790b; li t5, 0; li t6, 1; j fail; 7791: MUTATE_FAIL
#define SPIN_FOR_TRAP \
    li t0, CLINT_MTIME; ld t2, 0(t0); li t1, 5000000; add t2, t2, t1; \
    7792: ld t1, 0(t0); bltu t1, t2, 7792b; li t5, 0; li t6, 1; j fail
#define STCE_ON  li t0, 1; slli t0, t0, 63; csrs MENVCFG, t0
#define STCE_OFF li t0, 1; slli t0, t0, 63; csrc MENVCFG, t0

    .text
test_main:
    csrw mie, zero
    csrci mstatus, MSTATUS_MIE
    TEST_BEGIN(1)                   /* STCE is writable */
    STCE_ON
    csrr a0, MENVCFG; srli a0, a0, 63; ASSERT_EQ(a0, 1)
    TEST_BEGIN(2)
    li t0, -1; csrw STIMECMP, t0
    csrr a0, STIMECMP; ASSERT_EQ(a0, -1)
    TEST_BEGIN(3); WAIT_MIP(STIP, 0)
    TEST_BEGIN(4)                   /* a stimecmp passed: STIP */
    csrw STIMECMP, zero; WAIT_MIP(STIP, STIP)
    TEST_BEGIN(5)                   /* read-only in mip while STCE is set */
    li t0, STIP; csrc mip, t0
    csrr a0, mip; andi a0, a0, STIP; ASSERT_EQ(a0, STIP)
    TEST_BEGIN(6); li t0, -1; csrw STIMECMP, t0; WAIT_MIP(STIP, 0)
    TEST_BEGIN(7)                   /* STIP at stimecmp, not before */
    csrr s2, time; addi s2, s2, 1000; csrw STIMECMP, s2
    csrr a0, mip; andi a0, a0, STIP; ASSERT_EQ(a0, 0)
    WAIT_MIP(STIP, STIP)
    csrr a1, time; ASSERT_LEU_REG(s2, a1)
    TEST_BEGIN(8)                   /* the interrupt, taken in M (not delegated) */
    li t0, -1; csrw STIMECMP, t0
    SET_RESUME(1f)
    csrr s2, time; addi s2, s2, 100; csrw STIMECMP, s2
    li t0, STIP; csrw mie, t0
    csrsi mstatus, MSTATUS_MIE
    SPIN_FOR_TRAP
1:  csrci mstatus, MSTATUS_MIE
    ASSERT_TRAP(INTR | IRQ_STI)
    csrr a1, time; ASSERT_LEU_REG(s2, a1)
    TEST_BEGIN(9)                   /* WFI wakes at stimecmp */
    li t0, -1; csrw STIMECMP, t0
    csrr s2, time; li t0, 2000; add s2, s2, t0; csrw STIMECMP, s2
    li t0, STIP; csrw mie, t0
2:  wfi
    csrr a0, mip; andi a0, a0, STIP; beqz a0, 2b
    csrr a1, time; ASSERT_LEU_REG(s2, a1)
    csrw mie, zero
    TEST_BEGIN(10)                  /* S-mode with STCE and TM */
    li t0, 1234; csrw STIMECMP, t0
    csrsi mcounteren, 2
    GOTO_MODE(MODE_S, 3f)
3:  csrr a0, STIMECMP
    BACK_TO_M
    ASSERT_EQ(a0, 1234)
    TEST_BEGIN(11)                  /* S-mode without TM: illegal */
    csrci mcounteren, 2
    SET_RESUME(5f)
    GOTO_MODE(MODE_S, 4f)
4:  csrr a0, STIMECMP
    j fail
5:  ASSERT_TRAP(CAUSE_ILLEGAL)
    TEST_BEGIN(12)                  /* S-mode without STCE: illegal */
    csrsi mcounteren, 2
    STCE_OFF
    SET_RESUME(7f)
    GOTO_MODE(MODE_S, 6f)
6:  csrw STIMECMP, zero
    j fail
7:  ASSERT_TRAP(CAUSE_ILLEGAL)
    TEST_BEGIN(13)                  /* STCE clear: STIP is software's again */
    li t0, STIP; csrs mip, t0
    csrr a0, mip; andi a0, a0, STIP; ASSERT_EQ(a0, STIP)
    li t0, STIP; csrc mip, t0
    csrr a0, mip; andi a0, a0, STIP; ASSERT_EQ(a0, 0)
    PASS
