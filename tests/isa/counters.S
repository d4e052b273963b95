# qemu-args: -icount shift=0
# Zicntr: cycle, time and instret. instret must advance by exactly the
# number of instructions retired between two reads of a straight-line (or
# looping) sequence. Plain QEMU derives instret from the host clock, so
# run-on-qemu.sh passes the qemu-args line above (instruction counting);
# ftvm counts retired instructions exactly and needs nothing.
#include "common.h"

    .text
test_main:
    /* ---- instret: exact deltas */
    TEST_BEGIN(1)
    csrr a0, instret
    csrr a1, instret
    sub a2, a1, a0
    ASSERT_EQ(a2, 1)
    TEST_BEGIN(2)
    csrr a0, instret
    nop
    nop
    nop
    nop
    nop
    csrr a1, instret
    sub a2, a1, a0
    ASSERT_EQ(a2, 6)
    TEST_BEGIN(3)                   /* loads, stores, mul, div, taken branches, jal */
    la a3, cdata
    csrr a0, instret
    ld a4, 0(a3)
    sd a4, 8(a3)
    mul a4, a4, a4
    divu a4, a4, a3
    beqz zero, 1f
    nop
1:  jal a5, 2f
2:  csrr a1, instret
    sub a2, a1, a0
    ASSERT_EQ(a2, 7)
    TEST_BEGIN(4)                   /* a loop: 1 + 10 * 2 instructions */
    li a4, 10
    csrr a0, instret
    li a5, 0
1:  addi a4, a4, -1
    bnez a4, 1b
    csrr a1, instret
    sub a2, a1, a0
    ASSERT_EQ(a2, 22)
    TEST_BEGIN(5)                   /* compressed instructions count as one each */
    csrr a0, instret
    .option rvc
    c.nop
    c.addi a4, 1
    c.mv a5, a4
    .option norvc
    csrr a1, instret
    sub a2, a1, a0
    ASSERT_EQ(a2, 4)
    TEST_BEGIN(6)                   /* FP and CSR instructions */
    csrr a0, instret
    fmv.d.x fa0, zero
    fadd.d fa1, fa0, fa0
    csrr a4, fflags
    csrr a1, instret
    sub a2, a1, a0
    ASSERT_EQ(a2, 4)
    TEST_BEGIN(7)                   /* minstret is the same counter */
    csrr a0, minstret
    csrr a1, instret
    sub a2, a1, a0
    ASSERT_EQ(a2, 1)
    TEST_BEGIN(8)                   /* a write replaces the increment of the writing
                                       instruction: the next read sees the value
                                       written (the spec), QEMU 7.2 shows one more */
    li a4, 1000
    csrw minstret, a4
    csrr a0, minstret
    ASSERT_EQ2(a0, 1000, 1001)
    TEST_BEGIN(9)
    csrr a0, instret
    nop
    csrr a1, instret
    sub a2, a1, a0
    ASSERT_EQ(a2, 2)

    /* ---- cycle: readable, moves forward, mcycle is writable */
    TEST_BEGIN(10)
    csrr a0, cycle
    li a4, 100
1:  addi a4, a4, -1
    bnez a4, 1b
    csrr a1, cycle
    ASSERT_GTU_REG(a1, a0)
    TEST_BEGIN(11)
    csrr a0, mcycle
    csrr a1, cycle
    ASSERT_LEU_REG(a0, a1)
    TEST_BEGIN(12)
    csrw mcycle, zero
    csrr a0, mcycle
    li a1, 1000
    ASSERT_LEU_REG(a0, a1)

    /* ---- time: the CLINT's mtime, and it advances */
    TEST_BEGIN(13)
    li a3, CLINT_MTIME
    ld a0, 0(a3)
    csrr a1, time
    ld a2, 0(a3)
    ASSERT_LEU_REG(a0, a1)
    ASSERT_LEU_REG(a1, a2)
    TEST_BEGIN(14)                   /* 100 ticks (10 us) pass within 10^6 iterations */
    csrr a0, time
    addi a0, a0, 100
    li a4, 1000000
1:  csrr a1, time
    bgeu a1, a0, 2f
    addi a4, a4, -1
    bnez a4, 1b
    j fail
2:  ASSERT_EQ(x0, 0)

    PASS

    .data
    .balign 8
cdata:  .dword 12345, 0
