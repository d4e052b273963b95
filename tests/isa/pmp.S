# PMP, as far as every WARL implementation must agree: M-mode runs with no
# PMP entry active; pmpaddr/pmpcfg read back what was written (or zero if
# PMP is not implemented); S and U mode run, load and store under a TOR
# entry and under a NAPOT entry covering RAM; odd pmpcfg CSRs do not exist
# on RV64. Enforcement (an access outside every entry failing in S/U) is
# not tested.
#include "common.h"

#define RAM_BASE 0x80000000
#define RAM_TOP  0x88000000         /* 128 MiB */

/* read back: the value written, or 0 when PMP is not implemented */
#define ASSERT_WARL(reg, val) \
    beqz reg, 7795f; ASSERT_EQ(reg, val); 7795:

    .text
test_main:
    /* ---- M-mode with every entry off */
    TEST_BEGIN(1)
    csrw pmpcfg0, zero
    csrw pmpcfg2, zero
    csrr a0, pmpcfg0
    ASSERT_EQ(a0, 0)
    TEST_BEGIN(2)                   /* load, store, fetch, a device */
    la a1, pdata
    li a0, 0x1234
    sd a0, 0(a1)
    ld a2, 0(a1)
    ASSERT_EQ(a2, 0x1234)
    call func
    ASSERT_EQ(a0, 77)
    li a1, UART_BASE
    lbu a0, 5(a1)
    ASSERT_EQ(x0, 0)

    /* ---- TOR entry [0, RAM_TOP) */
    TEST_BEGIN(3)
    li a1, RAM_TOP >> 2
    csrw pmpaddr0, a1
    csrr a0, pmpaddr0
    ASSERT_WARL(a0, RAM_TOP >> 2)
    TEST_BEGIN(4)
    li a1, 0x0f                     /* TOR, R W X */
    csrw pmpcfg0, a1
    csrr a0, pmpcfg0
    ASSERT_WARL(a0, 0x0f)
    TEST_BEGIN(5)                   /* S-mode: fetch, load, store */
    GOTO_MODE(MODE_S, 1f)
1:  la a1, pdata
    li a0, 0x55
    sd a0, 8(a1)
    ld a2, 8(a1)
    call func
    BACK_TO_M
    ASSERT_TRAP(CAUSE_ECALL_S)
    ASSERT_EQ(a2, 0x55)
    ASSERT_EQ(a0, 77)
    TEST_BEGIN(6)                   /* U-mode */
    GOTO_MODE(MODE_U, 1f)
1:  la a1, pdata
    li a0, 0x66
    sd a0, 16(a1)
    ld a2, 16(a1)
    call func
    BACK_TO_M
    ASSERT_TRAP(CAUSE_ECALL_U)
    ASSERT_EQ(a2, 0x66)
    ASSERT_EQ(a0, 77)

    /* ---- NAPOT entry over RAM */
    TEST_BEGIN(7)
    csrw pmpcfg0, zero
    li a1, (RAM_BASE >> 2) | (((RAM_TOP - RAM_BASE) >> 3) - 1)
    csrw pmpaddr0, a1
    li a1, 0x1f                     /* NAPOT, R W X */
    csrw pmpcfg0, a1
    csrr a0, pmpcfg0
    ASSERT_WARL(a0, 0x1f)
    TEST_BEGIN(8)                   /* read while NAPOT: exact for any granularity
                                       up to the 128 MiB region */
    csrr a0, pmpaddr0
    ASSERT_WARL(a0, (RAM_BASE >> 2) | (((RAM_TOP - RAM_BASE) >> 3) - 1))
    TEST_BEGIN(9)
    GOTO_MODE(MODE_S, 1f)
1:  la a1, pdata
    li a0, 0x77
    sd a0, 24(a1)
    ld a2, 24(a1)
    call func
    BACK_TO_M
    ASSERT_TRAP(CAUSE_ECALL_S)
    ASSERT_EQ(a2, 0x77)
    ASSERT_EQ(a0, 77)
    TEST_BEGIN(10)
    GOTO_MODE(MODE_U, 1f)
1:  la a1, pdata
    li a0, 0x88
    sd a0, 32(a1)
    ld a2, 32(a1)
    call func
    BACK_TO_M
    ASSERT_TRAP(CAUSE_ECALL_U)
    ASSERT_EQ(a2, 0x88)
    ASSERT_EQ(a0, 77)

    /* ---- a second entry and the upper configuration register */
    TEST_BEGIN(11)
    li a1, 0x12340000               /* aligned: exact for granularity up to 256 KiB */
    csrw pmpaddr1, a1
    csrr a0, pmpaddr1
    ASSERT_WARL(a0, 0x12340000)
    li a1, 0x1f | (0x0b << 8)       /* entry 1: TOR, R X (no W) */
    csrw pmpcfg0, a1
    csrr a0, pmpcfg0
    ASSERT_WARL(a0, 0x1f | (0x0b << 8))
    TEST_BEGIN(12)
    csrr a0, pmpcfg2
    csrr a0, pmpaddr15
    ASSERT_EQ(x0, 0)
    TEST_TRAP(13, CAUSE_ILLEGAL, csrr a0, pmpcfg3)

    /* back to the boot configuration */
    li t0, -1
    csrw pmpaddr0, t0
    li t0, 0x1f
    csrw pmpcfg0, t0
    PASS

func:
    li a0, 77
    ret

    .data
    .balign 8
pdata:  .skip 64
